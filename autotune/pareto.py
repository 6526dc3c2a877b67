"""The trade-off between speed and memory: the non-dominated trials, and the ones to recommend.

Pure functions over decoded trials (`records.read_snapshot` reads the study and calls them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.trial import Status, TrialResult
from autotune.units import format_gib

if TYPE_CHECKING:  # records imports this module to build its snapshot
    from autotune.records import TrialRecord

SAVER_WITHIN = 0.10
"""The memory saver may be this much slower than the fastest pick."""


def is_noisy(result: TrialResult, noise_cv: float) -> bool:
    """Its timed steps varied more than `noise_cv` (stdev / mean): its figure is less certain."""
    return result.step_time_cv is not None and result.step_time_cv > noise_cv


def non_dominated(records: list[TrialRecord]) -> list[TrialRecord]:
    """Trials no other trial beats on both samples/s (higher) and peak memory (lower)."""

    def beats(a: TrialRecord, b: TrialRecord) -> bool:
        faster, smaller = a.result.samples_per_s, a.result.peak_memory_gib
        other_speed, other_memory = b.result.samples_per_s, b.result.peak_memory_gib
        at_least = faster >= other_speed and smaller <= other_memory
        return at_least and (faster > other_speed or smaller < other_memory)

    return [r for r in records if not any(beats(other, r) for other in records)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Picks:
    fastest: TrialRecord | None
    """The highest samples/s under the limit."""
    saver: TrialRecord | None
    """The least memory within SAVER_WITHIN of the fastest's samples/s."""
    baseline: TrialRecord | None
    """The HF-defaults trial, when it ran."""
    noise_cv: float
    """A trial whose step-time CV is above this is flagged noisy."""

    def speedup(self, record: TrialRecord) -> float | None:
        """samples/s relative to the baseline; None when the baseline has no figure."""
        if self.baseline is None or self.baseline.status is not Status.OK:
            return None
        return record.result.samples_per_s / self.baseline.result.samples_per_s

    def describe_baseline(self) -> str:
        if self.baseline is None:
            return "not run"
        if self.baseline.result.samples_per_s is None:
            status = self.baseline.status.value
            return f"trial {self.baseline.number}: {status}: {self.baseline.result.reason}"
        r = self.baseline.result
        return (
            f"trial {self.baseline.number}: {r.samples_per_s:.2f} samples/s at "
            f"{format_gib(r.peak_memory_gib, 3)}"
        )

    def describe(self, record: TrialRecord) -> str:
        """`trial 7: 512.30 samples/s (1.42x the baseline) at 3.210 GiB`, with a caveat when
        this trial or the baseline measured noisily."""
        speedup = self.speedup(record)
        notes = [f"{speedup:.2f}x the baseline"] if speedup is not None else []
        notes += [caveat] if (caveat := self.noise_caveat(record)) else []
        times = f" ({'; '.join(notes)})" if notes else ""
        return (
            f"trial {record.number}: {record.result.samples_per_s:.2f} samples/s{times} at "
            f"{format_gib(record.result.peak_memory_gib, 3)}"
        )

    def noise_caveat(self, record: TrialRecord) -> str:
        """`noisy: step CV 35% on this trial, 22% on the baseline (above 10%): ...`; "" when
        neither figure behind the speedup is noisy."""
        measured = [(record, "it")]
        if self.baseline is not None and self.baseline.number != record.number:
            measured.append((self.baseline, "the baseline"))
        noisy = [
            f"{r.result.step_time_cv:.0%} on {which}"
            for r, which in measured
            if is_noisy(r.result, self.noise_cv)
        ]
        if not noisy:
            return ""
        return (
            f"noisy: step CV {' and '.join(noisy)} (above noise_cv {self.noise_cv:.0%}); more "
            "measure_steps or an idle machine would firm the figure up"
        )

    def describe_saver(self) -> str:
        if self.saver is None or self.fastest is None:
            return "none"
        if self.saver.number == self.fastest.number:
            return f"the same trial: nothing within {SAVER_WITHIN:.0%} uses less memory"
        return self.describe(self.saver)


def pick(
    front: list[TrialRecord], limit_gib: float, baseline: TrialRecord | None, noise_cv: float
) -> Picks:
    fitting = [r for r in front if r.result.peak_memory_gib <= limit_gib]
    fastest = max(fitting, key=lambda r: r.result.samples_per_s, default=None)
    saver = None
    if fastest is not None:
        close = [
            r
            for r in fitting
            if r.result.samples_per_s >= (1 - SAVER_WITHIN) * fastest.result.samples_per_s
        ]
        saver = min(close, key=lambda r: r.result.peak_memory_gib)
    return Picks(fastest=fastest, saver=saver, baseline=baseline, noise_cv=noise_cv)


def hypervolume(points: list[tuple[float, float]], max_memory_gib: float) -> float:
    """Area (samples/s x GiB) dominated by (samples/s up, memory down) points, measured from
    zero throughput and the memory budget: the larger, the better the front."""
    area, best = 0.0, 0.0
    for speed, memory in sorted(points, key=lambda p: p[1]):
        if speed > best and memory < max_memory_gib:
            area += (speed - best) * (max_memory_gib - memory)
            best = speed
    return area
