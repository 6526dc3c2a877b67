"""The exports launch a trial on the devices it used: a process per device under torchrun, or
through accelerate with a config that starts as many in the trial's precision."""

import pytest
import yaml

from autotune.outputs.launch import accelerate_command, accelerate_config, launch_command
from tests.unit.outputs.report.test_data import INFO
from tests.unit.outputs.test_scaling import TWO_DEVICES


@pytest.mark.parametrize(
    ("strategy", "command"),
    [
        ("ddp", "torchrun --standalone --nproc_per_node=2 recommended.py"),
        ("fsdp", "torchrun --standalone --nproc_per_node=2 recommended.py"),
        ("single", "python recommended.py"),
        ("dp", "CUDA_VISIBLE_DEVICES=0,1 python recommended.py"),  # one process sees both
    ],
)
def test_the_launch_command_starts_one_process_per_device_the_trial_used(strategy, command):
    assert launch_command(TWO_DEVICES, {"strategy": strategy}) == command
    assert launch_command(INFO, {}) == "python recommended.py"


def test_offloading_on_one_gpu_runs_under_the_launcher_deepspeed_needs():
    command = "torchrun --standalone --nproc_per_node=1 recommended.py"
    assert launch_command(INFO, {"strategy": "zero3_offload"}) == command


def test_the_accelerate_config_launches_as_many_processes_in_the_trials_precision():
    config = yaml.safe_load(accelerate_config({"bf16": True, "fp16": False}, 4))
    assert config["num_processes"] == 4 and config["mixed_precision"] == "bf16"
    # accelerate's torchrun launcher, also on CPU (use_cpu would start one process).
    assert config["distributed_type"] == "MULTI_GPU" and config["use_cpu"] is False
    assert yaml.safe_load(accelerate_config({"use_cpu": True}, 2))["mixed_precision"] == "no"
    fp8 = accelerate_config({"bf16": False}, 2, {"ACCELERATE_MIXED_PRECISION": "fp8"})
    assert yaml.safe_load(fp8)["mixed_precision"] == "fp8"
    assert accelerate_config({}, None) is None  # one process: python recommended.py
    command = "accelerate launch --config_file accelerate_config.yaml recommended.py"
    assert accelerate_command(INFO, {"strategy": "fsdp_offload"}) == command
    assert accelerate_command(TWO_DEVICES, {"strategy": "single"}) is None
    assert accelerate_command(TWO_DEVICES, {"strategy": "dp"}) is None
