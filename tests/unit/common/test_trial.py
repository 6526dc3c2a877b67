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
