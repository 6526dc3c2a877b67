import optuna
import pytest

from autotune.pareto import GIB, memory_limit_gib, pareto_front, recommend
from autotune.records import PARAMS_ATTR, RESULT_ATTR
from autotune.trial import Status, TrialResult


def study_with(trials):
    """trials: (samples_per_s, peak_gib) for ok trials, or a Status for failed ones."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, outcome in enumerate(trials):
        trial = study.ask()
        if isinstance(outcome, Status):
            result = TrialResult(status=outcome, reason="x")
        else:
            result = TrialResult(
                status=Status.OK, samples_per_s=outcome[0], peak_memory_gib=outcome[1]
            )
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(RESULT_ATTR, result.to_dict())
        if result.status is Status.OK:
            study.tell(trial, list(outcome))
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return study


def test_front_holds_only_non_dominated_successful_trials_fastest_first():
    study = study_with([(100, 4.0), (80, 2.0), (90, 5.0), Status.CRASHED, (120, 8.0)])
    front = pareto_front(study)
    assert [r.number for r in front] == [4, 0, 1]  # trial 2 is slower and bigger than trial 0


def test_recommendation_is_the_fastest_front_trial_under_the_limit():
    front = pareto_front(study_with([(100, 4.0), (80, 2.0), (120, 8.0)]))
    assert recommend(front, limit_gib=10).number == 2
    assert recommend(front, limit_gib=5).number == 0
    assert recommend(front, limit_gib=1) is None


def test_memory_limit_leaves_the_headroom():
    assert memory_limit_gib(10 * GIB, 0.1) == pytest.approx(9.0)
