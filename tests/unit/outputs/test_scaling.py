"""On several devices a trial, a trial's scaling efficiency is measured against the study's best
one-device (`single`) trial, and its exports launch it on the devices it used."""

import dataclasses

import optuna
import pytest
import yaml

from autotune.common.trial import Status, TrialResult
from autotune.outputs.export import accelerate_command, accelerate_config, launch_command
from autotune.outputs.snapshot import read_snapshot
from autotune.store.records import BASELINE_ATTR, PARAMS_ATTR, store_run_info, tell_result
from tests.unit.outputs.report.test_data import INFO

TWO_DEVICES = dataclasses.replace(INFO, devices_per_trial=2)


def study_of(*trials: tuple[str, float]):
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (strategy, samples_per_s) in enumerate(trials):
        trial = study.ask()
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8, "strategy": strategy})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        result = TrialResult(
            status=Status.OK, samples_per_s=samples_per_s, peak_memory_gib=1.0, step_time_cv=0.01
        )
        tell_result(study, trial, result, budget_gib=INFO.memory_budget_gib, noise_cv=0.1)
    store_run_info(study, TWO_DEVICES)
    return read_snapshot(study)


def test_efficiency_is_samples_per_s_over_n_times_the_best_single_device_trials():
    snapshot = study_of(("ddp", 150.0), ("single", 90.0), ("single", 100.0), ("fsdp", 120.0))
    ddp, single, _, fsdp = snapshot.records
    assert snapshot.scaling_efficiency(ddp) == pytest.approx(150 / 200)
    assert snapshot.scaling_efficiency(fsdp) == pytest.approx(120 / 200)
    assert snapshot.scaling_efficiency(single) is None


def test_without_a_single_device_trial_there_is_no_efficiency():
    snapshot = study_of(("ddp", 150.0), ("fsdp", 120.0))
    assert snapshot.scaling_efficiency(snapshot.records[0]) is None


@pytest.mark.parametrize(
    ("strategy", "command"),
    [
        ("ddp", "torchrun --standalone --nproc_per_node=2 recommended.py"),
        ("fsdp", "torchrun --standalone --nproc_per_node=2 recommended.py"),
        ("single", "python recommended.py"),
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
