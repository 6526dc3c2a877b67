"""The report's charts as plotly figures, one per chart of `ReportData` (its headings too):
the front with its marks and budget lines, the settings' parallel coordinates, the importances,
and the lines of the histories and of the batch sizes. `html.py` puts them in the page.
"""

from __future__ import annotations

import plotly.graph_objects as go

from autotune.outputs.report.charts import Series
from autotune.outputs.report.data import CHARTS, POINT_KINDS, Point, ReportData

HEADINGS = {
    "pareto": "Throughput vs peak memory",
    "parallel": "Settings of successful trials, coloured by samples/s",
    "importance": "What mattered: parameter importance per objective (PED-ANOVA)",
    "history": "Best samples/s so far",
    "hypervolume": "Hypervolume of the front",
    "speed-by-batch": "samples/s vs batch size (lines: trials that differ in batch size alone)",
    "memory-by-batch": "Peak memory vs batch size (lines: trials that differ in batch size alone)",
}
assert set(HEADINGS) == set(CHARTS)
STYLE = {
    "front": {"color": "#1a73e8", "symbol": "circle", "size": 11},
    "dominated": {"color": "#9aa0a6", "symbol": "circle", "size": 9},
    "over budget": {"color": "#f29900", "symbol": "circle-open", "size": 10},
    "oom": {"color": "#d93025", "symbol": "x", "size": 11},
    "skipped": {"color": "#d93025", "symbol": "x-thin-open", "size": 10},
}
# Marks drawn over the points, in this order: each is larger than the next and open, so a
# trial that is two of them (the saver is often the recommendation) shows both.
MARKS = (
    ("noisy (step CV above noise_cv)", "noisy",
     {"symbol": "circle-open", "size": 30, "color": "#a142f4", "line": {"width": 1.5}}),
    ("baseline (HF defaults)", "baseline", {"symbol": "diamond-open", "size": 18}),
    ("memory saver", "saver", {"symbol": "square-open", "size": 25, "color": "#188038"}),
    ("recommended", "recommended", {"symbol": "star", "size": 18, "color": "#e8710a"}),
)  # fmt: skip
LAYOUT = {"template": "plotly_white", "height": 460, "margin": {"t": 50, "b": 50},
          "modebar": {"orientation": "v"}}  # fmt: skip
"""The tool bar upright at the right edge: across the top it ran into a long title at 800 px."""
TILT_AXES = 9
"""From this many parallel-coordinate axes, their titles are tilted (`parallel_figure`)."""
TILT_DEGREES = -25


def error_bars(spread: list[float | None], color: str | None = None) -> dict[str, object]:
    """Scatter kwargs for +- `spread` bars around each point (the step-to-step spread of its
    samples/s, `charts.speed_spread`); none where no point has one. plotly reads a missing
    value as 0 (a flat cap): among successful trials, only one without a step-time CV."""
    if all(v is None for v in spread):
        return {}
    bars = {"type": "data", "array": [v or 0.0 for v in spread], "thickness": 1.2, "width": 3}
    return {"error_y": bars | ({"color": color} if color else {})}


def _points_trace(
    name: str, points: list[Point], at_confirmed: bool = False, **style: object
) -> go.Scatter:
    """`at_confirmed`: a confirmed point at its rounds' median, not its trial's figure."""
    return go.Scatter(
        name=name,
        x=[p.peak_memory_gib for p in points],
        y=[p.confirmed[0] if at_confirmed and p.confirmed else p.samples_per_s for p in points],
        text=[p.hover for p in points],
        hovertemplate="%{text}<extra></extra>",
        **style,
    )


def pareto_figure(data: ReportData) -> go.Figure:
    """Ours, not Optuna's `plot_pareto_front`: it would place out-of-memory trials at the
    values told to the sampler and has no budget lines, no baseline, recommendation or saver
    marks, no noise flags and no settings in the hover."""
    fig = go.Figure()
    for trace in (*_kind_traces(data), *_mark_traces(data)):
        fig.add_trace(trace)
    confirmed = [p for p in data.points if p.confirmed is not None]
    if confirmed:  # beside the trial's own measurement, never instead of it
        fig.add_trace(_confirmed_trace(confirmed))
    fig.update_layout(
        title=_budget(fig, data),
        xaxis_title="peak memory (GiB)",
        yaxis_title="samples/s",
        **{**LAYOUT, "height": 560},
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


def _kind_traces(data: ReportData) -> list[go.Scatter]:
    """A trace per kind of point (`POINT_KINDS`) that has any, the front's joined by steps."""
    traces = []
    for kind in POINT_KINDS:
        points = sorted((p for p in data.points if p.kind == kind), key=lambda p: p.peak_memory_gib)
        if points:
            traces.append(
                _points_trace(
                    kind,
                    points,
                    mode="lines+markers" if kind == "front" else "markers",
                    line={"shape": "hv", "color": STYLE[kind]["color"]},
                    marker=STYLE[kind],
                    # On the points of each kind only: the marks drawn over them add none.
                    **error_bars([p.samples_per_s_spread for p in points], STYLE[kind]["color"]),
                )
            )
    return traces


def _mark_traces(data: ReportData) -> list[go.Scatter]:
    """A trace per mark (`MARKS`) that some point has, drawn over the points; a pick's mark
    at its confirmed median where it has one (the figure it is picked on), the noise flag at
    the trial's own figure (the one it flags)."""
    traces = []
    for label, flag, marker in MARKS:
        points = [p for p in data.points if getattr(p, flag)]
        if points:
            marker = {"line": {"width": 2}, "color": "#202124", **marker}
            at_confirmed = flag != "noisy"
            traces.append(_points_trace(label, points, at_confirmed, mode="markers", marker=marker))
    return traces


def _confirmed_trace(confirmed: list[Point]) -> go.Scatter:
    """The confirmed picks' medians, with bars from their lowest to their highest round."""
    medians = [p.confirmed for p in confirmed if p.confirmed is not None]
    return go.Scatter(
        name="confirmed: median [lowest-highest round]",
        x=[p.peak_memory_gib for p in confirmed],
        y=[m[0] for m in medians],
        text=[
            f"trial {p.number} confirmed: {m[0]:.2f} samples/s (rounds {m[1]:.2f}-{m[2]:.2f})"
            for p, m in zip(confirmed, medians, strict=True)
        ],
        hovertemplate="%{text}<extra></extra>",
        mode="markers",
        marker={"symbol": "line-ew-open", "size": 22, "color": "#202124", "line": {"width": 2}},
        error_y={
            "type": "data",
            "symmetric": False,
            "thickness": 1.5,
            "width": 8,
            "array": [m[2] - m[0] for m in medians],
            "arrayminus": [m[0] - m[1] for m in medians],
            "color": "#202124",
        },
    )


def _budget(fig: go.Figure, data: ReportData) -> str:
    """The memory budget and the limit below it as vertical lines; the chart's title, which
    names the budget instead where it lies far beyond every trial."""
    largest = max((p.peak_memory_gib for p in data.points), default=data.memory_budget_gib)
    title = HEADINGS["pareto"]
    if data.memory_limit_gib > 2 * largest:
        # A budget far beyond every trial would squeeze them into a corner: keep it off-chart.
        fig.update_xaxes(range=[0, largest * 1.2])
        title += f" (memory budget {data.memory_budget_gib:.1f} GiB, off the chart)"
    else:
        fig.add_vline(x=data.memory_budget_gib, line_color="#d93025", annotation_text="budget")
        fig.add_vline(
            x=data.memory_limit_gib,
            line_dash="dash",
            line_color="#d93025",
            annotation_text="less headroom",
            annotation_position="bottom left",
        )
    return title


def parallel_figure(data: ReportData) -> go.Figure:
    dimensions = []
    for axis in data.parallel:
        dimension: dict[str, object] = {"label": axis.label, "values": axis.values}
        if axis.ticktext:  # a knob: one tick per value, at 0, 1, ...
            dimension["tickvals"] = list(range(len(axis.ticktext)))
            dimension["ticktext"] = axis.ticktext
            dimension["range"] = [0, len(axis.ticktext) - 1]
        dimensions.append(dimension)
    speed = next(a.values for a in data.parallel if a.name == "samples_per_s")
    # Side by side, titles wider than the gap between axes run into each other: at 1200 px a
    # dozen axes leave about 80 px each. From TILT_AXES on they are tilted, which needs only
    # a line's height between neighbours, and the margin above makes room for them.
    tilted = len(dimensions) >= TILT_AXES
    fig = go.Figure(
        go.Parcoords(
            dimensions=dimensions,
            line={"color": speed, "colorscale": "Viridis", "showscale": True},
            labelangle=TILT_DEGREES if tilted else 0,
            labelfont={"size": 13},
            tickfont={"size": 10},
        )
    )
    fig.update_layout(
        title=HEADINGS["parallel"],
        **{**LAYOUT, "margin": {"t": 150 if tilted else 110, "b": 40, "l": 60, "r": 60}},
    )
    return fig


def parallel_caption(data: ReportData) -> str:
    """Which knob each short axis title names (`bs: batch_size`)."""
    # The knobs: the two measurements last are titled in words.
    named = [f"{a.label}: {a.name}" for a in data.parallel[:-2] if a.label != a.name]
    return "Axes: " + ", ".join(named) + "." if named else ""


OBJECTIVE_NAMES = {"samples_per_s": "samples/s", "peak_memory_gib": "peak memory"}
"""The importance chart's legend: each objective in words."""


def importance_figure(data: ReportData) -> go.Figure:
    """The legend sits inside the plot, at the top right where the least important knobs'
    bars are: at the right edge the upright tool bar covered its last letters
    (`peak_memory_gi`)."""
    fig = go.Figure()
    for objective, values in data.importances.items():
        name = OBJECTIVE_NAMES.get(objective, objective)
        fig.add_trace(go.Bar(name=name, x=list(values), y=list(values.values())))
    fig.update_layout(
        title=HEADINGS["importance"],
        barmode="group",
        yaxis_title="importance",
        legend={"x": 0.98, "xanchor": "right", "y": 0.98, "yanchor": "top"},
        **LAYOUT,
    )
    return fig


def lines_figure(series: list[Series], title: str, x_title: str, y_title: str) -> go.Figure:
    """x are trial numbers or batch sizes: ticked where there are points, never at 1.5."""
    fig = go.Figure()
    for s in series:
        fig.add_trace(
            go.Scatter(
                name=s.label,
                x=s.x,
                y=s.y,
                mode="lines+markers" if s.lines else "markers",
                marker={"size": 9} if s.lines else {"size": 10, "symbol": "circle-open"},
                **error_bars(s.spread),
                **({"text": s.hover, "hovertemplate": "%{text}<extra></extra>"} if s.hover else {}),
            )
        )
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, **LAYOUT)
    xs = sorted({x for s in series for x in s.x})
    if len(xs) <= 30:
        fig.update_xaxes(tickvals=xs)
    fig.update_yaxes(rangemode="tozero")
    return fig


def figures(data: ReportData) -> list[tuple[str, go.Figure]]:
    """(chart, figure) in page order, for the charts that have something to draw."""
    lines = {
        "history": ([data.best_so_far], "trial", "samples/s"),
        "hypervolume": ([data.hypervolume], "trial", "samples/s x GiB"),
        "speed-by-batch": (data.speed_by_batch, "batch size", "samples/s"),
        "memory-by-batch": (data.memory_by_batch, "batch size", "peak memory (GiB)"),
    }
    others = {"pareto": pareto_figure, "parallel": parallel_figure, "importance": importance_figure}
    found = []
    for chart in CHARTS:
        if chart in data.empty:
            continue
        if chart in lines:
            series, x_title, y_title = lines[chart]
            found.append((chart, lines_figure(series, HEADINGS[chart], x_title, y_title)))
        else:
            found.append((chart, others[chart](data)))
    return found
