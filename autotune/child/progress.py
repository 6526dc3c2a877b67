"""A trial's progress as it trains: a record for the parent (`progress.json`) and a line a
step in its log."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import transformers

from autotune.child import measure
from autotune.common.trial import Progress, Stage, TrialSpec, write_progress

PROGRESS_INTERVAL_S = 0.5
"""Least time between two progress records during training (the records before the first
step and the last step's are always written). A record costs 0.3-0.7 ms on ext4 (1000 atomic
writes without fsync) and falls into the next step's timed interval: written every step it
would add up to ~1% to a 50-100 ms CPU step and ~10% to a 5 ms GPU step; twice a second it is
at most 0.15% of the training time."""


class ProgressReporter(transformers.TrainerCallback):
    """Tells the parent (`progress.json`) and the log (one line a step) how far the trial is.

    It reads no clock of its own: times come from the `StepTimer` placed before it among the
    callbacks, so its work starts after step k's end was read and is charged to step k+1. A
    log line costs ~3 us, so every step gets one; records are spaced by PROGRESS_INTERVAL_S.
    """

    def __init__(
        self,
        path: Path,
        timer: measure.StepTimer,
        *,
        spec: TrialSpec,
        baseline_rss_bytes: int,
        started_s: float,
    ) -> None:
        self.path = path
        self.timer = timer
        self.warmup_steps = spec.warmup_steps
        self.total_steps = spec.warmup_steps + spec.measure_steps
        self.baseline_rss_bytes = baseline_rss_bytes
        self.started_s = started_s
        self.written_s = -math.inf

    def report_building(self) -> None:
        self._report(Stage.BUILDING, 0, time.perf_counter(), write=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.timer.train_begin_s is not None, "the StepTimer must come first"
        self._report(Stage.WARMUP, 0, self.timer.train_begin_s, write=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = len(self.timer.step_end_s)
        now_s = self.timer.step_end_s[-1]
        stage = Stage.WARMUP if step < self.warmup_steps else Stage.MEASURING
        last = step == self.total_steps
        self._report(
            stage, step, now_s, write=last or now_s - self.written_s >= PROGRESS_INTERVAL_S
        )

    def _report(self, stage: Stage, step: int, now_s: float, *, write: bool) -> None:
        progress = Progress(
            baseline_rss_bytes=self.baseline_rss_bytes,
            stage=stage,
            step=step,
            total_steps=self.total_steps,
            elapsed_s=now_s - self.started_s,
            eta_s=measure.eta_s(self.timer.step_end_s, self.total_steps),
        )
        print(progress.summary(), flush=True)
        if write:
            write_progress(self.path, progress)
            self.written_s = now_s
