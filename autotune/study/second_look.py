"""A second look: when every trial after the baseline stopped early against it, the fastest of
them runs once more, to its end, before the picks are confirmed.

A trial stops early when its pace is under half the fastest feasible trial's so far
(`launch.stop_threshold`), and the baseline runs first. A machine that grows busier after the
baseline ran (another job, a noisy neighbour) puts every later trial under that line: CI saw
trials at 0.05-0.31 of a quiet baseline. A stopped trial is never recommended, so such a
search ended with the baseline as its only candidate and recommended the defaults at 1.0x,
unconfirmed. The second look is an ordinary trial of the study (queued with its settings,
early stopping off for it), so the front, the picks and the confirmation's rounds see it as
any other; it counts toward `n_trials`, and a resumed search looks once only.
"""

from __future__ import annotations

import dataclasses

import optuna
from optuna.trial import FrozenTrial

from autotune.common.trial import Status
from autotune.execute.base import TrialExecutor
from autotune.plan.plan import SearchPlan
from autotune.store.records import SECOND_LOOK_ATTR, TrialRecord, load_records, trials_run
from autotune.study.loop import run_search
from autotune.study.observer import SearchObserver


def run(
    plan: SearchPlan,
    study: optuna.Study,
    observer: SearchObserver,
    executor: TrialExecutor | None,
) -> str | None:
    """After the search's loops ended: the second look, where one is due (`to_look_at`), run
    by this process's loop on the first slot (as the confirmation runs), past `timeout=` and
    one over `n_trials`. What it did, in words for how the search ended; None: not due."""
    trials = study.get_trials(deepcopy=False)
    records = load_records(study)
    record = to_look_at(records, plan.info.memory_budget_gib, trials)
    if record is None:
        return None
    baseline = next(r for r in records if r.baseline)
    observer.looking_again(why(record, baseline))
    enqueue(study, trials, record)
    once = plan.config.model_copy(update={"n_trials": trials_run(study) + 1, "timeout": None})
    with observer.watching(), plan.slots[0].applied():
        run_search(
            dataclasses.replace(plan, config=once), study, observer=observer, executor=executor
        )
    return (
        f"trial {record.number}'s settings ran again to the end (every trial after the "
        "baseline had stopped early)"
    )


def to_look_at(
    records: list[TrialRecord], budget_gib: float, trials: list[FrozenTrial]
) -> TrialRecord | None:
    """The stopped trial to run again: the fastest by what it measured, when the baseline
    ended feasible, no other trial did, and the study (`trials`) has no second look yet."""
    if any(SECOND_LOOK_ATTR in t.user_attrs for t in trials):
        return None
    baseline = next((r for r in records if r.baseline), None)
    if baseline is None or not baseline.result.feasible(budget_gib):
        return None
    if any(r.result.feasible(budget_gib) for r in records if not r.baseline):
        return None
    stopped = [
        r
        for r in records
        if r.status is Status.STOPPED
        and r.params != baseline.params
        and r.result.samples_per_s is not None
    ]
    return max(stopped, key=lambda r: r.result.samples_per_s, default=None)


def why(record: TrialRecord, baseline: TrialRecord) -> str:
    """What the user hears before the second look runs."""
    share = record.result.samples_per_s / baseline.result.samples_per_s
    return (
        f"every trial after the baseline stopped early against it, the fastest (trial "
        f"{record.number}) at {share:.2f} of its pace: the machine may have been busier than "
        f"when the baseline ran. Trial {record.number}'s settings run once more, to the end, "
        "before the picks are confirmed"
    )


def enqueue(study: optuna.Study, trials: list[FrozenTrial], record: TrialRecord) -> None:
    """Queue the second look: the stopped trial's own Optuna parameters, marked with its
    number (`SECOND_LOOK_ATTR`)."""
    study.enqueue_trial(trials[record.number].params, user_attrs={SECOND_LOOK_ATTR: record.number})
