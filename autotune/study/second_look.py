"""A second look: when every trial after the baseline stopped early against it, the fastest of
them runs once more, to its end, before the picks are confirmed.

A trial stops early when its pace is under half the fastest feasible trial's so far
(`launch.stop_threshold`), and the baseline runs first. A machine that grows busier after the
baseline ran (another job, a noisy neighbour) puts every later trial under that line: CI saw
trials at 0.05-0.31 of a quiet baseline. A stopped trial is never recommended, so such a
search ended with the baseline as its only candidate and recommended the defaults at 1.0x,
unconfirmed. The second look is an ordinary trial of the study (queued with its settings,
early stopping off for it), so the front, the picks and the confirmation's rounds see it as
any other. It runs one trial over `n_trials` (it does not count toward it), past the
pre-trial checks (its settings trained), and a study gets one: a resumed search runs one left
queued or cut off (queued again however often it was), and starts none after it ended. A look
another process took (its loop asks for queued trials first) is waited for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.common.knobs import value_of
from autotune.common.trial import Status
from autotune.execute.base import TrialExecutor
from autotune.plan.plan import SearchPlan
from autotune.store.records import (
    RETRY_OF_ATTR,
    SECOND_LOOK_ATTR,
    TrialRecord,
    is_interrupted,
    is_recorded,
    load_records,
    record_of,
)
from autotune.study.loop import run_queued
from autotune.study.observer import SearchObserver


def run(
    plan: SearchPlan,
    study: optuna.Study,
    observer: SearchObserver,
    executor: TrialExecutor | None,
    *,
    may_start: bool,
) -> str | None:
    """After the search's loops ended: the second look, run by this process on the first slot
    (as the confirmation runs), past `timeout=` and one trial over `n_trials`. A new one only
    where one is due (`to_look_at`) and `may_start` (this search ran trials); one an earlier
    search queued or left interrupted runs in any case. What happened, in words for how the
    search ended; None: no second look."""
    trials = study.get_trials(deepcopy=False)
    looks = [t for t in trials if SECOND_LOOK_ATTR in t.user_attrs]
    if any(is_recorded(t) for t in looks):
        return None  # a study gets one
    if not looks:
        records = load_records(study)
        record = to_look_at(records, plan.info.memory_limit_gib) if may_start else None
        if record is None:
            return None
        baseline = next(r for r in records if r.baseline)
        observer.looking_again(why(record, baseline))
        enqueue(study, trials, record)
    elif not any(_pending(t, trials) for t in looks):
        # Cut off twice (it runs past timeout=, and a scheduler's time limit may end it too),
        # or refused: queued again, as a retry of the last copy.
        last = looks[-1]
        of = last.user_attrs[SECOND_LOOK_ATTR]
        attrs = {SECOND_LOOK_ATTR: of, RETRY_OF_ATTR: last.number}
        study.enqueue_trial(trials[of].params, user_attrs=attrs)
        observer.looking_again(
            f"the second look at trial {of}'s settings was cut off (trial {last.number}): "
            "it runs again, one trial over n_trials"
        )
    else:  # an earlier search queued it, or left it to be queued again: one trial more
        of = looks[-1].user_attrs[SECOND_LOOK_ATTR]
        observer.looking_again(
            f"the second look at trial {of}'s settings an earlier search began runs now, one "
            "trial over n_trials"
        )
    room = plan.config.model_copy(update={"n_trials": len(study.get_trials()) + 1})
    with observer.watching():
        run_queued(
            dataclasses.replace(plan, config=room),
            study,
            lambda t: SECOND_LOOK_ATTR in t.user_attrs,
            observer=observer,
            executor=executor,
        )
    return outcome(study.get_trials(deepcopy=False))


def _pending(look: FrozenTrial, trials: list[FrozenTrial]) -> bool:
    """Waiting, running, or cut off and to be queued again by the next look at the study
    (`recovery.recover`: an interrupted trial once, not a retry of one)."""
    if look.state in (TrialState.WAITING, TrialState.RUNNING):
        return True
    retried = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
    return (
        is_interrupted(look) and look.number not in retried and RETRY_OF_ATTR not in look.user_attrs
    )


def outcome(trials: list[FrozenTrial]) -> str:
    """How the second look ended, in words."""
    looks = [t for t in trials if SECOND_LOOK_ATTR in t.user_attrs]
    of = looks[0].user_attrs[SECOND_LOOK_ATTR]
    done = next((t for t in looks if is_recorded(t)), None)
    if done is None:
        return (
            f"a second look at trial {of}'s settings did not end; it runs when the search is "
            "resumed"
        )
    record = record_of(done)
    if record.status is Status.OK:
        figure = f"{record.result.samples_per_s:.2f} samples/s"
        return (
            f"trial {of}'s settings ran again to the end as trial {done.number}, at {figure} "
            "(no other trial after the baseline had ended ok under the memory limit)"
        )
    # Its reason (a traceback's tail, perhaps) is in trials.csv: these words are one line.
    return f"trial {of}'s settings ran again as trial {done.number}: {record.status.value}"


def to_look_at(records: list[TrialRecord], limit_gib: float) -> TrialRecord | None:
    """The stopped trial to run again: the fastest by what it measured, when the baseline
    ended feasible and no other trial did (out of memory, crashed or stopped; at least one
    stopped), leaving out one that trained the baseline's own settings. Feasible, and the
    stopped trial's peak so far, are under the memory limit a pick keeps to (the budget less
    its headroom): a trial past it would run again to the end and never be recommended."""
    baseline = next((r for r in records if r.baseline), None)
    if baseline is None or not baseline.result.feasible(limit_gib):
        return None
    if any(r.result.feasible(limit_gib) for r in records if not r.baseline):
        return None
    stopped = [
        r
        for r in records
        if r.status is Status.STOPPED
        and not same_training_settings(r.params, baseline.params)
        and r.result.samples_per_s is not None
        and (r.result.peak_memory_gib or 0.0) <= limit_gib
    ]
    return max(stopped, key=lambda r: r.result.samples_per_s, default=None)


def same_training_settings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal once each knob either leaves out counts at what training then does."""
    return all(value_of(a, k) == value_of(b, k) for k in a.keys() | b.keys())


def why(record: TrialRecord, baseline: TrialRecord) -> str:
    """What the user hears before the second look runs."""
    share = record.result.samples_per_s / baseline.result.samples_per_s
    return (
        "no trial after the baseline ended ok under the memory limit, and the fastest that "
        "stopped early against it "
        f"(trial {record.number}) ran at {share:.2f} of its pace: the machine may have been "
        f"busier than when the baseline ran. Trial {record.number}'s settings run once more, "
        "to the end, before the picks are confirmed"
    )


def enqueue(study: optuna.Study, trials: list[FrozenTrial], record: TrialRecord) -> None:
    """Queue the second look: the stopped trial's own Optuna parameters, marked with its
    number (`SECOND_LOOK_ATTR`)."""
    study.enqueue_trial(trials[record.number].params, user_attrs={SECOND_LOOK_ATTR: record.number})
