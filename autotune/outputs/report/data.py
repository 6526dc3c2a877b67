"""What the report shows, as plain data (no plotly here): tested without drawing anything.

The report is built from a `StudySnapshot` (decoded records), never from a live Study, so
`autotune report` rebuilds it from the storage alone, byte for byte. Per chart, the data is in
`charts.py`; a chart with nothing to draw carries a sentence saying why (`ReportData.empty`).
"""

from __future__ import annotations

import html
import textwrap
from collections import Counter
from dataclasses import dataclass

from autotune.common import adapter
from autotune.common.trial import MEMORY_STATUSES, Status
from autotune.common.trial_settings import MathChange, describe_params
from autotune.common.units import format_gib, plural
from autotune.outputs.pareto import NOTHING_TO_RECOMMEND, Picks
from autotune.outputs.report.charts import (
    Axis,
    Series,
    by_batch,
    feasible,
    histories,
    importance_note,
    importances,
    parallel_axes,
    speed_spread,
    spread_text,
)
from autotune.outputs.snapshot import StudySnapshot
from autotune.plan import conditions
from autotune.plan.run_info import RunInfo
from autotune.store.outcomes import Ending
from autotune.store.records import TrialRecord

POINT_KINDS = ("front", "dominated", "over budget", "oom", "skipped")
CHARTS = (
    "pareto", "parallel", "importance", "history", "hypervolume", "speed-by-batch",
    "memory-by-batch",
)  # fmt: skip
"""Every chart, in page order: each is drawn, or says in `ReportData.empty` why not."""
HOVER_WIDTH = 80
"""Characters in a line of a hover's reason (about 560 px): longer ones are wrapped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    number: int
    kind: str
    """front | dominated | over budget | oom | skipped"""
    samples_per_s: float
    peak_memory_gib: float
    """Measured; for oom and skipped trials the budget they did not fit in."""
    baseline: bool
    recommended: bool
    saver: bool
    noisy: bool
    """Its step time varied more than the study's noise_cv: its samples/s is less certain."""
    samples_per_s_spread: float | None
    """Its error bar: +- this much samples/s (`charts.speed_spread`); None: none drawn."""
    hover: str
    confirmed: tuple[float, float, float] | None = None
    """Confirmed: the median samples/s of the confirmation rounds, its lowest and highest
    round (drawn as a mark of their own: the point itself is the trial's measurement)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    number: int
    status: str
    params: str
    samples_per_s: float | None
    padding_share: float | None
    """Padding among the token positions computed on (the user's data)."""
    peak_memory_gib: float | None
    mfu: float | None
    step_time_cv: float | None
    noisy: bool
    changes: list[MathChange]
    """Differences from the baseline that change the training itself, not only its speed."""
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportData:
    title: str
    summary: dict[str, str]
    """Row name -> text; a text of several lines (one per training change) keeps its breaks."""
    notes: list[str]
    points: list[Point]
    memory_budget_gib: float
    memory_limit_gib: float
    parallel: list[Axis]
    """One axis per knob that varied, then peak memory and samples/s: one line per success."""
    importances: dict[str, dict[str, float]]
    """Objective -> knob -> importance (Optuna's PED-ANOVA); empty with too few trials."""
    importance_note: str
    """How many trials the importances rest on, and how far to trust them."""
    best_so_far: Series
    hypervolume: Series
    speed_by_batch: list[Series]
    memory_by_batch: list[Series]
    rows: list[Row]
    empty: dict[str, str]
    """Chart (one of CHARTS) -> why it has nothing to draw, said in its place instead."""
    code: str = ""
    cli_flags: str = ""
    mfu_peak_tflops: float | None = None
    """MFU's one denominator (the device's 16-bit peak), when the trials share one."""


def build_report_data(
    snapshot: StudySnapshot, *, code: str = "", cli_flags: str = ""
) -> ReportData:
    info, records = snapshot.info, snapshot.records
    budget_gib = info.memory_budget_gib
    ok = [r for r in records if r.status is Status.OK]
    within = feasible(ok, budget_gib)
    # With effective_batch_size= fixed, grad_accum is derived from the batch size: it moves
    # with it, and two trials that differ in both still differ "in batch size alone".
    with_batch = {"batch_size"} | ({"grad_accum"} if info.effective_batch_size else set())
    best_so_far, hypervolume = histories(records, budget_gib)
    ranked = importances(within)
    return ReportData(
        title=f"autotune: {info.model} on {info.device_name}"
        + (" (simulated by the GPU twin)" if info.simulated else ""),
        summary=_summary(snapshot) | _provenance(snapshot),
        notes=list(info.space_notes),
        points=_points(snapshot),
        memory_budget_gib=budget_gib,
        memory_limit_gib=info.memory_limit_gib,
        parallel=parallel_axes(ok),
        importances=ranked,
        importance_note=importance_note(len(within)),
        best_so_far=best_so_far,
        hypervolume=hypervolume,
        speed_by_batch=by_batch(ok, "samples_per_s", with_batch),
        memory_by_batch=by_batch(ok, "peak_memory_gib", with_batch),
        rows=[_row(r, snapshot) for r in records],
        empty=_empty(snapshot, n_ok=len(ok), n_within=len(within), ranked=bool(ranked)),
        code=code,
        cli_flags=cli_flags,
        mfu_peak_tflops=shared_mfu_peak(records),
    )


def shared_mfu_peak(records: list[TrialRecord]) -> float | None:
    """The peak every measured trial's MFU is of (None when none has one, or they differ)."""
    peaks = {r.result.mfu_peak_tflops for r in records} - {None}
    return peaks.pop() if len(peaks) == 1 else None


def _empty(snapshot: StudySnapshot, *, n_ok: int, n_within: int, ranked: bool) -> dict[str, str]:
    """A sentence for each chart with nothing to draw: an empty axis (or a flat zero line)
    looks like a result."""
    statuses = Counter(r.status.value for r in snapshot.records)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    no_success = (
        f"No trial measured a throughput ({counts or 'no trials'}): nothing to place here. "
        "The table below lists every trial and why it stopped."
    )
    budget = format_gib(snapshot.info.memory_budget_gib)
    no_feasible = f"No successful trial peaked within the {budget} budget: nothing to follow."
    empty = {}
    if n_ok == 0:
        empty |= dict.fromkeys(
            ("pareto", "parallel", "speed-by-batch", "memory-by-batch"), no_success
        )
    if n_within == 0:
        empty |= dict.fromkeys(("history", "hypervolume"), no_feasible)
    if not ranked:
        empty["importance"] = (
            "Parameter importance needs at least 3 successful trials within the budget and a "
            f"setting that varied among them; this study has {n_within} such trials."
        )
    return {chart: empty[chart] for chart in CHARTS if chart in empty}


def _parameters(info: RunInfo, records: list[TrialRecord], n_params: int | None) -> str:
    """` (335.1M parameters)` after the model's name; where a `trainer=` factory trained
    another model, the count is said to be that one's."""
    if not n_params:
        return ""
    count = f"{n_params / 1e6:,.1f}M parameters"
    trained = next((r.result.trained_model for r in records if r.result.trained_model), None)
    if trained is None or trained in (info.model, info.model_config.get("model_type")):
        return f" ({count})"
    return f" (named; the trainer= factory's {trained} has {count})"


def _summary(snapshot: StudySnapshot) -> dict[str, str]:
    """The study, how its search ended, the baseline and the best found; then the picks."""
    info, records, picks = snapshot.info, snapshot.records, snapshot.picks
    n_params = next((r.result.n_params for r in records if r.result.n_params), None)
    counts = Counter(r.status.value for r in records)
    search_s = snapshot.search_s
    summary = {} if snapshot.simulated_time is None else {"simulated": snapshot.simulated_time}
    summary |= {
        "model": info.model + _parameters(info, records, n_params),
        "task": info.task,
        "seq_len": str(info.seq_len)
        + ("" if (note := snapshot.trained_note()) is None else f" (named; {note})"),
        "device": f"{info.device} ({info.device_name})"
        + ("" if info.gpu_link is None else f"; between a trial's GPUs: {info.gpu_link}"),
        "memory budget": (
            f"{format_gib(info.memory_budget_gib)} "
            f"(recommend below {format_gib(info.memory_limit_gib)})"
        ),
        "space": f"{info.space}; {info.batch_mode}",
        "adapter": adapter.describe(info.adapter)
        + (" (the base frozen: the same in every trial)" if info.adapter else ""),
        "trials": ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none",
        "search time": "n/a" if search_s is None else f"{search_s / 60:.1f} min",
    }
    if (ended := snapshot.ended) is not None:
        summary["search ended"] = ended.describe()
    if snapshot.confidence is not None:
        summary["search confidence"] = snapshot.confidence.describe()
    summary["baseline (HF defaults)"] = picks.describe_baseline()
    if picks.baseline is not None and (caveat := picks.noise_caveat(picks.baseline)):
        summary["baseline (HF defaults)"] += f"; {caveat}"
    if picks.reference is not None:
        changed = describe_params(picks.reference_changes())
        summary["reference (the HF defaults do not fit)"] = (
            f"{picks.describe_reference()}: the HF defaults with {changed}; every speedup is "
            "against it"
        )
    if (found := snapshot.anytime()) is not None:
        summary["found"] = found.describe(picks.speedup_note(found.best))
    return summary | _picks_summary(snapshot)


def _picks_summary(snapshot: StudySnapshot) -> dict[str, str]:
    """The recommendation with why, its compile payoff, training changes and verification,
    the other picks and the confirmation; or why there is nothing to recommend."""
    info, picks, ended = snapshot.info, snapshot.picks, snapshot.ended
    if picks.recommended is None or picks.saver is None:
        below = f"no successful trial peaks below {format_gib(info.memory_limit_gib)}"
        if ended is not None and ended.how is Ending.INTERRUPTED:  # its exit code: the signal's
            nothing = (
                f"nothing to recommend yet: {below}; the search was {ended.describe()}: "
                "the same command resumes it"
            )
        else:
            nothing = (
                f"nothing to recommend: {below} (the search exits with code {NOTHING_TO_RECOMMEND})"
            )
        return {"recommended": nothing}
    # describe() carries the confirmed interval, or the noise caveat when this trial or the
    # baseline measured noisily and there was no confirmation.
    summary = {"recommended": picks.describe(picks.recommended), "recommended: why": picks.why}
    if (payoff := snapshot.compile_payoff(picks.recommended)) is not None:
        summary["recommended: compile"] = payoff
    summary["recommended: changes the training"] = _changes_text(snapshot, picks.recommended)
    summary["same-training pick"] = picks.describe_same_training()
    if picks.fastest is not None and picks.fastest.number != picks.recommended.number:
        summary["fastest (not recommended)"] = picks.describe(picks.fastest)
        summary["fastest: changes the training"] = _changes_text(snapshot, picks.fastest)
    summary["confirmation"] = _confirmation_text(picks)
    verified = snapshot.verifications.get(picks.recommended.number)
    summary["recommended: verified"] = (
        verified.describe()
        if verified is not None
        else "not yet: `autotune verify STUDY_DIR` trains it for 200 steps and compares"
    )
    summary["memory saver"] = picks.describe_saver()
    if picks.saver.number != picks.recommended.number:
        summary["memory saver: changes the training"] = _changes_text(snapshot, picks.saver)
    return summary


def _provenance(snapshot: StudySnapshot) -> dict[str, str]:
    """Where the study came from (`conditions.summary_lines`), and the trials kept out of its
    front for other versions."""
    entries = conditions.summary_lines(list(snapshot.runs))
    if others := [r for r in snapshot.records if snapshot.other_versions(r)]:
        entries["provenance: other versions"] = (
            f"trial(s) {', '.join(str(r.number) for r in others)} measured under "
            f"{snapshot.other_versions(others[0])}: kept out of the front and the picks"
        )
    return entries


def _confirmation_text(picks: Picks) -> str:
    if picks.confirmed is None:
        return (
            "none: each figure is one short measurement (confirm_rounds=0, or trials were "
            "added since: `autotune confirm` measures the picks again)"
        )
    confirmed = picks.confirmed
    unsteady = confirmed.unsteady()
    return (
        f"{plural(confirmed.rounds, 'round')}, interleaved, each pick in a fresh trial process "
        f"({confirmed.wall_s:.0f} s); figures are round medians, [lowest-highest] round"
        + ("" if unsteady is None else f"; {unsteady}")
    )


def _changes_text(snapshot: StudySnapshot, record: TrialRecord) -> str:
    if snapshot.picks.baseline is None:
        return "unknown: no baseline trial to compare with"
    changes = snapshot.math_changes(record)
    if not changes:
        return "nothing: the baseline's optimizer, effective batch and precision"
    return "\n".join(c.describe() for c in changes)


def _hover(record: TrialRecord, snapshot: StudySnapshot) -> str:
    r = record.result
    lines = [f"trial {record.number}: {r.status.value}" + (" (baseline)" * record.baseline)]
    if r.samples_per_s is not None:
        tokens = "" if r.tokens_per_s is None else f", {r.tokens_per_s:.0f} tokens/s"
        padding = f" ({r.padding_share:.0%} padding)" if r.padding_share else ""
        lines.append(f"{r.samples_per_s:.2f} samples/s{spread_text(r)}{tokens}{padding}")
    if r.peak_memory_gib is not None:
        placed = " when stopped (drawn at the budget)" if r.status in MEMORY_STATUSES else ""
        lines.append(f"peak {format_gib(r.peak_memory_gib, 3)}{placed}")
    if r.mfu is not None:
        of = f" of {r.mfu_peak_tflops:g} TFLOP/s" if r.mfu_peak_tflops else ""
        lines.append(f"MFU {r.mfu:.1%}{of}")
    if r.node:  # a node's name is the cluster's, anyone's to set: escaped below
        lines.append(f"ran on node {r.node}")
    if snapshot.is_noisy(record):
        lines.append(
            f"noisy: step CV {r.step_time_cv:.0%} "
            f"(above noise_cv {snapshot.info.noise_cv * 100:g}%)"
        )
    # Escaped: plotly reads tags in hover text, and a reason may quote `<class ...>`.
    lines = [html.escape(line, quote=False) for line in lines]
    lines += [html.escape(line, quote=False) for line in _wrapped(r.reason)]
    lines += [f"{k} = {v}" for k, v in record.params.items()]
    for change in snapshot.math_changes(record):
        lines += _wrapped(f"changes the training: {change.describe()}")
    return "<br>".join(lines)


def _wrapped(text: str) -> list[str]:
    """`text` in hover lines of at most `HOVER_WIDTH` characters: plotly never wraps a hover,
    so a 300-character reason would run off the chart."""
    return [
        line
        for paragraph in text.splitlines()
        for line in textwrap.wrap(paragraph, HOVER_WIDTH, break_on_hyphens=False)
    ]


def _points(snapshot: StudySnapshot) -> list[Point]:
    budget_gib, picks = snapshot.info.memory_budget_gib, snapshot.picks
    front_numbers = {r.number for r in snapshot.front}
    numbers = {
        "recommended": picks.recommended.number if picks.recommended else None,
        "saver": picks.saver.number if picks.saver else None,
    }
    points = []
    for r in snapshot.records:
        if r.status is Status.OK:
            over = not r.result.feasible(budget_gib)
            kind = "over budget" if over else "front" if r.number in front_numbers else "dominated"
            x, y = r.result.peak_memory_gib, r.result.samples_per_s
        elif r.status in MEMORY_STATUSES:
            # No throughput, and no peak of their own to compare: the allocator refused (or
            # the watchdog stopped them) somewhere on the way up. On the x axis at the budget
            # they could not fit; the reading when they stopped is in the hover.
            kind = "skipped" if r.status is Status.SKIPPED else "oom"
            x, y = budget_gib, 0.0
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
                noisy=snapshot.is_noisy(r),
                samples_per_s_spread=speed_spread(r.result) if r.status is Status.OK else None,
                hover=_hover(r, snapshot),
                confirmed=_confirmed(snapshot, r.number),
            )
        )
    return points


def _confirmed(snapshot: StudySnapshot, number: int) -> tuple[float, float, float] | None:
    confirmed = snapshot.picks.confirmed
    if confirmed is None:
        return None
    median, spread = confirmed.median(number), confirmed.interval(number)
    return None if median is None or spread is None else (median, *spread)


def _row(record: TrialRecord, snapshot: StudySnapshot) -> Row:
    r = record.result
    return Row(
        number=record.number,
        status=r.status.value + (" (baseline)" if record.baseline else ""),
        params=describe_params(record.params),
        samples_per_s=r.samples_per_s,
        padding_share=r.padding_share,
        peak_memory_gib=r.peak_memory_gib,
        mfu=r.mfu,
        step_time_cv=r.step_time_cv,
        noisy=snapshot.is_noisy(record),
        changes=snapshot.math_changes(record),
        reason=r.reason,
    )
