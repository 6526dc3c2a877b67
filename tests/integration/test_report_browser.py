"""Open a real report in headless Chromium: it renders, with no console errors, offline."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.outputs.report.data import CHARTS
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000",
]  # fmt: skip


def search(out: Path, study: str, *settings: str) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (see .ci/run)")
        pytest.skip("chromium is not installed here")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            f"model={TINY_MODEL}",
            "seq_len=32",
            "warmup_steps=1",
            f"out={out}",
            f"study={study}",
            *settings,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    # Every trial runs its steps (no early stop): the importances need 3 measured trials, and
    # on a busy machine a slow trial would be stopped and leave the chart empty.
    proc = search(out, "b", "n_trials=5", "measure_steps=3", "early_stop=false")
    assert proc.returncode == 0, proc.stderr
    return out / "b" / "report.html"


@pytest.fixture(scope="module")
def oom_report(tmp_path_factory) -> Path:
    """Every trial out of memory: nothing to recommend, nothing to draw."""
    out = tmp_path_factory.mktemp("reports")
    proc = search(
        out, "o", "n_trials=3", "measure_steps=2", "memory_budget=20MiB", "estimate_margin=null"
    )  # each trial runs into the budget
    assert proc.returncode == 3, proc.stderr  # nothing to recommend
    return out / "o" / "report.html"


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def console_errors(proc: subprocess.CompletedProcess) -> list[str]:
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    return [line for line in console if ":ERROR:" in line or "Uncaught" in line]


def test_report_renders_every_plot_without_console_errors(report, tmp_path):
    proc = chromium(report, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not console_errors(proc)
    dom = proc.stdout
    for plot in CHARTS:
        # plotly fills each plot's empty div with an SVG ("main-svg") once it has drawn it,
        # after the page unpacked plotly.js.
        section = re.search(rf'<div id="{plot}-plot".*?</section>', dom, re.S)
        assert section and 'class="main-svg"' in section.group(0), plot
        # The tool bar upright at the right edge, clear of a long title at 800 px.
        assert re.search(r'class="modebar[^"]* vertical"', section.group(0)), plot
        if plot in ("pareto", "speed-by-batch"):  # each trial's step-time spread, drawn
            assert 'class="errorbar"' in section.group(0), plot
    assert "Throughput vs peak memory" in dom
    assert "python recommended.py" in dom and "{this file}" not in dom  # the script excerpt


def test_an_all_out_of_memory_report_says_why_each_chart_is_empty(oom_report, tmp_path):
    proc = chromium(oom_report, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not console_errors(proc)
    dom = proc.stdout
    assert re.search(r"<th>recommended</th><td>nothing to recommend: ", dom)
    for plot in CHARTS:
        section = re.search(rf'<section id="{plot}">(.*?)</section>', dom, re.S)
        assert section and '<p class="empty">' in section.group(1), plot
        assert "main-svg" not in section.group(1), plot
    # The three trials ran out of memory; a proposal at least as hungry as one of them may
    # have been skipped on the way (not a trial of the three).
    assert re.search(r"No trial measured a throughput \(3 oom(, \d+ skipped)?\)", dom)


def test_a_screenshot_of_the_report(report, tmp_path):
    shot = tmp_path / "report.png"
    proc = chromium(report, tmp_path / "profile", "--window-size=1300,3000", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a blank page is a few KB
