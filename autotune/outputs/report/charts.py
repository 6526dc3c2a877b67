"""The data behind each chart but the front: axes, series and importances (no plotly here).

Where Optuna draws the same chart (`optuna.visualization`), ours is kept for reasons given at
each function; in common: the report is built from decoded records (`StudySnapshot`), not a
live Study, so `autotune report` rebuilds it byte for byte; trials keep their own numbers; a
chart with nothing to draw says so in a sentence rather than drawing an empty axis; and the
tests check this data, where Optuna's functions return only a drawn figure.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.common.knobs import KNOBS
from autotune.common.trial import TrialResult
from autotune.common.trial_settings import describe_params
from autotune.common.units import format_gib
from autotune.outputs.pareto import hypervolume
from autotune.store.records import TrialRecord

MAX_TICKS = 12
"""A knob axis with at most this many distinct values gets one tick per value."""
IMPORTANCE_QUANTILE = 0.1
"""PED-ANOVA's target quantile: it explains what puts a trial among the best 10%."""
IMPORTANCE_TOP_TRIALS = 5
"""Optuna's guide: at least this many trials in that best group for a stable ranking."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Series:
    label: str
    x: list[float]
    y: list[float]
    lines: bool = True
    """Joined by a line; False: points that do not belong on one line."""
    hover: list[str] = field(default_factory=list)
    spread: list[float | None] = field(default_factory=list)
    """Error bars: +- this much around each y (`speed_spread`); empty: none drawn."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    """One axis of the parallel coordinates."""

    name: str
    """The knob or measurement (`batch_size`, `samples_per_s`)."""
    label: str
    """What the axis is titled: the knob's short name (`bs`), as in the settings lines, so
    that a dozen axes fit side by side."""
    values: list[float]
    """One per successful trial: the measurement, or for a knob the index of its value."""
    ticktext: list[str]
    """A knob's distinct values, placed at 0, 1, ...; empty for a continuous axis."""


def speed_spread(result: TrialResult) -> float | None:
    """The step-to-step spread of a trial's samples/s, drawn as its error bar: samples/s x
    the step time's CV (one standard deviation of the timed steps over their mean). A sample
    per step is fixed, so samples/s varies as the inverse of the step time: to first order by
    the same share. None where the trial timed too few steps for a CV."""
    if result.samples_per_s is None or result.step_time_cv is None:
        return None
    return result.samples_per_s * result.step_time_cv


def spread_text(result: TrialResult) -> str:
    """` (bar ±4.80: 1 step-time CV, 2.0%)`: the error bar, and what it is; or nothing."""
    spread = speed_spread(result)
    if spread is None:
        return ""
    return f" (bar ±{spread:.2f}: 1 step-time CV, {result.step_time_cv:.1%})"


def feasible(ok: list[TrialRecord], budget_gib: float) -> list[TrialRecord]:
    """Successful trials that peaked within the budget (what Optuna's constraint calls
    feasible)."""
    return [r for r in ok if r.result.feasible(budget_gib)]


def parallel_axes(ok: list[TrialRecord]) -> list[Axis]:
    """A categorical axis per knob that varied (a fixed one would be a flat line through
    every trial), then peak memory and samples/s; titled with short names (`bs`, `gc`).

    Optuna's `plot_parallel_coordinate` shows one objective (its `target`); both are axes
    here. And it reads the study's own params, which hold only what the sampler chose: a
    derived grad_accum is missing, a tensor-core batch size is a multiple of 64 under
    another name. Out-of-memory trials, told 0 samples/s, would draw as lines; here they are
    left to the table and the front.
    """
    knobs = [k for k in dict.fromkeys(k for r in ok for k in r.params) if _varies(ok, k)]
    axes = [_knob_axis(k, [r.params.get(k) for r in ok]) for k in knobs]
    for metric, label in (("peak_memory_gib", "peak GiB"), ("samples_per_s", "samples/s")):
        values = [getattr(r.result, metric) for r in ok]
        axes.append(Axis(name=metric, label=label, values=values, ticktext=[]))
    return axes


def _knob_axis(name: str, values: list[Any]) -> Axis:
    """Discrete values at integer positions in their natural order (a continuous axis would
    tick grad_accum at 1.2, 1.4, ...); a knob absent from some trials shows `n/a` there."""
    distinct = sorted({repr(v): v for v in values}.values(), key=_value_order)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    label = KNOBS[name].short or name
    if numeric and len(distinct) > MAX_TICKS:
        return Axis(name=name, label=label, values=[float(v) for v in values], ticktext=[])
    position = {repr(v): i for i, v in enumerate(distinct)}
    return Axis(
        name=name,
        label=label,
        values=[float(position[repr(v)]) for v in values],
        ticktext=[_tick(v) for v in distinct],
    )


def _value_order(value: Any) -> tuple[int, Any]:
    if value is None:
        return (2, 0)
    return (1, value) if isinstance(value, str) else (0, value)


def _tick(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _varies(records: list[TrialRecord], knob: str) -> bool:
    return len({repr(r.params.get(knob)) for r in records}) > 1


def importances(within: list[TrialRecord]) -> dict[str, dict[str, float]]:
    """Optuna's importances over our knob names, from feasible successful trials.

    The search's own study cannot be used directly: its params hold only what the sampler
    chose (a derived grad_accum is missing; 16-bit tensor-core batch sizes live under their
    own name), so the search space Optuna intersects may lose knobs. A copy with one
    categorical per knob keeps every trial comparable. Optuna's `plot_param_importances`
    would rank them again with ties in set order, which differs between processes: a rebuilt
    report would not be identical (see below).
    """
    knobs = [k for k in dict.fromkeys(k for r in within for k in r.params) if _varies(within, k)]
    knobs = [k for k in knobs if all(k in r.params for r in within)]
    if len(within) < 3 or not knobs:
        return {}
    distributions = {
        k: optuna.distributions.CategoricalDistribution(
            sorted({r.params[k] for r in within}, key=repr)
        )
        for k in knobs
    }
    copy = optuna.create_study(directions=["maximize", "minimize"])
    for r in within:
        copy.add_trial(
            optuna.trial.create_trial(
                params={k: r.params[k] for k in knobs},
                distributions=distributions,
                values=[r.result.samples_per_s, r.result.peak_memory_gib],
            )
        )
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=IMPORTANCE_QUANTILE)
    ranked = {}
    # PED-ANOVA explains what makes the target low: negate samples/s, which is maximised.
    for index, objective, sign in ((0, "samples_per_s", -1.0), (1, "peak_memory_gib", 1.0)):
        with warnings.catch_warnings():
            # Its reminder that it explains low values, which the sign above takes care of.
            warnings.simplefilter("ignore", UserWarning)
            importance = optuna.importance.get_param_importances(
                copy, evaluator=evaluator, target=lambda t, i=index, sign=sign: sign * t.values[i]
            )
        # Optuna orders ties as a set iterates, which changes with the hash seed, and knobs
        # that always moved together differ in the last bits. Rounded, with ties in name
        # order, a report rebuilt in another process is identical.
        rounded = {k: round(float(v), 12) for k, v in importance.items()}
        ranked[objective] = dict(sorted(rounded.items(), key=lambda kv: (-kv[1], kv[0])))
    return ranked


def importance_note(n_trials: int) -> str:
    """How many trials the importances rest on, and whether that is enough to trust them."""
    note = f"Rests on {n_trials} successful trial{'s' * (n_trials != 1)} within the budget."
    top = math.ceil(IMPORTANCE_QUANTILE * n_trials)
    if top < IMPORTANCE_TOP_TRIALS:
        needed = math.ceil(IMPORTANCE_TOP_TRIALS / IMPORTANCE_QUANTILE)
        note += (
            f" PED-ANOVA compares the best {IMPORTANCE_QUANTILE:.0%} ({top} here) with the rest;"
            f" Optuna advises at least {IMPORTANCE_TOP_TRIALS} in that group (about {needed} "
            "trials): read this as a hint."
        )
    return note


def histories(records: list[TrialRecord], budget_gib: float) -> tuple[Series, Series]:
    """Best samples/s so far and the front's hypervolume, at each trial's own number.

    Optuna's `plot_optimization_history` and `plot_hypervolume_history` need a live Study: the
    search's own also holds repeats (told an earlier trial's values), which are not records,
    and a copy would renumber the trials; an interrupted trial is a point that adds nothing.
    The hypervolume is `pareto.hypervolume`, from zero samples/s and the budget (Optuna's
    reference point).
    """
    best, points, x, y_best, y_volume = 0.0, [], [], [], []
    for r in records:
        if r.result.feasible(budget_gib):
            points.append((r.result.samples_per_s, r.result.peak_memory_gib))
            best = max(best, r.result.samples_per_s)
        x.append(float(r.number))
        y_best.append(best)
        y_volume.append(hypervolume(points, budget_gib))
    return (
        Series(label="best samples/s so far", x=x, y=y_best),
        Series(label="hypervolume (samples/s x GiB under the budget)", x=list(x), y=y_volume),
    )


def by_batch(ok: list[TrialRecord], metric: str, with_batch: set[str]) -> list[Series]:
    """A line through trials that differ in batch size alone (the knobs in `with_batch`:
    batch_size, and grad_accum where it is derived from it); trials with no such partner are
    points of their own, so a change of checkpointing or attention never reads as a batch
    effect. Lines come in the order of their first trial; the loose points last."""
    show: Callable[[float], str] = (
        (lambda v: format_gib(v, 3)) if metric == "peak_memory_gib" else "{:.2f} samples/s".format
    )

    def others(r: TrialRecord) -> dict[str, Any]:
        return {k: v for k, v in r.params.items() if k not in with_batch}

    def key(r: TrialRecord) -> str:
        return repr(sorted(others(r).items()))

    groups: dict[str, list[TrialRecord]] = {}
    for r in ok:
        groups.setdefault(key(r), []).append(r)
    series, alone = [], []
    for group in groups.values():
        if len({r.params["batch_size"] for r in group}) < 2:
            alone += group
            continue
        group = sorted(group, key=lambda r: r.params["batch_size"])
        series.append(_batch_series(describe_params(others(group[0])), group, metric, show))
    if alone:
        alone.sort(key=lambda r: r.number)
        series.append(
            _batch_series("differ in more than batch size", alone, metric, show, lines=False)
        )
    return series


def _batch_series(
    label: str,
    group: list[TrialRecord],
    metric: str,
    show: Callable[[float], str],
    *,
    lines: bool = True,
) -> Series:
    values = [getattr(r.result, metric) for r in group]
    # Peak memory is one reading, not a spread of steps: its series have no error bars.
    speed = metric == "samples_per_s"
    return Series(
        label=label,
        x=[r.params["batch_size"] for r in group],
        y=values,
        lines=lines,
        hover=[
            f"trial {r.number}: {show(v)}{spread_text(r.result) if speed else ''}"
            f"<br>{describe_params(r.params)}"
            for r, v in zip(group, values, strict=True)
        ],
        spread=[speed_spread(r.result) for r in group] if speed else [],
    )
