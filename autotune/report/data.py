"""What the report shows, as plain data (no plotly here): tested without drawing anything."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from dataclasses import dataclass

import optuna

from autotune.knobs import describe_params
from autotune.pareto import Picks, hypervolume
from autotune.records import RunInfo, StudySnapshot, TrialRecord
from autotune.trial import MEMORY_STATUSES, Status
from autotune.units import format_gib

POINT_KINDS = ("front", "dominated", "over budget", "oom", "skipped")


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    number: int
    kind: str
    """front | dominated | over budget | oom | skipped"""
    samples_per_s: float
    peak_memory_gib: float
    baseline: bool
    recommended: bool
    saver: bool
    hover: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Series:
    label: str
    x: list[float]
    y: list[float]


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    number: int
    status: str
    params: str
    samples_per_s: float | None
    peak_memory_gib: float | None
    mfu: float | None
    step_time_cv: float | None
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportData:
    title: str
    summary: dict[str, str]
    notes: list[str]
    points: list[Point]
    memory_budget_gib: float
    memory_limit_gib: float
    parallel: dict[str, list[object]]
    """Knob (and metric) name -> one value per successful trial, for parallel coordinates."""
    importances: dict[str, dict[str, float]]
    """Objective -> knob -> importance (Optuna's PED-ANOVA); empty with too few trials."""
    best_so_far: Series
    hypervolume: Series
    speed_by_batch: list[Series]
    memory_by_batch: list[Series]
    rows: list[Row]
    code: str = ""
    cli_flags: str = ""


def build_report_data(
    snapshot: StudySnapshot, *, code: str = "", cli_flags: str = ""
) -> ReportData:
    info, records, picks = snapshot.info, snapshot.records, snapshot.picks
    budget_gib, limit_gib = info.memory_budget_gib, info.memory_limit_gib
    ok = [r for r in records if r.status is Status.OK]
    return ReportData(
        title=f"autotune: {info.model} on {info.device_name}",
        summary=_summary(info, records, picks, snapshot.search_s, budget_gib, limit_gib),
        notes=list(info.space_notes),
        points=_points(records, snapshot.front, picks, budget_gib),
        memory_budget_gib=budget_gib,
        memory_limit_gib=limit_gib,
        parallel=_parallel(ok),
        importances=_importances(ok, budget_gib),
        best_so_far=_best_so_far(records, budget_gib),
        hypervolume=_hypervolume_history(records, budget_gib),
        speed_by_batch=_by_batch(ok, "samples_per_s"),
        memory_by_batch=_by_batch(ok, "peak_memory_gib"),
        rows=[_row(r) for r in records],
        code=code,
        cli_flags=cli_flags,
    )


def _summary(
    info: RunInfo,
    records: list[TrialRecord],
    picks: Picks,
    search_s: float | None,
    budget_gib: float,
    limit_gib: float,
) -> dict[str, str]:
    n_params = next((r.result.n_params for r in records if r.result.n_params), None)
    counts = Counter(r.status.value for r in records)
    summary = {
        "model": info.model + (f" ({n_params / 1e6:,.1f}M parameters)" if n_params else ""),
        "task": info.task,
        "seq_len": str(info.seq_len),
        "device": f"{info.device} ({info.device_name})",
        "memory budget": f"{format_gib(budget_gib)} (recommend below {format_gib(limit_gib)})",
        "space": f"{info.space}; {info.batch_mode}",
        "trials": ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none",
        "search time": "n/a" if search_s is None else f"{search_s / 60:.1f} min",
    }
    summary["baseline (HF defaults)"] = picks.describe_baseline()
    if picks.fastest and picks.saver:
        summary["recommended"] = picks.describe(picks.fastest)
        summary["memory saver"] = picks.describe(picks.saver)
    else:
        summary["recommended"] = (
            f"nothing to recommend: no successful trial peaks below {format_gib(limit_gib)} "
            "(the search exits with code 3)"
        )
    return summary


def _hover(record: TrialRecord) -> str:
    r = record.result
    lines = [f"trial {record.number}: {r.status.value}"]
    if r.samples_per_s is not None:
        lines.append(f"{r.samples_per_s:.2f} samples/s, {r.tokens_per_s:.0f} tokens/s")
    if r.peak_memory_gib is not None:
        lines.append(f"peak {format_gib(r.peak_memory_gib, 3)}")
    if r.mfu is not None:
        lines.append(f"MFU {r.mfu:.1%}")
    if r.reason:
        lines.append(r.reason)
    lines += [f"{k} = {v}" for k, v in record.params.items()]
    return "<br>".join(lines)


def _points(
    records: list[TrialRecord], front: list[TrialRecord], picks: Picks, budget_gib: float
) -> list[Point]:
    front_numbers = {r.number for r in front}
    numbers = {
        "recommended": picks.fastest.number if picks.fastest else None,
        "saver": picks.saver.number if picks.saver else None,
    }
    points = []
    for r in records:
        if r.status is Status.OK:
            over = r.result.peak_memory_gib > budget_gib
            kind = "over budget" if over else "front" if r.number in front_numbers else "dominated"
            x, y = r.result.peak_memory_gib, r.result.samples_per_s
        elif r.status in MEMORY_STATUSES:
            # No throughput: drawn on the x axis at the budget they hit (or their last reading).
            kind = "skipped" if r.status is Status.SKIPPED else "oom"
            x, y = max(r.result.peak_memory_gib or budget_gib, budget_gib), 0.0
        else:
            continue  # crashed, timeout, ...: nothing to place; they are in the table
        points.append(
            Point(
                number=r.number,
                kind=kind,
                samples_per_s=y,
                peak_memory_gib=x,
                baseline=r.baseline,
                recommended=r.number == numbers["recommended"],
                saver=r.number == numbers["saver"],
                hover=_hover(r),
            )
        )
    return points


def _parallel(ok: list[TrialRecord]) -> dict[str, list[object]]:
    knobs = [k for k in dict.fromkeys(k for r in ok for k in r.params) if _varies(ok, k)]
    columns: dict[str, list[object]] = {k: [r.params.get(k, "n/a") for r in ok] for k in knobs}
    columns["peak_memory_gib"] = [r.result.peak_memory_gib for r in ok]
    columns["samples_per_s"] = [r.result.samples_per_s for r in ok]
    return columns


def _varies(records: list[TrialRecord], knob: str) -> bool:
    return len({repr(r.params.get(knob)) for r in records}) > 1


def _importances(ok: list[TrialRecord], budget_gib: float) -> dict[str, dict[str, float]]:
    """Optuna's importances over our knob names, from feasible successful trials.

    The search's own study cannot be used directly: the baseline has no Optuna parameters and
    16-bit tensor-core batch sizes live under their own name, so the search space Optuna would
    intersect is empty. A copy with one categorical per knob keeps every trial comparable.
    """
    feasible = [r for r in ok if r.result.peak_memory_gib <= budget_gib]
    knobs = [
        k for k in dict.fromkeys(k for r in feasible for k in r.params) if _varies(feasible, k)
    ]
    knobs = [k for k in knobs if all(k in r.params for r in feasible)]
    if len(feasible) < 3 or not knobs:
        return {}
    distributions = {
        k: optuna.distributions.CategoricalDistribution(
            sorted({r.params[k] for r in feasible}, key=repr)
        )
        for k in knobs
    }
    copy = optuna.create_study(directions=["maximize", "minimize"])
    for r in feasible:
        copy.add_trial(
            optuna.trial.create_trial(
                params={k: r.params[k] for k in knobs},
                distributions=distributions,
                values=[r.result.samples_per_s, r.result.peak_memory_gib],
            )
        )
    importances = {}
    # PED-ANOVA explains what makes the target low: negate samples/s, which is maximised.
    for index, objective, sign in ((0, "samples_per_s", -1.0), (1, "peak_memory_gib", 1.0)):
        with warnings.catch_warnings():
            # Its reminder that it explains low values, which the sign above takes care of.
            warnings.simplefilter("ignore", UserWarning)
            importance = optuna.importance.get_param_importances(
                copy, target=lambda t, i=index, sign=sign: sign * t.values[i]
            )
        # Optuna orders ties as a set iterates, which changes with the hash seed, and knobs
        # that always moved together differ in the last bits. Rounded, with ties in name
        # order, a report rebuilt in another process is identical.
        rounded = {k: round(float(v), 12) for k, v in importance.items()}
        importances[objective] = dict(sorted(rounded.items(), key=lambda kv: (-kv[1], kv[0])))
    return importances


def _feasible_points(records: list[TrialRecord], budget_gib: float) -> list[tuple[float, float]]:
    return [
        (r.result.samples_per_s, r.result.peak_memory_gib)
        for r in records
        if r.status is Status.OK and r.result.peak_memory_gib <= budget_gib
    ]


def _best_so_far(records: list[TrialRecord], budget_gib: float) -> Series:
    best, x, y = 0.0, [], []
    for i, r in enumerate(records):
        point = _feasible_points([r], budget_gib)
        best = max([best, *(p[0] for p in point)])
        x.append(float(i + 1))
        y.append(best)
    return Series(label="best samples/s so far", x=x, y=y)


def _hypervolume_history(records: list[TrialRecord], budget_gib: float) -> Series:
    x, y = [], []
    for i in range(len(records)):
        x.append(float(i + 1))
        y.append(hypervolume(_feasible_points(records[: i + 1], budget_gib), budget_gib))
    return Series(label="hypervolume (samples/s x GiB under the budget)", x=x, y=y)


def _by_batch(ok: list[TrialRecord], metric: str) -> list[Series]:
    """One line per precision/optimizer pair: the best value seen at each batch size."""
    best = min if metric == "peak_memory_gib" else max
    series = []
    key = lambda r: (r.params.get("precision", "fp32"), r.params.get("optim", "default"))  # noqa: E731
    for (precision, optim), group in itertools.groupby(sorted(ok, key=key), key=key):
        by_batch: dict[int, float] = {}
        for r in group:
            batch = r.params["batch_size"]
            value = getattr(r.result, metric)
            by_batch[batch] = best(by_batch.get(batch, value), value)
        xs = sorted(by_batch)
        series.append(Series(label=f"{precision} {optim}", x=xs, y=[by_batch[b] for b in xs]))
    return series


def _row(record: TrialRecord) -> Row:
    r = record.result
    return Row(
        number=record.number,
        status=r.status.value + (" (baseline)" if record.baseline else ""),
        params=describe_params(record.params),
        samples_per_s=r.samples_per_s,
        peak_memory_gib=r.peak_memory_gib,
        mfu=r.mfu,
        step_time_cv=r.step_time_cv,
        reason=r.reason,
    )
