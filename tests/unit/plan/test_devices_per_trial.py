"""`devices_per_trial=N`: the strategy becomes a searched knob, the baseline is DDP, the
effective batch is split between the ranks, and what cannot run is named before anything is."""

from __future__ import annotations

import os

import pytest

from autotune.common.errors import ConfigError, SpaceError
from autotune.plan.capabilities import fit_to_devices
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.space import SearchSpace, SpaceKnob
from tests.conftest import TINY_MODEL
from tests.unit.stand_ins import GPUS, plan_for


def space_with(*strategies: str) -> SearchSpace:
    knobs = {"batch_size": SpaceKnob(name="batch_size", choices=(8, 16))}
    if strategies:
        knobs["strategy"] = SpaceKnob(name="strategy", choices=strategies)
    return SearchSpace(name="s", description="", device="any", knobs=knobs)


def test_one_device_a_trial_has_no_strategy_to_search():
    space, notes = fit_to_devices(space_with(), 1)
    assert "strategy" not in space.knobs and notes == []
    space, notes = fit_to_devices(space_with("single", "ddp"), 1)
    assert "strategy" not in space.knobs
    assert notes == ["strategy fixed at single: one device per trial"]


def test_several_devices_search_every_multi_device_strategy_unless_the_space_names_some():
    space, notes = fit_to_devices(space_with(), 2)
    every = (
        "ddp",
        "dp",
        "fsdp",
        "fsdp_grad_op",
        "fsdp_offload",
        "zero1",
        "zero2",
        "zero3",
        "zero2_offload",
        "zero3_offload",
        "tp",
    )
    assert space.knobs["strategy"].choices == every
    assert notes == [f"strategy searched among {', '.join(every)}: 2 devices per trial"]
    # Each strategy's own settings with it: DDP's, and DeepSpeed's overlap of communication.
    assert set(space.knobs) >= {
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "fsdp_prefetch",
        "zero_overlap_comm",
    }
    space, notes = fit_to_devices(space_with("single", "fsdp"), 2)
    assert space.knobs["strategy"].choices == ("single", "fsdp")
    assert "ddp_find_unused_parameters" not in space.knobs  # no ddp: they could never act
    assert "zero_overlap_comm" not in space.knobs and "fsdp_prefetch" in space.knobs
    assert notes == [
        "strategy=single trains on one of a trial's 2 devices: the reference of "
        "the others' scaling efficiency"
    ]


def test_a_space_whose_strategies_need_several_devices_is_refused_on_one():
    with pytest.raises(SpaceError, match="need devices_per_trial of 2 or more"):
        fit_to_devices(space_with("ddp", "fsdp"), 1)


def test_the_plan_of_a_two_rank_search(tmp_path):
    plan = plan_for(tmp_path, "devices_per_trial=2", "effective_batch_size=32", "workers=1")
    assert plan.baseline["strategy"] == "ddp"
    assert plan.baseline["batch_size"] * plan.baseline["grad_accum"] == 16  # per rank
    assert plan.rules.effective_batch_size == 16
    assert plan.info.batch_mode == "effective batch 32 (grad_accum derived)"  # every rank's
    assert plan.info.devices_per_trial == 2
    # What cannot run here is gone, named: offload on CPU (the stand-in has DeepSpeed).
    assert set(plan.space.knobs["strategy"].choices) == {
        "ddp",
        "fsdp",
        "fsdp_grad_op",
        "zero1",
        "zero2",
        "zero3",
    }
    assert (
        "removed strategy=zero3_offload: offload moves model states from GPU memory to the "
        "host's: on CPU they are there"
    ) in plan.space.notes


def test_deepspeeds_strategies_leave_where_it_does_not_import(tmp_path):
    missing = "not installed (pip install 'autotune[deepspeed]')"
    plan = plan_for(tmp_path, "devices_per_trial=2", "workers=1", deepspeed_error=missing)
    assert set(plan.space.knobs["strategy"].choices) == {"ddp", "fsdp", "fsdp_grad_op"}
    assert "zero_overlap_comm" not in plan.space.knobs  # DeepSpeed's own setting goes with it
    assert (
        "removed strategy=zero1: DeepSpeed does not import here (not installed (pip install "
        "'autotune[deepspeed]'))"
    ) in plan.space.notes


def test_every_problem_of_devices_per_trial_is_named(tmp_path):
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError) as refused:
        plan_for(tmp_path, f"devices_per_trial={cores + 1}", "effective_batch_size=7")
    message = str(refused.value)
    assert (
        f"effective_batch_size=7 does not split evenly between devices_per_trial={cores + 1}"
        in message
    )
    assert (
        f"devices_per_trial={cores + 1} with workers=auto: a trial has {cores} core(s)" in message
    )


def test_several_gpus_a_trial(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "workers=2"])
    plan = make_plan(config, GPUS)  # devices_per_trial=auto: a worker's share of the 4 GPUs
    assert plan.info.devices_per_trial == plan.devices_per_trial == 2
    assert [s.cuda_indices for s in plan.slots] == [(0, 1), (2, 3)]
    assert plan.baseline["strategy"] == "ddp"
    # Offload stays on GPUs; the least free memory of the devices in use is the budget.
    assert "zero3_offload" in plan.space.knobs["strategy"].choices
    assert plan.info.memory_budget_bytes == 70 * 2**30
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=3"])
    assert [s.cuda_indices for s in make_plan(config, GPUS).slots] == [(0, 1, 2)]
    # The two of docs/devices.md: every GPU a trial, by one worker or by devices_per_trial.
    for setting in ("workers=1", "devices_per_trial=4"):
        config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", setting])
        assert [s.cuda_indices for s in make_plan(config, GPUS).slots] == [(0, 1, 2, 3)]
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}"])
    assert make_plan(config, GPUS).info.devices_per_trial == 1  # workers=auto: one GPU each
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=8"])
    with pytest.raises(ConfigError, match="workers=auto x devices_per_trial=8: each worker"):
        make_plan(config, GPUS)


def test_one_gpu_keeps_the_offload_strategies_a_space_names():
    named = space_with("single", "zero3_offload", "zero2_offload", "fsdp_offload", "ddp")
    space, notes = fit_to_devices(named, 1, "cuda")
    assert space.knobs["strategy"].choices == (
        "single",
        "zero3_offload",
        "zero2_offload",
        "fsdp_offload",
    )
    assert notes == ["removed strategy=ddp: needs devices_per_trial of 2 or more"]
    space, notes = fit_to_devices(named, 1, "cpu")  # on CPU there is no device memory to spare
    assert "strategy" not in space.knobs


def test_the_two_rank_baseline_is_a_point_of_the_space_with_ddps_own_settings_as_it_trains(
    tmp_path,
):
    """The baseline on several devices is DDP and sets none of DDP's own settings, which the
    space searches: it is the point with each at what the Trainer and DDP then do (unused
    parameters looked for unless checkpointing, 25 MiB buckets, no static graph, gradients
    not bucket views). Before, those had no left-out value and the baseline was no point."""
    import numpy as np

    from autotune.common.knobs import value_of
    from autotune.study.sampling.points import Points

    plan = plan_for(tmp_path, "devices_per_trial=2", "workers=1", "space=quick")
    points = Points.of(plan, np.random.default_rng(0))
    found = points.find(plan.baseline)
    assert found is not None
    # Each of the baseline's own settings, where the space searches the knob.
    assert all(points.params[found].get(k, v) == v for k, v in plan.baseline.items())
    assert {k: points.params[found].get(k) for k in ("ddp_find_unused_parameters",
            "ddp_bucket_cap_mb", "ddp_static_graph", "gradient_as_bucket_view")} == {
        "ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 25,
        "ddp_static_graph": False, "gradient_as_bucket_view": False,
    }  # fmt: skip
    checkpointed = {"gradient_checkpointing": True}
    assert value_of(checkpointed, "ddp_find_unused_parameters") is False
