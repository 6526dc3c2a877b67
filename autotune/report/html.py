"""Draws `ReportData` as one self-contained HTML file (plotly.js embedded: works offline)."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go

from autotune.report.data import ReportData


def pareto_figure(data: ReportData) -> go.Figure:
    others = [p for p in data.points if not p.on_front]
    front = sorted((p for p in data.points if p.on_front), key=lambda p: p.peak_memory_gib)
    best = [p for p in data.points if p.recommended]
    fig = go.Figure()
    for name, points, style in (
        ("dominated", others, {"mode": "markers", "marker": {"color": "#9aa0a6", "size": 9}}),
        (
            "Pareto front",
            front,
            {
                "mode": "lines+markers",
                "marker": {"color": "#1a73e8", "size": 11},
                "line": {"shape": "hv"},
            },
        ),
        (
            "recommended",
            best,
            {"mode": "markers", "marker": {"color": "#e8710a", "size": 20, "symbol": "star"}},
        ),
    ):
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[p.peak_memory_gib for p in points],
                y=[p.samples_per_s for p in points],
                text=[p.hover for p in points],
                hovertemplate="%{text}<extra></extra>",
                **style,
            )
        )
    fig.add_vline(
        x=data.memory_limit_gib,
        line_dash="dash",
        line_color="#d93025",
        annotation_text="budget less headroom",
        annotation_position="top left",
    )
    fig.update_layout(
        title="Throughput vs peak memory",
        xaxis_title="peak memory (GiB)",
        yaxis_title="samples/s",
        template="plotly_white",
        height=560,
    )
    return fig


def render_html(data: ReportData) -> str:
    summary = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in data.summary.items()
    )
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(c)}</td>"
            for c in (
                str(r.number),
                r.status,
                r.params,
                _num(r.samples_per_s, 2),
                _num(r.peak_memory_gib, 3),
                r.reason,
            )
        )
        + "</tr>"
        for r in data.rows
    )
    plot = pareto_figure(data).to_html(full_html=False, include_plotlyjs=True)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(data.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #202124; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #dadce0; padding: 4px 10px; text-align: left; font-size: 14px; }}
th {{ background: #f1f3f4; }}
</style></head><body>
<h1>{html.escape(data.title)}</h1>
<table>{summary}</table>
<div id="pareto">{plot}</div>
<h2>Trials</h2>
<table><tr><th>#</th><th>status</th><th>settings</th><th>samples/s</th><th>peak GiB</th>
<th>reason</th></tr>{rows}</table>
</body></html>
"""


def write_report(data: ReportData, path: Path) -> Path:
    path.write_text(render_html(data))
    return path


def _num(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"
