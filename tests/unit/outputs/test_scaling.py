"""On several devices a trial, a trial's scaling efficiency is measured against the study's best
one-device (`single`) trial."""

import dataclasses

import optuna
import pytest

from autotune.common.trial import Status, TrialResult
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
