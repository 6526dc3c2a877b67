"""Open a real report in headless Chromium: it renders, with no console errors, offline."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000",
]  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (see .ci/run)")
        pytest.skip("chromium is not installed here")
    out = tmp_path_factory.mktemp("reports")
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "search", f"model={TINY_MODEL}", "n_trials=5",
         "seq_len=32", "warmup_steps=1", "measure_steps=3", f"out={out}", "study=b"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out / "b" / "report.html"


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_report_renders_every_plot_without_console_errors(report, tmp_path):
    proc = chromium(report, tmp_path / "profile", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    problems = [line for line in console if ":ERROR:" in line or "Uncaught" in line]
    assert not problems, problems
    dom = proc.stdout
    for plot in ("pareto", "parallel", "importance", "history", "hypervolume", "speed-by-batch"):
        # plotly replaces each plot's empty div with an SVG ("main-svg") once it has drawn it.
        section = re.search(rf'<div id="{plot}-plot".*?</section>', dom, re.S)
        assert section and 'class="main-svg"' in section.group(0), plot
    assert "Throughput vs peak memory" in dom


def test_a_screenshot_of_the_report(report, tmp_path):
    shot = tmp_path / "report.png"
    proc = chromium(report, tmp_path / "profile", "--window-size=1300,3000", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a blank page is a few KB
