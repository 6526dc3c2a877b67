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
from autotune.execute.local import LocalExecutor
from autotune.plan.plan import SearchPlan
from autotune.store.records import VERIFICATION_PREFIX, TrialRecord, Verification
from autotune.study.launch import launch
from autotune.study.observer import SearchObserver


def verify(
    plan: SearchPlan,
    study: optuna.Study,
    record: TrialRecord,
    steps: int,
    *,
    observer: SearchObserver | None = None,
    executor: TrialExecutor | None = None,
) -> Verification:
    """Train `record`'s settings for `steps` optimizer steps (the study's warm-up, then the
    rest timed), store the comparison with the study and return it."""
    observer = observer or SearchObserver()
    executor = executor or LocalExecutor()
    config = plan.config
    warmup = min(config.warmup_steps, steps - 1)
    measure = steps - warmup
    # The trial's time allowance grows with its steps.
    scale = steps / (config.warmup_steps + config.measure_steps)
    long_run = config.model_copy(update={
        "warmup_steps": warmup, "measure_steps": measure,
        "trial_timeout": config.trial_timeout * max(1.0, scale),
    })  # fmt: skip
    folder = plan.study_dir / VERIFY / f"t{record.number:04d}"
    on_progress = functools.partial(observer.progress, record.number)
    result = launch(dataclasses.replace(plan, config=long_run), record.number, record.params,
                    executor, on_progress, folder=folder)  # fmt: skip
    verification = of(record, result, steps)
    study.set_user_attr(f"{VERIFICATION_PREFIX}{record.number}", verification.to_json())
    return verification


def of(record: TrialRecord, result: TrialResult, steps: int) -> Verification:
    ok = result.status is Status.OK
    return Verification(
        trial=record.number,
        steps=steps,
        status=result.status.value,
        reason=result.reason,
        samples_per_s=result.samples_per_s if ok else None,
        peak_memory_gib=result.peak_memory_gib if ok else None,
        peak_allocated_gib=result.peak_allocated_gib if ok else None,
        step_time_cv=result.step_time_cv if ok else None,
        searched_samples_per_s=record.result.samples_per_s,
        searched_peak_memory_gib=record.result.peak_memory_gib,
    )
