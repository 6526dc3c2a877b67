"""Stopping a real `autotune search` from outside, as schedulers (Slurm, Kubernetes, systemd,
`timeout`) and a closed terminal do: SIGTERM and SIGHUP end it as Ctrl-C does.

Each test waits for a state (the trial's progress file), never for a time, before it sends the
signal; the timeouts below are only a safety net for a loaded machine.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.common.layout import INTERRUPTED_RESULT
from autotune.store.records import RETRY_OF_ATTR, SECOND_LOOK_ATTR, is_interrupted
from tests.conftest import TINY_MODEL
from tests.integration.test_sandbox_cpu import SPACE, descendants, rows, wait_gone

pytestmark = pytest.mark.slow
SAFETY_NET_S = 600


def command(out: Path, space: Path, *extra: str) -> list[str]:
    # 40 measured steps: trial 1 (batch 16) lasts 5-8 s here, long enough to be stopped in its
    # middle (the signal goes within 0.1 s of its progress file), and the retry that the rerun
    # of the SIGTERM test measures costs no more than that.
    return [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        f"space={space}",
        "warmup_steps=1",
        "measure_steps=40",
        f"out={out}",
        "study=s",
        "n_trials=2",
        "confirm_rounds=0",
        *extra,
    ]


@pytest.fixture
def space(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return path


def stop_mid_trial_1(argv: list[str], study_dir: Path, sig: int) -> tuple[subprocess.Popen, str]:
    """Start the search, send `sig` once trial 1 (after the baseline) is training; its stderr."""
    search = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + SAFETY_NET_S
    progress = study_dir / "trials" / "0001" / "progress.json"
    try:
        while not progress.exists():
            assert time.monotonic() < deadline and search.poll() is None, search.communicate()
            time.sleep(0.05)
        processes = descendants(search)
        sent = time.monotonic()
        search.send_signal(sig)
        _, stderr = search.communicate(timeout=SAFETY_NET_S)
        print(f"{signal.Signals(sig).name} to exit: {time.monotonic() - sent:.2f} s")
    finally:
        if search.poll() is None:
            search.kill()
            search.wait()
    assert not wait_gone(processes), "a process of the search outlived it"
    return search, stderr


def test_sigterm_mid_trial_records_it_interrupted_writes_the_outputs_and_exits_143(tmp_path, space):
    study_dir = tmp_path / "s"
    search, stderr = stop_mid_trial_1(command(tmp_path, space), study_dir, signal.SIGTERM)
    assert search.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "interrupted after 1 of 2 trials (SIGTERM); wrote" in stderr
    assert "trials.csv" in stderr and "report.html" in stderr
    assert (study_dir / "report.html").is_file()
    assert [(r["number"], r["status"]) for r in rows(study_dir / "trials.csv")] == [
        ("0", "ok"),
        ("1", "interrupted"),
    ]
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL"]
    assert is_interrupted(study.trials[1])

    again = subprocess.run(
        command(tmp_path, space), capture_output=True, text=True, timeout=SAFETY_NET_S
    )
    assert again.returncode == 0, again.stderr
    assert "trial 1 was interrupted: its settings run again first" in again.stdout
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert [t.user_attrs.get(RETRY_OF_ATTR) for t in study.trials[:3]] == [None, None, 1]
    # A 4th trial only where a loaded machine stopped the retry early against trial 0: the
    # fastest stopped trial run again to its end (a second look).
    assert all(SECOND_LOOK_ATTR in t.user_attrs for t in study.trials[3:])
    assert (study_dir / "trials" / "0001" / INTERRUPTED_RESULT).exists() or not (
        study_dir / "trials" / "0001" / "result.json"
    ).exists()


def test_sighup_mid_trial_writes_the_outputs_and_exits_129(tmp_path, space):
    study_dir = tmp_path / "s"
    search, stderr = stop_mid_trial_1(command(tmp_path, space), study_dir, signal.SIGHUP)
    assert search.returncode == 129, stderr
    assert "interrupted after 1 of 2 trials (SIGHUP); wrote" in stderr
    assert (study_dir / "report.html").is_file()
    assert [(r["number"], r["status"]) for r in rows(study_dir / "trials.csv")] == [
        ("0", "ok"),
        ("1", "interrupted"),
    ]


FAKE_SEARCH = (
    "import sys; from autotune.cli import main; from tests.conftest import fake_executor; "
    "sys.exit(main(sys.argv[2:], executor=fake_executor(sys.argv[1])))"
)
"""`autotune` with fake trials: `python -c FAKE_SEARCH MODE search ...`."""


def test_an_interrupted_search_says_so_in_every_output_and_report_exits_as_it_did(tmp_path, space):
    # The baseline measures at once; trial 1 sleeps until SIGTERM stops the search.
    mode = f"sequence:{tmp_path}:ok,sleep"
    argv = [sys.executable, "-c", FAKE_SEARCH, mode, *command(tmp_path, space)[3:]]
    argv[argv.index("n_trials=2")] = "n_trials=4"
    study_dir = tmp_path / "s"
    search = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    log = study_dir / "trials" / "0001" / "worker.log"
    deadline = time.monotonic() + SAFETY_NET_S
    try:
        while not (log.exists() and "fake worker: sleep" in log.read_text()):
            assert time.monotonic() < deadline and search.poll() is None, search.communicate()
            time.sleep(0.05)
        search.send_signal(signal.SIGTERM)
        _, stderr = search.communicate(timeout=SAFETY_NET_S)
    finally:
        if search.poll() is None:
            search.kill()
            search.wait()
    assert search.returncode == 143, stderr
    assert "interrupted after 1 of 4 trials (SIGTERM); wrote" in stderr
    assert "exit code 3" not in stderr
    table = rows(study_dir / "trials.csv")
    assert [(r["number"], r["status"]) for r in table] == [("0", "ok"), ("1", "interrupted")]
    assert table[1]["reason"] == "the search was interrupted (SIGTERM) while it ran"
    page = (study_dir / "report.html").read_text()
    assert "interrupted after 1 of 4 trials (SIGTERM)" in page and "exits with code 3" not in page

    report = subprocess.run(
        [sys.executable, "-m", "autotune", "report", str(study_dir)],
        capture_output=True,
        text=True,
        timeout=SAFETY_NET_S,
    )
    assert report.returncode == 143, report.stderr  # what the search exited with
    assert "the search was interrupted after 1 of 4 trials (SIGTERM)" in report.stdout
    assert "exit code 3" not in report.stdout
    assert "wrote" in report.stdout and "trials.csv" in report.stdout
    assert "report.html" in report.stdout
