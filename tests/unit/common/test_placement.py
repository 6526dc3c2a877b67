"""Where a trial runs: the environment its process gets, never this process's."""

import os

from autotune.common.placement import Placement


def test_a_placement_names_its_devices_and_thread_count_in_the_environment_it_gives():
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "OMP_NUM_THREADS": "8"}
    gpus = Placement(cuda_devices=("2", "3"), cuda_indices=(2, 3))
    assert gpus.environment(base) == base | {"CUDA_VISIBLE_DEVICES": "2,3"}
    cores = Placement(cpus=(4, 5, 6))
    assert cores.environment(base) == base | {"OMP_NUM_THREADS": "3"}
    assert Placement().environment(base) == base  # every core, the devices as they are
    assert base["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the given one is left as it is
    assert [p.describe() for p in (gpus, cores, Placement())] == [
        "cuda devices 2,3",
        "cores 4-6",
        "every core",
    ]


def test_the_environment_is_a_copy_of_this_processs_by_default():
    placed = Placement(cuda_devices=("GPU-aa",)).environment()
    assert placed["CUDA_VISIBLE_DEVICES"] == "GPU-aa"
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "GPU-aa"
    assert placed["PATH"] == os.environ["PATH"]
