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
from autotune.outputs.report.data import CHARTS, ReportData
from autotune.outputs.report.figures import HEADINGS, figures, parallel_caption


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
