"""Draws `ReportData` as one self-contained HTML file (plotly.js embedded once: works offline)."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go

from autotune.report.data import POINT_KINDS, Point, ReportData, Series

STYLE = {
    "front": {"color": "#1a73e8", "symbol": "circle", "size": 11},
    "dominated": {"color": "#9aa0a6", "symbol": "circle", "size": 9},
    "over budget": {"color": "#f29900", "symbol": "circle-open", "size": 10},
    "oom": {"color": "#d93025", "symbol": "x", "size": 11},
    "skipped": {"color": "#d93025", "symbol": "x-thin-open", "size": 10},
}
LAYOUT = {"template": "plotly_white", "height": 460, "margin": {"t": 50, "b": 50}}


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
                )
            )
    for label, flag, marker in (
        ("baseline (HF defaults)", "baseline", {"symbol": "diamond-open", "size": 18}),
        ("recommended", "recommended", {"symbol": "star", "size": 20, "color": "#e8710a"}),
        ("memory saver", "saver", {"symbol": "square-open", "size": 18, "color": "#188038"}),
    ):
        points = [p for p in data.points if getattr(p, flag)]
        if points:
            marker = {"line": {"width": 2}, "color": "#202124", **marker}
            fig.add_trace(_points_trace(label, points, mode="markers", marker=marker))
    largest = max((p.peak_memory_gib for p in data.points), default=data.memory_budget_gib)
    title = "Throughput vs peak memory"
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
    return fig


def parallel_figure(data: ReportData) -> go.Figure:
    dimensions = []
    for name, values in data.parallel.items():
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            dimensions.append({"label": name, "values": values})
        else:  # categorical: place each distinct value on its own tick
            labels = sorted({repr(v) for v in values})
            index = {label: i for i, label in enumerate(labels)}
            dimensions.append(
                {
                    "label": name,
                    "values": [index[repr(v)] for v in values],
                    "tickvals": list(range(len(labels))),
                    "ticktext": [label.strip("'") for label in labels],
                }
            )
    speed = data.parallel.get("samples_per_s", [])
    fig = go.Figure(
        go.Parcoords(
            dimensions=dimensions,
            line={"color": speed, "colorscale": "Viridis", "showscale": True},
        )
    )
    fig.update_layout(
        title="Settings of successful trials, coloured by samples/s",
        **{**LAYOUT, "margin": {"t": 110, "b": 40, "l": 60, "r": 60}},
    )
    return fig


def importance_figure(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for objective, values in data.importances.items():
        fig.add_trace(go.Bar(name=objective, x=list(values), y=list(values.values())))
    fig.update_layout(
        title="What mattered: parameter importance per objective (PED-ANOVA)",
        barmode="group",
        yaxis_title="importance",
        **LAYOUT,
    )
    return fig


def lines_figure(series: list[Series], title: str, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    for s in series:
        fig.add_trace(go.Scatter(name=s.label, x=s.x, y=s.y, mode="lines+markers"))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, **LAYOUT)
    return fig


def figures(data: ReportData) -> list[tuple[str, go.Figure]]:
    """(element id, figure) in page order."""
    found = [("pareto", pareto_figure(data))]
    if data.parallel.get("samples_per_s"):
        found.append(("parallel", parallel_figure(data)))
    if data.importances:
        found.append(("importance", importance_figure(data)))
    history = data.best_so_far
    found += [
        ("history", lines_figure([history], "Best samples/s so far", "trial", "samples/s")),
        ("hypervolume", lines_figure([data.hypervolume], "Hypervolume of the front", "trial",
                                     "samples/s x GiB")),
        ("speed-by-batch", lines_figure(data.speed_by_batch, "samples/s vs batch size",
                                        "batch size", "samples/s")),
        ("memory-by-batch", lines_figure(data.memory_by_batch, "Peak memory vs batch size",
                                         "batch size", "peak memory (GiB)")),
    ]  # fmt: skip
    return found


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


def render_html(data: ReportData) -> str:
    e = html.escape
    summary = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in data.summary.items())
    notes = "".join(f"<li>{e(n)}</li>" for n in data.notes) or "<li>none</li>"
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{e(c)}</td>"
            for c in (
                str(r.number),
                r.status,
                r.params,
                _num(r.samples_per_s, 2),
                _num(r.peak_memory_gib, 3),
                _pct(r.mfu),
                _pct(r.step_time_cv),
                r.reason,
            )
        )
        + "</tr>"
        for r in data.rows
    )
    plots = []
    for i, (element, fig) in enumerate(figures(data)):
        plot = fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=f"{element}-plot")
        plots.append(f'<section id="{element}">{plot}</section>')
    code = ""
    if data.code:
        code = f"<h2>Recommended config</h2><pre><code>{e(data.code)}</code></pre>"
    if data.cli_flags:
        flags = e(data.cli_flags)
        code += f"<p>As flags for the HF example scripts:</p><pre><code>{flags}</code></pre>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(data.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #202124; max-width: 1200px; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #dadce0; padding: 4px 10px; text-align: left; font-size: 14px; }}
th {{ background: #f1f3f4; }}
table.sortable th {{ cursor: pointer; }}
pre {{ background: #f8f9fa; padding: 1rem; overflow-x: auto; }}
</style></head><body>
<h1>{e(data.title)}</h1>
<table id="summary">{summary}</table>
<h2>What was removed from the space, and why</h2><ul id="notes">{notes}</ul>
{"".join(plots)}
<h2>Trials</h2><p>Click a column to sort.</p>
<table class="sortable" id="trials"><thead><tr><th>#</th><th>status</th><th>settings</th>
<th>samples/s</th><th>peak GiB</th><th>MFU</th><th>step CV</th><th>reason</th></tr></thead>
<tbody>{rows}</tbody></table>
{code}
<script>{SORT_SCRIPT}</script>
</body></html>
"""


def write_report(data: ReportData, path: Path) -> Path:
    path.write_text(render_html(data))
    return path


def _num(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
