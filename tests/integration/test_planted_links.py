"""A study folder someone else tampered with: links planted where a search writes (a trial's log,
the trials folder) and a folder others may write into are refused, and the files the links point
to are left as they were. Real searches, from the command line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
SPACE = """
device: any
knobs:
  batch_size: {choices: [8]}
  precision: fp32
  optim: sgd
"""


def search(tmp_path: Path) -> subprocess.CompletedProcess:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    command = [
        sys.executable, "-m", "autotune", "search", f"model={TINY_MODEL}", "seq_len=32",
        "warmup_steps=1", "measure_steps=2", "confirm_rounds=0", "n_trials=1",
        f"space={space}", f"out={tmp_path / 'out'}", "study=s",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_link_planted_at_a_trials_log_is_refused_and_its_target_left_alone(tmp_path, victim):
    trial = tmp_path / "out" / "s" / "trials" / "0000"
    trial.mkdir(parents=True)
    (trial / "worker.log").symlink_to(victim)
    done = search(tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{trial / 'worker.log'} is a link" in done.stderr
    assert "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n"


def test_a_trials_folder_that_is_a_link_is_refused_and_nothing_written_where_it_points(
    tmp_path, victim
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    study = tmp_path / "out" / "s"
    study.mkdir(parents=True)
    (study / "trials").symlink_to(elsewhere)
    done = search(tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{study / 'trials'} is a link" in done.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_study_folder_others_may_write_into_is_refused_before_anything_runs(tmp_path):
    study = tmp_path / "out" / "s"
    study.mkdir(parents=True)
    os.chmod(study, 0o777)
    done = search(tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{study} is writable by other users (mode 777)" in done.stderr
    assert "chmod o-w" in done.stderr
    assert not (study / "trials").exists()
    os.chmod(study, 0o755)
    assert search(tmp_path).returncode == 0, "once fixed, the same command runs"
