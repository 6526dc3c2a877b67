"""What a trial costs: its wall time, predicted before it runs, for the search's choices.

A trial's wall time is a start-up (the process, the model's build, the data: the same for
every setting of a study, measured on each finished trial as its wall time less its steps),
a compile where it compiles, and its warm-up and timed steps at its pace. The pace is the
effects model's samples/s for the setting (seeded by the baseline's measured pace), so a
proposal that trains 32 times the baseline's samples a step at a tenth of its speed is
predicted at what it will cost. Refitted on every finished trial; a timeout says its trial
took at least its limit.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.common.knobs import is_compiled, value_of
from autotune.common.trial import Status
from autotune.common.trial_settings import effective_batch
from autotune.store.records import TrialRecord

COMPILE_OVER_START = 6.0
"""Before any compiled trial ended, a compile is taken to cost this many start-ups: bert-large's
default-mode compile on the H100, as the GPU twin fits it (24 layers x 3.2 s = 77 s,
`autotune/twin/constants.json`), is 6x the eager trial's 12.6 s start-up there."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialCost:
    steps: int
    """Warm-up and timed steps of every trial."""
    start_s: float
    """A trial's wall time besides its steps (median of the finished eager trials)."""
    compile_s: float
    """What compiling adds (median over the compiled trials, or `COMPILE_OVER_START` x
    `start_s` before one ended)."""

    @classmethod
    def fit(cls, records: list[TrialRecord], steps: int) -> TrialCost:
        eager, compiled = [], []
        for record in records:
            result = record.result
            if record.status is not Status.OK or not result.wall_s or not result.samples_per_s:
                continue
            start = result.wall_s - steps * effective_batch(record.params) / result.samples_per_s
            (compiled if is_compiled(record.params) else eager).append(max(start, 0.0))
        start_s = statistics.median(eager) if eager else 0.0
        compile_s = (
            max(statistics.median(compiled) - start_s, 0.0)
            if compiled
            else COMPILE_OVER_START * start_s
        )
        return cls(steps=steps, start_s=start_s, compile_s=compile_s)

    def predict_s(self, params: dict[str, Any], samples_per_s: float) -> float:
        """The wall time of a trial of these settings at this pace."""
        steps_s = self.steps * effective_batch(params) / samples_per_s
        return self.start_s + (self.compile_s if is_compiled(params) else 0.0) + steps_s

    def pace_bound(self, params: dict[str, Any], limit_s: float) -> float | None:
        """The fastest a trial that took at least `limit_s` (a timeout) can have trained, in
        samples/s; None where its start-up alone could take that long."""
        left = limit_s - self.start_s - (self.compile_s if is_compiled(params) else 0.0)
        return self.steps * effective_batch(params) / left if left > 0 else None


Rate = Callable[[str], float | None]
"""Precision -> the fastest a step of it computes on the device (TFLOP/s); None: unknown."""


def pace_at(params: dict[str, Any], record: TrialRecord, rate: Rate) -> float:
    """The fastest pace (samples/s) a trial of `params` can be counted on for, from a measured
    trial: the trial's samples/s, scaled up by its precision's peak rate over the measured
    one's where that is higher (bf16 on a GPU whose fp32 trial was measured), 1:1 where either
    rate is unknown (a CPU computes at one rate whatever the precision)."""
    mine = rate(str(value_of(params, "precision")))
    theirs = rate(str(value_of(record.params, "precision")))
    scale = mine / theirs if mine and theirs else 1.0
    return (record.result.samples_per_s or 0.0) * max(scale, 1.0)


def remaining_s(
    records: list[TrialRecord], steps: int, space_batch: float, trials: int
) -> tuple[float, float, float] | None:
    """The wall time `trials` more trials take, predicted from the trials so far: each a
    start-up (`TrialCost`) and its steps at the median per-sample pace measured, its work a
    step the median effective batch of the trials since the baseline (before any: the
    space's median, `space_batch`): a proposal training 8x the baseline's samples a step is
    counted at 8x its steps' time. With the same work at the fastest and the slowest pace
    measured: (likely, least, most); None before a trial was measured."""
    measured = [r for r in records if r.status is Status.OK and r.result.samples_per_s]
    if not measured:
        return None
    paces = [1 / r.result.samples_per_s for r in measured]
    proposals = [
        effective_batch(r.params)
        for r in records
        if not r.baseline and r.status is not Status.SKIPPED
    ]
    batch = statistics.median(proposals) if proposals else space_batch
    start_s = TrialCost.fit(records, steps).start_s
    likely, least, most = (
        trials * (start_s + steps * batch * pace)
        for pace in (statistics.median(paces), min(paces), max(paces))
    )
    return likely, least, most
