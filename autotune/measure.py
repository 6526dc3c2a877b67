"""The timing window and memory peaks of one trial (worker side).

Shape of the measurement, as in nanoGPT's bench.py: untimed warm-up steps first, the device
synchronised before each clock read, and only whole optimizer steps inside the timed window.
The Trainer's own `train_samples_per_second` includes warm-up and start-up, so it is not used.
"""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Records the clock at the end of every optimizer step.

    Batches are fetched before `on_step_begin`, so step boundaries are taken end to end: the
    interval from the end of step k to the end of step k+1 holds everything step k+1 costs,
    data loading included. Warm-up step w's end opens the timed window.
    """

    def __init__(self, warmup_steps: int, synchronize: Callable[[], None] = lambda: None):
        if warmup_steps < 1:
            raise ValueError("warmup_steps must be >= 1: the first step's end opens the window")
        self.warmup_steps = warmup_steps
        self.synchronize = synchronize
        self.step_end_s: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.synchronize()
        self.step_end_s.append(time.perf_counter())

    def measured_step_times_s(self) -> list[float]:
        ends = self.step_end_s[self.warmup_steps - 1 :]
        return [later - earlier for earlier, later in itertools.pairwise(ends)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float
    step_time_median_ms: float
    step_time_cv: float
    measured_steps: int


def throughput(step_times_s: list[float], *, samples_per_step: int, seq_len: int) -> Throughput:
    """Throughput over the timed steps; `samples_per_step` is micro batch x grad accumulation."""
    if len(step_times_s) < 2:
        raise ValueError(f"need at least 2 timed steps, got {len(step_times_s)}")
    total_s = sum(step_times_s)
    samples_per_s = samples_per_step * len(step_times_s) / total_s
    return Throughput(
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * seq_len,
        step_time_median_ms=statistics.median(step_times_s) * 1e3,
        step_time_cv=statistics.stdev(step_times_s) / statistics.fmean(step_times_s),
        measured_steps=len(step_times_s),
    )


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
