"""Draws `ReportData` as one self-contained HTML file (plotly.js embedded once: works offline).

plotly.js is 4.8 MB, nearly all of the file. Its partial bundles would be smaller, but none
holds scatter, bar and parcoords together (basic and cartesian lack parcoords, gl2d lacks bar)
and the plotly package ships only the full one; building a custom bundle needs the plotly.js
sources and a JS toolchain. So the full bundle goes in once, gzipped (1.5 MB, 2 MB as base64),
and the page unpacks it with the browser's own `DecompressionStream` (Chromium 80, Firefox
113, Safari 16.4) before drawing: no network, no library of our own.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from autotune.common.output_files import write_atomic
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


def _points_trace(name: str, points: list[Point], **style: object) -> go.Scatter:
    return go.Scatter(
        name=name,
        x=[p.peak_memory_gib for p in points],
        y=[p.samples_per_s for p in points],
        text=[p.hover for p in points],
        hovertemplate="%{text}<extra></extra>",
        **style,
    )


def pareto_figure(data: ReportData) -> go.Figure:
    """Ours, not Optuna's `plot_pareto_front`: it would place out-of-memory trials at the
    values told to the sampler and has no budget lines, no baseline, recommendation or saver
    marks, no noise flags and no settings in the hover."""
    fig = go.Figure()
    for kind in POINT_KINDS:
        points = sorted((p for p in data.points if p.kind == kind), key=lambda p: p.peak_memory_gib)
        if points:
            fig.add_trace(
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
    for label, flag, marker in MARKS:
        points = [p for p in data.points if getattr(p, flag)]
        if points:
            marker = {"line": {"width": 2}, "color": "#202124", **marker}
            fig.add_trace(_points_trace(label, points, mode="markers", marker=marker))
    confirmed = [p for p in data.points if p.confirmed is not None]
    if confirmed:  # beside the trial's own measurement, never instead of it
        medians = [p.confirmed for p in confirmed if p.confirmed is not None]
        fig.add_trace(
            go.Scatter(
                name="confirmed: median [lowest-highest round]",
                x=[p.peak_memory_gib for p in confirmed],
                y=[m[0] for m in medians],
                text=[
                    f"trial {p.number} confirmed: {m[0]:.2f} samples/s (rounds {m[1]:.2f}-"
                    f"{m[2]:.2f})"
                    for p, m in zip(confirmed, medians, strict=True)
                ],
                hovertemplate="%{text}<extra></extra>",
                mode="markers",
                marker={
                    "symbol": "line-ew-open",
                    "size": 22,
                    "color": "#202124",
                    "line": {"width": 2},
                },
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
        )
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
    fig.update_layout(
        title=title,
        xaxis_title="peak memory (GiB)",
        yaxis_title="samples/s",
        **{**LAYOUT, "height": 560},
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


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


def importance_figure(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for objective, values in data.importances.items():
        fig.add_trace(go.Bar(name=objective, x=list(values), y=list(values.values())))
    fig.update_layout(
        title=HEADINGS["importance"], barmode="group", yaxis_title="importance", **LAYOUT
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


@functools.cache
def packed_plotly_js() -> str:
    """plotly.js, gzipped (no timestamp: a rebuilt report is identical) and base64-encoded."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), mtime=0)).decode("ascii")


# Unpacks plotly.js, then draws each figure from its JSON. A failure is shown in place of the
# plots and thrown again, so the console has it too.
DRAW_SCRIPT = """
async function drawPlots() {
  const packed = atob(document.getElementById("plotly-js").textContent);
  const bytes = Uint8Array.from(packed, (c) => c.charCodeAt(0));
  const unpacked = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const library = document.createElement("script");
  library.textContent = await new Response(unpacked).text();
  document.head.appendChild(library);
  for (const holder of document.querySelectorAll("script.figure")) {
    const figure = JSON.parse(holder.textContent);
    Plotly.newPlot(holder.dataset.plot, figure.data, figure.layout,
                   {responsive: true, displaylogo: false});
  }
}
drawPlots().catch((error) => {
  for (const plot of document.querySelectorAll("div.plot")) {
    plot.textContent = "This browser could not draw the plot: " + error;
  }
  throw error;
});
"""
SORT_SCRIPT = """
const headers = document.querySelectorAll("table.sortable th");
headers.forEach((th, column) => th.addEventListener("click", () => {
  const body = th.closest("table").tBodies[0];
  const up = th.dataset.order !== "asc";
  th.dataset.order = up ? "asc" : "desc";
  const key = (row) => { const t = row.cells[column].textContent; const n = parseFloat(t);
                         return isNaN(n) ? t : n; };
  [...body.rows].sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1))
    .forEach((row) => body.appendChild(row));
}));
"""
CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #202124; max-width: 1200px; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #dadce0; padding: 4px 10px; text-align: left; font-size: 14px; }
th { background: #f1f3f4; }
#summary td { white-space: pre-line; }
table.sortable th { cursor: pointer; }
td.noisy, td.changes { color: #b06000; }
td.reason { max-width: 32rem; overflow-wrap: anywhere; white-space: pre-line; }
pre { background: #f8f9fa; padding: 1rem; overflow-x: auto; }
pre.wrap { white-space: pre-wrap; overflow-wrap: anywhere; }
p.empty { color: #5f6368; font-style: italic; }
section { margin: 1.5rem 0; }
"""


def _sections(data: ReportData, drawn: dict[str, go.Figure]) -> str:
    e = html.escape
    sections = []
    for chart in CHARTS:
        if chart in data.empty:
            body = f'<h3>{e(HEADINGS[chart])}</h3><p class="empty">{e(data.empty[chart])}</p>'
        else:
            # to_json escapes <, > and /: the JSON cannot close its script element.
            figure = drawn[chart].to_json()
            body = (
                f'<div id="{chart}-plot" class="plot"></div>'
                f'<script type="application/json" class="figure" data-plot="{chart}-plot">'
                f"{figure}</script>"
            )
            if chart == "importance":
                body += f'<p class="caveat">{e(data.importance_note)}</p>'
            if chart == "parallel" and (caption := parallel_caption(data)):
                body += f'<p class="caveat">{e(caption)}</p>'
        sections.append(f'<section id="{chart}">{body}</section>')
    return "\n".join(sections)


def _rows(data: ReportData) -> str:
    e = html.escape
    rows = []
    for r in data.rows:
        cv = _pct(r.step_time_cv) + (" noisy" if r.noisy else "")
        changed = ", ".join(c.setting for c in r.changes)
        full = "\n".join(c.describe() for c in r.changes)
        cells = [
            f"<td>{e(c)}</td>"
            for c in (
                str(r.number),
                r.status,
                r.params,
                _num(r.samples_per_s, 2),
                _pct(r.padding_share),
                _num(r.peak_memory_gib, 3),
                _pct(r.mfu),
            )
        ]
        cells.append(f'<td class="noisy">{e(cv)}</td>' if r.noisy else f"<td>{e(cv)}</td>")
        cells.append(f'<td class="changes" title="{e(full)}">{e(changed)}</td>')
        cells.append(f'<td class="reason">{e(r.reason)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(rows)


def render_html(data: ReportData) -> str:
    e = html.escape
    summary = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in data.summary.items())
    notes = "".join(f"<li>{e(n)}</li>" for n in data.notes) or "<li>none</li>"
    code = ""
    if data.code:
        code = f"<h2>Recommended config</h2><pre><code>{e(data.code)}</code></pre>"
    if data.cli_flags:
        # Wrapped: one long line would run off the page.
        code += "<p>As flags for the HF example scripts:</p>"
        code += f'<pre class="wrap"><code>{e(data.cli_flags)}</code></pre>'
    drawn = dict(figures(data))
    mfu = f"MFU of {data.mfu_peak_tflops:g} TFLOP/s" if data.mfu_peak_tflops else "MFU"
    library = ""
    if drawn:
        library = f'<script type="text/plain" id="plotly-js">{packed_plotly_js()}</script>'
        library += f"<script>{DRAW_SCRIPT}</script>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(data.title)}</title>
<style>{CSS}</style></head><body>
<h1>{e(data.title)}</h1>
<table id="summary">{summary}</table>
<h2>What was removed from the space, and why</h2><ul id="notes">{notes}</ul>
{_sections(data, drawn)}
<h2>Trials</h2><p>Click a column to sort. Hover a change for what it does to the training.</p>
<table class="sortable" id="trials"><thead><tr><th>#</th><th>status</th><th>settings</th>
<th>samples/s</th><th>padding</th><th>peak GiB</th><th>{e(mfu)}</th><th>step CV</th>
<th>changes vs baseline</th>
<th>reason</th></tr></thead>
<tbody>{_rows(data)}</tbody></table>
{code}
<script>{SORT_SCRIPT}</script>
{library}
</body></html>
"""


def write_report(data: ReportData, path: Path) -> Path:
    return write_atomic(path, render_html(data))


def _num(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
