import dataclasses

from autotune.common.placement import Placement, _ranges
from autotune.plan.slots import _split, assign
from tests.unit.stand_ins import CPU, GPUS


def test_cores_are_split_into_disjoint_runs_of_nearly_equal_size():
    assert _split([0, 1, 2, 3, 4, 5, 6], 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert _split([4, 5], 2) == [[4], [5]]
    assert _ranges((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_cpu_workers_each_own_a_share_of_this_process_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9})
    slots, problems = assign(2, "auto", "cpu", CPU)
    assert problems == []
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 8, 9)]
    assert [s.describe() for s in slots] == ["cores 0-2", "cores 3,8-9"]
    assert assign("auto", "auto", "cpu", CPU) == ([Placement()], [])  # one worker, every core
    _, problems = assign(7, "0,1", "cpu", CPU)
    assert problems == [
        "devices=0,1: names CUDA devices; this search runs on cpu",
        "workers=7: each worker needs a core of its own, and this process may use 6",
    ]


def test_cuda_workers_own_one_visible_device_each(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots, problems = assign("auto", "auto", "cuda", GPUS)
    assert problems == [] and [s.cuda_devices for s in slots] == [("0",), ("1",), ("2",), ("3",)]
    assert slots[0].describe() == "cuda device 0"
    slots, _ = assign(2, "3,1,2", "cuda", GPUS)  # workers=N: N shares of devices=, in order
    assert [(s.cuda_devices, s.cuda_indices) for s in slots] == [(("3",), (3,)), (("1",), (1,))]
    # Indices are among the visible devices: mapped to what CUDA_VISIBLE_DEVICES names.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc,GPU-dd")
    slots, _ = assign("auto", "1,3", "cuda", GPUS)
    assert [s.cuda_devices for s in slots] == [("GPU-bb",), ("GPU-dd",)]
    assert [
        problems
        for _, problems in (assign(3, "0,1", "cuda", GPUS), assign("auto", "0,4", "cuda", GPUS))
    ] == [
        [
            "workers=3 x devices_per_trial=1: each worker owns one GPU, and devices=0,1 gives 2; "
            "lower one of them"
        ],
        ["devices=0,4: no device 4 here (4 visible: 0-3)"],
    ]
    mixed = dataclasses.replace(GPUS, cuda_device_names=("NVIDIA H100", "Tesla T4"))
    assert assign("auto", "auto", "cuda", mixed)[1] == [
        "devices=auto: the GPUs differ (NVIDIA H100, Tesla T4); one study measures one kind of "
        "GPU: name devices of one kind"
    ]


def test_cuda_workers_own_the_devices_of_their_trials_ranks(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # devices_per_trial=auto: every device of a worker's share; one each with workers=auto.
    slots, problems = assign(2, "auto", "cuda", GPUS, "auto")
    assert problems == [] and [s.cuda_indices for s in slots] == [(0, 1), (2, 3)]
    assert [s.describe() for s in slots] == ["cuda devices 0,1", "cuda devices 2,3"]
    assert [s.cuda_indices for s in assign(1, "auto", "cuda", GPUS, "auto")[0]] == [(0, 1, 2, 3)]
    assert len(assign("auto", "auto", "cuda", GPUS, "auto")[0]) == 4
    # devices_per_trial=N: workers=auto is as many workers as the devices give.
    slots, _ = assign("auto", "3,2,1", "cuda", GPUS, 2)  # the third device is left
    assert [s.cuda_indices for s in slots] == [(3, 2)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc,GPU-dd")
    slots, _ = assign("auto", "auto", "cuda", GPUS, 4)
    assert [s.cuda_devices for s in slots] == [("GPU-aa", "GPU-bb", "GPU-cc", "GPU-dd")]
    # The worker's trials and their ranks see the worker's devices, in order.
    assert slots[0].environment({})["CUDA_VISIBLE_DEVICES"] == "GPU-aa,GPU-bb,GPU-cc,GPU-dd"
    assert [
        problems
        for _, problems in (
            assign(3, "auto", "cuda", GPUS, 2),
            assign("auto", "0,1", "cuda", GPUS, 3),
        )
    ] == [
        [
            "workers=3 x devices_per_trial=2: each worker owns devices_per_trial=2 GPUs, and "
            "devices=auto gives 4; lower one of them"
        ],
        [
            "workers=auto x devices_per_trial=3: each worker owns devices_per_trial=3 GPUs, and "
            "devices=0,1 gives 2; lower one of them"
        ],
    ]
