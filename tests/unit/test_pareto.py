import optuna
import pytest

from autotune.common.trial import Status, TrialResult
from autotune.common.units import GIB
from autotune.outputs.pareto import pick
from autotune.outputs.snapshot import read_snapshot
from autotune.plan.run_info import RunInfo
from autotune.store.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    RESULT_ATTR,
    record_of,
    store_run_info,
    tell_result,
)

BUDGET_GIB = 10.0


def SAME(record):
    return False


def study_with(outcomes):
    """outcomes: (samples_per_s, peak_gib) for ok trials, or a Status for the others.
    The first trial is the baseline."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, outcome in enumerate(outcomes):
        trial = study.ask()
        if isinstance(outcome, Status):
            result = TrialResult(status=outcome, reason="x")
        else:
            result = TrialResult(
                status=Status.OK, samples_per_s=outcome[0], peak_memory_gib=outcome[1]
            )
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, BUDGET_GIB, noise_cv=0.1)
    store_run_info(study, info(headroom=0.1))
    return study


def info(headroom):
    return RunInfo(
        study="s", model="m", model_config={}, task="t", seq_len=8, device="cpu",
        device_name="cpu", space="cpu", space_notes=[], effective_batch_size=None,
        memory_budget_bytes=int(BUDGET_GIB * GIB), headroom=headroom, noise_cv=0.1,
    )  # fmt: skip


def pareto_front(study):
    return read_snapshot(study).front


def test_front_holds_only_non_dominated_feasible_trials_fastest_first():
    study = study_with([(100, 4.0), (80, 2.0), (90, 5.0), Status.CRASHED, (120, 8.0), (500, 12.0)])
    front = pareto_front(study)
    # trial 2 is slower and bigger than trial 0; trial 5 is over the 10 GiB budget.
    assert [r.number for r in front] == [4, 0, 1]


def test_oom_and_skipped_trials_are_complete_but_infeasible():
    study = study_with([(100, 4.0), Status.OOM, Status.SKIPPED, Status.ERROR])
    states = [t.state for t in study.trials]
    C, F = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL
    assert states == [C, C, C, F]
    assert study.trials[0].constraints["peak_over_budget_gib"] == pytest.approx(-6.0)
    assert study.trials[1].constraints["peak_over_budget_gib"] > 0
    assert study.trials[2].constraints["peak_over_budget_gib"] > 0
    assert [r.number for r in pareto_front(study)] == [0]


def test_picks_fastest_under_the_limit_and_a_memory_saver_within_ten_percent():
    study = study_with([(50, 1.0), (100, 6.0), (95, 3.0), (80, 2.0), (120, 9.5)])
    front = pareto_front(study)
    baseline = record_of(study.trials[0])
    picks = pick(front, limit_gib=9.0, baseline=baseline, noise_cv=0.1, changes_training=SAME)
    assert picks.fastest.number == picks.recommended.number == 1  # 120/s needs 9.5 GiB: over
    assert picks.saver.number == 2  # 95 >= 0.9 x 100, and 3 GiB instead of 6
    assert picks.speedup(picks.fastest) == pytest.approx(2.0)
    nothing = pick(front, limit_gib=0.5, baseline=baseline, noise_cv=0.1, changes_training=SAME)
    assert nothing.fastest is nothing.recommended is None


def test_no_speedup_when_the_baseline_ran_out_of_memory():
    study = study_with([Status.OOM, (100, 2.0)])
    baseline = record_of(study.trials[0])
    picks = pick(pareto_front(study), limit_gib=9.0, baseline=baseline, noise_cv=0.1,
                 changes_training=SAME)  # fmt: skip
    assert picks.fastest.number == 1
    assert picks.speedup(picks.fastest) is None


def test_memory_limit_leaves_the_headroom():
    assert info(headroom=0.1).memory_limit_gib == pytest.approx(9.0)
    assert RESULT_ATTR in study_with([(1, 1)]).trials[0].user_attrs


def test_the_snapshot_front_is_optunas_best_trials():
    study = study_with([(100, 4.0), (80, 2.0), (90, 5.0), Status.OOM, (120, 8.0), (80, 2.0)])
    optuna_front = {t.number for t in study.best_trials}
    assert {r.number for r in pareto_front(study)} == optuna_front == {0, 1, 4, 5}


def noisy_study(baseline_cv, fastest_cv):
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (speed, cv) in enumerate(((100, baseline_cv), (150, fastest_cv))):
        trial = study.ask()
        result = TrialResult(
            status=Status.OK, samples_per_s=speed, peak_memory_gib=1.0, step_time_cv=cv
        )
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, BUDGET_GIB, noise_cv=0.1)
    store_run_info(study, info(headroom=0.1))
    return read_snapshot(study)


@pytest.mark.parametrize(
    ("baseline_cv", "fastest_cv", "said"),
    [
        (0.02, 0.03, None),
        (0.02, 0.35, "step CV 35% on it (above"),
        (0.22, 0.03, "step CV 22% on the baseline (above"),
        (0.22, 0.35, "step CV 35% on it and 22% on the baseline"),
    ],
)
def test_a_speedup_resting_on_a_noisy_figure_says_so(baseline_cv, fastest_cv, said):
    snapshot = noisy_study(baseline_cv, fastest_cv)
    line = snapshot.picks.describe(snapshot.picks.fastest)
    assert "1.50x the baseline" in line
    if said is None:
        assert "noisy" not in line
    else:
        assert said in line and "measure_steps" in line
    assert snapshot.is_noisy(snapshot.picks.fastest) == (fastest_cv > 0.1)
