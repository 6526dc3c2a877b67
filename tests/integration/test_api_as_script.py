"""The Python API snippet of docs/python-api.md run as a script without a main guard: the trial
processes must never import the user's `__main__` (multiprocessing would re-run it in every
trial)."""

import json
import re
import subprocess
import sys

import pytest

from tests.integration.test_python_api import documented_example

N_TRIALS = 2
FAST = "confirm_rounds=0, warmup_steps=1, measure_steps=2"


def _script() -> str:
    """The documented snippet, smaller: the same call with fewer trials, shorter samples and
    fewer steps (a trial's length is not its subject: about 8 s less a run here)."""
    code = documented_example()
    code = re.sub(r"n_trials=\d+", f"n_trials={N_TRIALS}", code)
    code = re.sub(r"seq_len=\d+", "seq_len=32", code)
    # Not its subject either: the confirmation and the steps a trial measures.
    code = code.replace('study="api"', f'study="api", {FAST}')
    assert f"n_trials={N_TRIALS}" in code and "seq_len=32" in code, code
    assert FAST in code, code
    return code


def _run(command: list[str], cwd, stdin_text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin_text,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.parametrize("how", ["file", "stdin", "dash_c"])
def test_the_documented_snippet_as_a_script_without_a_main_guard_runs_one_search(tmp_path, how):
    script = tmp_path / "tune.py"
    script.write_text(_script())
    if how == "file":
        proc = _run([sys.executable, str(script)], tmp_path)
    elif how == "stdin":
        proc = _run([sys.executable, "-"], tmp_path, stdin_text=script.read_text())
    else:
        proc = _run([sys.executable, "-c", script.read_text()], tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # One search: its header once, and each trial started once.
    assert len(re.findall(r"^study \S+: .* -> ", proc.stdout, re.M)) == 1, proc.stdout[-3000:]
    assert len(re.findall(r"trial 0 started:", proc.stdout)) == 1, proc.stdout[-3000:]
    (study_dir,) = (tmp_path / "reports").iterdir()
    recommended = json.loads((study_dir / "recommended.json").read_text())
    assert recommended["trial"] is not None
    rows = (study_dir / "trials.csv").read_text().splitlines()[1:]
    assert len(rows) == N_TRIALS
    assert all(",ok," in row for row in rows), rows
