"""What a trial costs, predicted from the trials that ended: start-up, compile and steps."""

import pytest

from autotune.common.trial import Status, TrialResult
from autotune.store.records import TrialRecord
from autotune.study.cost import COMPILE_OVER_START, TrialCost, remaining_s

EAGER = {"batch_size": 8, "precision": "fp32"}
COMPILED = {"batch_size": 64, "precision": "bf16", "torch_compile": "inductor"}


def ended(number, params, samples_per_s, wall_s, status=Status.OK):
    return TrialRecord(
        number=number,
        params=params,
        result=TrialResult(status=status, samples_per_s=samples_per_s, wall_s=wall_s),
    )


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
    records = [
        ended(0, EAGER, 39.4, 22.0),
        ended(1, COMPILED, 235.0, 110.0),
        ended(2, EAGER, None, 600.0, Status.TIMEOUT),
    ]
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


def test_the_trials_left_are_counted_at_the_work_they_do_a_step():
    """The quick start's 5x low ETA: the baseline's batch 8 at its pace, while proposals
    trained 32-64 samples a step. Before a proposal ended, the space's median batch; then
    the proposals' own, at the median per-sample pace measured."""
    result = TrialResult(status=Status.OK, samples_per_s=8.0, wall_s=14.0)
    baseline = TrialRecord(number=0, params=EAGER, baseline=True, result=result)
    assert remaining_s([], steps=13, space_batch=32, trials=5) is None
    start = 14.0 - 13 * 8 / 8.0
    assert remaining_s([baseline], steps=13, space_batch=32, trials=5) == pytest.approx(
        (5 * (start + 13 * 32 / 8.0),) * 3  # one pace measured: no range yet
    )
    big = {"batch_size": 64, "grad_accum": 2, "precision": "bf16"}
    records = [baseline, ended(1, big, 32.0, start + 13 * 128 / 32.0)]
    per_sample = (1 / 8.0 + 1 / 32.0) / 2
    assert remaining_s(records, steps=13, space_batch=32, trials=4) == pytest.approx(
        tuple(4 * (start + 13 * 128 * pace) for pace in (per_sample, 1 / 32.0, 1 / 8.0))
    )
