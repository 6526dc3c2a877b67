"""The trade-off between speed and memory: the Pareto front, and the configs to recommend."""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from autotune.records import RESULT_ATTR, RunInfo, TrialRecord, load_records, record_of
from autotune.trial import Status
from autotune.units import GIB

SAVER_WITHIN = 0.10
"""The memory saver may be this much slower than the fastest pick."""


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """Feasible trials that no other beats on both samples/s and peak memory, fastest first."""
    # Optuna's best_trials is the non-dominated set of COMPLETE feasible trials (out-of-memory
    # trials are COMPLETE but infeasible). Repeats carry their first run's values: keep first runs.
    front = [record_of(t) for t in study.best_trials if RESULT_ATTR in t.user_attrs]
    return sorted(front, key=lambda r: r.result.samples_per_s, reverse=True)


def memory_limit_gib(memory_budget_bytes: int, headroom: float) -> float:
    """Peak memory a recommended config may reach: the budget less the headroom."""
    return memory_budget_bytes * (1 - headroom) / GIB


@dataclass(frozen=True, kw_only=True, slots=True)
class Picks:
    fastest: TrialRecord | None
    """The highest samples/s under the limit."""
    saver: TrialRecord | None
    """The least memory within SAVER_WITHIN of the fastest's samples/s."""
    baseline: TrialRecord | None
    """The HF-defaults trial, when it ran."""

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
            f"{r.peak_memory_gib:.3f} GiB"
        )

    def describe(self, record: TrialRecord) -> str:
        """`trial 7: 512.30 samples/s (1.42x the baseline) at 3.210 GiB`."""
        speedup = self.speedup(record)
        times = f" ({speedup:.2f}x the baseline)" if speedup is not None else ""
        return (
            f"trial {record.number}: {record.result.samples_per_s:.2f} samples/s{times} at "
            f"{record.result.peak_memory_gib:.3f} GiB"
        )


def study_picks(study: optuna.Study, info: RunInfo) -> Picks:
    """The picks of a stored study, by its own budget and headroom."""
    limit = memory_limit_gib(info.memory_budget_bytes, info.headroom)
    return pick(pareto_front(study), limit, baseline_of(load_records(study)))


def baseline_of(records: list[TrialRecord]) -> TrialRecord | None:
    return next((r for r in records if r.baseline), None)


def pick(front: list[TrialRecord], limit_gib: float, baseline: TrialRecord | None) -> Picks:
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
    return Picks(fastest=fastest, saver=saver, baseline=baseline)


def hypervolume(points: list[tuple[float, float]], max_memory_gib: float) -> float:
    """Area (samples/s x GiB) dominated by (samples/s up, memory down) points, measured from
    zero throughput and the memory budget: the larger, the better the front."""
    area, best = 0.0, 0.0
    for speed, memory in sorted(points, key=lambda p: p[1]):
        if speed > best and memory < max_memory_gib:
            area += (speed - best) * (max_memory_gib - memory)
            best = speed
    return area
