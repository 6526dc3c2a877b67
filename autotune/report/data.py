"""What the report shows, as plain data: tested without drawing anything."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autotune.pareto import Picks
from autotune.records import TrialRecord, describe_params
from autotune.trial import Status


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    number: int
    samples_per_s: float
    peak_memory_gib: float
    on_front: bool
    recommended: bool
    hover: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    number: int
    status: str
    params: str
    samples_per_s: float | None
    peak_memory_gib: float | None
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportData:
    title: str
    summary: dict[str, str]
    points: list[Point]
    rows: list[Row]
    memory_budget_gib: float
    memory_limit_gib: float


def build_report_data(
    *,
    title: str,
    facts: dict[str, str],
    records: list[TrialRecord],
    front: list[TrialRecord],
    picks: Picks,
    memory_budget_gib: float,
    memory_limit_gib: float,
) -> ReportData:
    front_numbers = {r.number for r in front}
    recommended_number = picks.fastest.number if picks.fastest else None
    points = [
        Point(
            number=r.number,
            samples_per_s=r.result.samples_per_s,
            peak_memory_gib=r.result.peak_memory_gib,
            on_front=r.number in front_numbers,
            recommended=r.number == recommended_number,
            hover=f"trial {r.number}<br>{r.result.samples_per_s:.2f} samples/s, "
            f"{r.result.peak_memory_gib:.3f} GiB<br>"
            + "<br>".join(f"{k}={v}" for k, v in r.params.items()),
        )
        for r in records
        if r.status is Status.OK
    ]
    counts = Counter(r.status.value for r in records)
    summary = {
        **facts,
        "memory budget": f"{memory_budget_gib:.2f} GiB (recommend below {memory_limit_gib:.2f})",
        "trials": ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none",
    }
    if picks.fastest and picks.saver:
        summary["recommended"] = picks.describe(picks.fastest)
        summary["memory saver"] = picks.describe(picks.saver)
    rows = [
        Row(
            number=r.number,
            status=r.status.value,
            params=describe_params(r.params),
            samples_per_s=r.result.samples_per_s,
            peak_memory_gib=r.result.peak_memory_gib,
            reason=r.result.reason,
        )
        for r in records
    ]
    return ReportData(
        title=title,
        summary=summary,
        points=points,
        rows=rows,
        memory_budget_gib=memory_budget_gib,
        memory_limit_gib=memory_limit_gib,
    )
