import pytest

from autotune.common.trial import Status, TrialResult, feasible


@pytest.mark.parametrize(
    ("status", "peak_gib", "expected"),
    [
        (Status.OK, 1.0, True),  # at the budget: Optuna's constraint (peak - budget) is 0
        (Status.OK, 1.001, False),  # ok, but past the budget between two watchdog looks
        (Status.OK, None, False),
        (Status.OOM, 0.5, False),
        (Status.SKIPPED, None, False),
    ],
)
def test_a_trial_is_feasible_when_measured_within_the_budget(status, peak_gib, expected):
    assert feasible(status, peak_gib, 1.0) is expected
    result = TrialResult(status=status, peak_memory_gib=peak_gib, samples_per_s=1.0)
    assert result.feasible(1.0) is expected


def test_a_cluster_field_is_stored_only_when_a_cluster_executor_set_it():
    local = TrialResult(status=Status.OK, samples_per_s=10.0)
    stored = local.to_dict()
    assert not {"node", "rerun"} & set(stored)  # as a result was stored before they were
    assert TrialResult.from_dict(stored) == local
    lost = TrialResult(status=Status.CRASHED, node="second", rerun=True)
    assert {"node": "second", "rerun": True}.items() <= lost.to_dict().items()
    assert TrialResult.from_dict(lost.to_dict()) == lost
