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
import math
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.common.layout import VERIFY
from autotune.common.trial import Status, TrialResult
from autotune.plan.plan import SearchPlan
from autotune.store.records import VERIFICATION_PREFIX, TrialRecord
from autotune.study import runner
from autotune.study.loop import launch
from autotune.study.observer import SearchObserver


@dataclass(frozen=True, kw_only=True, slots=True)
class Verification:
    trial: int
    steps: int
    """Optimizer steps trained, warm-up included."""
    status: str
    reason: str
    samples_per_s: float | None
    peak_memory_gib: float | None
    peak_allocated_gib: float | None
    """CUDA: the allocator's peak of live tensors (the peak reserved is `peak_memory_gib`)."""
    step_time_cv: float | None
    searched_samples_per_s: float
    searched_peak_memory_gib: float

    @property
    def samples_per_s_ratio(self) -> float | None:
        """The long run's samples/s over the trial's: 1.0 when the short trial told the truth."""
        return _ratio(self.samples_per_s, self.searched_samples_per_s)

    @property
    def peak_memory_ratio(self) -> float | None:
        return _ratio(self.peak_memory_gib, self.searched_peak_memory_gib)

    @property
    def fragmentation(self) -> float | None:
        """CUDA: peak reserved over peak allocated over the whole run (1.0: no cache beyond
        the live tensors); None on CPU."""
        return _ratio(self.peak_memory_gib, self.peak_allocated_gib)

    def describe(self) -> str:
        if self.status != Status.OK.value:
            return f"trial {self.trial} over {self.steps} steps: {self.status} ({self.reason})"
        text = (
            f"trial {self.trial} over {self.steps} steps: {self.samples_per_s:.1f} samples/s "
            f"({self.samples_per_s_ratio:.2f}x the trial's {self.searched_samples_per_s:.1f}), "
            f"peak {self.peak_memory_gib:.2f} GiB ({self.peak_memory_ratio:.2f}x the trial's "
            f"{self.searched_peak_memory_gib:.2f})"
        )
        if self.fragmentation is not None:
            text += f", reserved/allocated {self.fragmentation:.2f} over the run"
        return text

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "samples_per_s_ratio": self.samples_per_s_ratio,
            "peak_memory_ratio": self.peak_memory_ratio,
            "fragmentation": self.fragmentation,
        }

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> Verification:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in stored.items() if k in names})


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference or not math.isfinite(value):
        return None
    return value / reference


def verify(
    plan: SearchPlan,
    study: optuna.Study,
    record: TrialRecord,
    steps: int,
    *,
    observer: SearchObserver | None = None,
    launcher: runner.Launcher | None = None,
) -> Verification:
    """Train `record`'s settings for `steps` optimizer steps (the study's warm-up, then the
    rest timed), store the comparison with the study and return it."""
    observer = observer or SearchObserver()
    launcher = launcher or runner.ForkserverLauncher(cuda=plan.device_info.cuda_available)
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
                    launcher, on_progress, folder=folder)  # fmt: skip
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


def read_verifications(study: optuna.Study) -> dict[int, Verification]:
    """Every trial's verification stored with the study, by trial number."""
    return {
        int(key.removeprefix(VERIFICATION_PREFIX)): Verification.from_json(value)
        for key, value in study.user_attrs.items()
        if key.startswith(VERIFICATION_PREFIX)
    }
