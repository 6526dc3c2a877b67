"""The trade-off between speed and memory: the Pareto front, and the config to recommend."""

from __future__ import annotations

import optuna

from autotune.records import RESULT_ATTR, TrialRecord, record_of

GIB = 1024**3


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """Successful trials that no other beats on both samples/s and peak memory, fastest first."""
    # Optuna's best_trials is the non-dominated set of COMPLETE trials; only `ok` trials are
    # told as COMPLETE, so failures never reach it.
    # Repeated settings are told with their first run's values; only first runs are kept.
    front = [record_of(t) for t in study.best_trials if RESULT_ATTR in t.user_attrs]
    return sorted(front, key=lambda r: r.result.samples_per_s, reverse=True)


def memory_limit_gib(memory_budget_bytes: int, headroom: float) -> float:
    """Peak memory a recommended config may reach: the budget less the headroom."""
    return memory_budget_bytes * (1 - headroom) / GIB


def recommend(front: list[TrialRecord], limit_gib: float) -> TrialRecord | None:
    """The fastest trial on the front whose peak memory stays under `limit_gib`."""
    fitting = [r for r in front if r.result.peak_memory_gib <= limit_gib]
    return max(fitting, key=lambda r: r.result.samples_per_s, default=None)
