"""Which stopped trial runs again to its end (`study.second_look.to_look_at`)."""

from autotune.common.trial import Status, TrialResult
from autotune.store.records import TrialRecord
from autotune.study.second_look import to_look_at, why

BUDGET_GIB = 4.0


def record(number, status, speed, *, memory=1.0, batch_size=None):
    result = TrialResult(status=status, samples_per_s=speed, peak_memory_gib=memory)
    params = {"batch_size": batch_size or 8 * (number + 1)}
    return TrialRecord(number=number, params=params, result=result, baseline=number == 0)


BASELINE = record(0, Status.OK, 100.0)


def test_when_every_trial_after_the_baseline_stopped_the_fastest_runs_again():
    records = [BASELINE, record(1, Status.STOPPED, 20.0), record(2, Status.STOPPED, 31.0),
               record(3, Status.OOM, None), record(4, Status.STOPPED, 25.0)]  # fmt: skip
    assert to_look_at(records, BUDGET_GIB).number == 2
    said = why(records[2], BASELINE)
    assert "(trial 2) ran at 0.31 of its pace" in said and "machine may have been busier" in said


def test_no_second_look_where_another_trial_ended_feasible():
    stopped = record(1, Status.STOPPED, 20.0)
    assert to_look_at([BASELINE, stopped, record(2, Status.OK, 60.0)], BUDGET_GIB) is None
    # One that ended ok over the budget is no candidate: the stopped one is looked at.
    over = record(2, Status.OK, 300.0, memory=BUDGET_GIB + 1)
    assert to_look_at([BASELINE, stopped, over], BUDGET_GIB).number == 1


def test_no_second_look_without_a_feasible_baseline_or_a_stopped_trial():
    stopped = record(1, Status.STOPPED, 20.0)
    failed = record(0, Status.CRASHED, None)
    assert to_look_at([failed, stopped], BUDGET_GIB) is None
    assert to_look_at([BASELINE, record(1, Status.OOM, None)], BUDGET_GIB) is None
    # A stopped trial of the baseline's own settings is no other setting to look at, also
    # where it names a knob the baseline leaves out at what training then does.
    same = record(1, Status.STOPPED, 20.0, batch_size=8)
    assert to_look_at([BASELINE, same], BUDGET_GIB) is None
    filled = TrialRecord(
        number=1,
        params={"batch_size": 8, "torch_compile": "off", "optim": "adamw_torch_fused"},
        result=TrialResult(status=Status.STOPPED, samples_per_s=20.0, peak_memory_gib=1.0),
    )
    assert to_look_at([BASELINE, filled], BUDGET_GIB) is None
    other = TrialRecord(
        number=1,
        params={"batch_size": 8, "torch_compile": "inductor"},
        result=filled.result,
    )
    assert to_look_at([BASELINE, other], BUDGET_GIB).number == 1
