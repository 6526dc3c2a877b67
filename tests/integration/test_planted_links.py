"""A study folder someone else tampered with: links planted where a search writes (a trial's log,
the trials folder) and a folder others may write into are refused, and the files the links point
to are left as they were. Searches from the command line, their trials run through the real
executor by the stand-in worker."""

import os
from pathlib import Path

import optuna
import pytest

from autotune import cli
from autotune.store.records import interrupted_records
from tests.conftest import TINY_MODEL, fake_executor

pytestmark = pytest.mark.slow
SPACE = """
device: any
knobs:
  batch_size: {choices: [8]}
  precision: fp32
  optim: sgd
"""


def search(tmp_path: Path, capsys, stream: str = "err") -> tuple[int, str]:
    """The command line in this process, its trials run by the stand-in worker through the
    real executor (which makes the trial folders and opens their logs): exit code, stderr."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    argv = [
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "warmup_steps=1",
        "measure_steps=2",
        "confirm_rounds=0",
        "n_trials=1",
        f"space={space}",
        f"out={tmp_path / 'out'}",
        "study=s",
    ]
    capsys.readouterr()
    code = cli.main(argv, executor=fake_executor("ok"))
    return code, " ".join(getattr(capsys.readouterr(), stream).split())


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_link_planted_at_a_trials_log_is_refused_and_its_target_left_alone(
    tmp_path, victim, capsys
):
    trial = tmp_path / "out" / "s" / "trials" / "0000"
    trial.mkdir(parents=True)
    (trial / "worker.log").symlink_to(victim)
    code, err = search(tmp_path, capsys)
    assert code == 2, err
    assert f"{trial / 'worker.log'} is a link" in err
    assert victim.read_text() == "precious\n"
    # The refused trial is said to be refused, not interrupted, and once the link is gone a
    # later run trains its settings.
    storage = f"sqlite:///{tmp_path / 'out' / 's' / 'study.db'}"
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    (record,) = interrupted_records(trials)
    assert record.result.reason.startswith(f"refused before it ran: {trial / 'worker.log'}")
    (trial / "worker.log").unlink()
    code, out = search(tmp_path, capsys, stream="out")
    assert code == 0, out
    assert "trial 0 was refused (" in out and "interrupted" not in out, out
    assert victim.read_text() == "precious\n"


def test_a_trials_folder_that_is_a_link_is_refused_and_nothing_written_where_it_points(
    tmp_path, victim, capsys
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    study = tmp_path / "out" / "s"
    study.mkdir(parents=True)
    (study / "trials").symlink_to(elsewhere)
    code, err = search(tmp_path, capsys)
    assert code == 2, err
    assert f"{study / 'trials'} is a link" in err
    assert list(elsewhere.iterdir()) == []


def test_a_study_folder_others_may_write_into_is_refused_before_anything_runs(tmp_path, capsys):
    study = tmp_path / "out" / "s"
    study.mkdir(parents=True)
    os.chmod(study, 0o777)
    code, err = search(tmp_path, capsys)
    assert code == 2, err
    assert f"{study} is writable by other users (mode 777)" in err and "chmod o-w" in err
    assert not (study / "trials").exists()
    os.chmod(study, 0o755)
    assert search(tmp_path, capsys)[0] == 0, "once fixed, the same command runs"
