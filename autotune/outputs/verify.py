"""Verification: a trial's settings trained for many steps, against what its short trial
measured (`autotune verify`).

A trial times a few steps; a real run takes thousands. The recommended (or a given) trial's
settings train again in a fresh trial process, as a search trial does (the same plain
Trainer, data or factory, warm-up and memory accounting), for `steps` optimizer steps; its
samples/s and peak over the trial's are the fidelity ratios, and on CUDA the peak reserved
over the peak allocated says how much the allocator's cache grew over the run
(fragmentation). Stored with the study, one attr per trial, so `autotune report`,
recommended.json and the report show it.
"""

from __future__ import annotations

import dataclasses
import functools

import optuna

from autotune.common.layout import VERIFY
from autotune.common.trial import Status, TrialResult
from autotune.execute.base import TrialExecutor
from autotune.outputs.pareto import Confirmed
from autotune.outputs.snapshot import read_snapshot
from autotune.plan.plan import SearchPlan
from autotune.store.outcomes import VERIFICATION_PREFIX, Verification, read_verifications
from autotune.store.records import TrialRecord
from autotune.study.launch import launch
from autotune.study.observer import SearchObserver


def verify(
    plan: SearchPlan,
    study: optuna.Study,
    record: TrialRecord,
    steps: int,
    *,
    executor: TrialExecutor,
    observer: SearchObserver | None = None,
) -> Verification:
    """Train `record`'s settings for `steps` optimizer steps (the study's warm-up, then the
    rest timed), store the comparison with the study and return it."""
    observer = observer or SearchObserver()
    assert plan.info.warmup_steps is not None
    warmup = min(plan.info.warmup_steps, steps - 1)
    # The trial's time allowance grows with its steps.
    scale = steps / plan.trial_steps
    long_run = dataclasses.replace(
        plan,
        info=dataclasses.replace(plan.info, warmup_steps=warmup, measure_steps=steps - warmup),
        config=plan.config.model_copy(
            update={"trial_timeout": plan.config.trial_timeout * max(1.0, scale)}
        ),
    )
    folder = plan.study_dir / VERIFY / f"t{record.number:04d}"
    on_progress = functools.partial(observer.progress, record.number)
    observer.trial_started(record.number, record.params)
    with observer.watching():  # its steps and ETA shown, as a search's trials
        result = launch(
            long_run,
            record.number,
            record.params,
            executor,
            on_progress,
            folder=folder,
        )
    confirmed = read_snapshot(study).picks.confirmed
    verification = of(record, result, steps, confirmed)
    key = f"{VERIFICATION_PREFIX}{record.number}"
    earlier = read_verifications(study).get(record.number)
    if result.status is Status.OK or earlier is None or earlier.status != Status.OK.value:
        study.set_user_attr(key, verification.to_json())  # a failed run never replaces an ok one
    return verification


def of(
    record: TrialRecord, result: TrialResult, steps: int, confirmed: Confirmed | None = None
) -> Verification:
    """The comparison: with the trial's confirmed median where it was confirmed (its own
    measurement may be a lucky or disturbed one), else with its measurement."""
    ok = result.status is Status.OK
    median = confirmed.median(record.number) if confirmed is not None else None
    return Verification(
        trial=record.number,
        steps=steps,
        status=result.status.value,
        reason=result.reason,
        samples_per_s=result.samples_per_s if ok else None,
        peak_memory_gib=result.peak_memory_gib if ok else None,
        peak_allocated_gib=result.peak_allocated_gib if ok else None,
        step_time_cv=result.step_time_cv if ok else None,
        searched_samples_per_s=median or record.result.samples_per_s,
        searched_rounds=confirmed.rounds if median else 0,
        searched_interval=confirmed.interval(record.number) if median else None,
        searched_peak_memory_gib=record.result.peak_memory_gib,
    )
