"""What a trial costs, predicted from the trials that ended: start-up, compile and steps."""

import pytest

from autotune.common.trial import Status, TrialResult
from autotune.store.records import TrialRecord
from autotune.study.cost import COMPILE_OVER_START, TrialCost

EAGER = {"batch_size": 8, "precision": "fp32"}
COMPILED = {"batch_size": 64, "precision": "bf16", "torch_compile": "inductor"}


def ended(number, params, samples_per_s, wall_s, status=Status.OK):
    return TrialRecord(number=number, params=params, result=TrialResult(
        status=status, samples_per_s=samples_per_s, wall_s=wall_s))  # fmt: skip


def test_the_start_up_is_a_trials_wall_time_less_its_steps_at_its_pace():
    # 13 steps of 8 samples at 39.4 samples/s: 2.64 s of steps in 22.0 s.
    cost = TrialCost.fit([ended(0, EAGER, 39.4, 22.0)], steps=13)
    assert cost.start_s == pytest.approx(22.0 - 13 * 8 / 39.4)
    assert cost.compile_s == pytest.approx(COMPILE_OVER_START * cost.start_s)
    # A batch of 128 at 310 samples/s: the start-up and 13 x 128 / 310 s of steps.
    bf16 = {"batch_size": 128, "precision": "bf16"}
    assert cost.predict_s(bf16, 310.0) == pytest.approx(cost.start_s + 13 * 128 / 310)
    assert cost.predict_s(COMPILED, 300.0) == pytest.approx(
        cost.start_s + cost.compile_s + 13 * 64 / 300
    )


def test_a_compiled_trial_measures_the_compile_and_failed_ones_teach_nothing():
    records = [ended(0, EAGER, 39.4, 22.0), ended(1, COMPILED, 235.0, 110.0),
               ended(2, EAGER, None, 600.0, Status.TIMEOUT)]  # fmt: skip
    cost = TrialCost.fit(records, steps=13)
    start = 22.0 - 13 * 8 / 39.4
    assert cost.start_s == pytest.approx(start)
    assert cost.compile_s == pytest.approx(110.0 - 13 * 64 / 235.0 - start)


def test_a_timeout_bounds_the_pace_it_could_have_had():
    cost = TrialCost.fit([ended(0, EAGER, 39.4, 22.0)], steps=13)
    big = {"batch_size": 256, "precision": "fp32"}
    bound = cost.pace_bound(big, 90.0)
    assert cost.predict_s(big, bound) == pytest.approx(90.0)
    assert cost.pace_bound(big, cost.start_s / 2) is None
