"""The study's SQLite file (`study.db`) damaged before a search or a report reads it, and
deleted while a search runs: one message naming the file, never tracebacks, and a deleted study
never passes for a finished one. Through the real command line, with a stand-in worker."""

import contextlib
import csv
import sqlite3
import threading
import time

import optuna
import pytest

from autotune import cli
from autotune.store.records import SETTINGS_ATTR
from autotune.store.storage_file import STUDY_FILE_LOST_EXIT_CODE
from tests.conftest import TINY_MODEL, fake_executor

pytestmark = pytest.mark.usefixtures("probe_once")
SAFETY_NET_S = 300


def search(out, mode: str, *overrides: str) -> int:
    return cli.main(
        [
            "search",
            f"model={TINY_MODEL}",
            "seq_len=32",
            f"out={out}",
            "study=s",
            "confirm_rounds=0",
            *overrides,
        ],
        executor=fake_executor(mode),
    )


def overwrite_a_result(db) -> None:
    """Garbage over the bytes of a stored trial result, past the pages the study opens with:
    the file opens, its trials cannot be read (before: six chained tracebacks)."""
    data = bytearray(db.read_bytes())
    at = data.index(b'{"status": "ok"')
    data[at + 2 : at + 40] = b"\xff" * 38
    db.write_bytes(bytes(data))


def truncate(db) -> None:
    with open(db, "r+b") as file:  # as `truncate -s 100 study.db`
        file.truncate(100)


@pytest.mark.parametrize("damage", [overwrite_a_result, truncate])
def test_a_damaged_study_file_is_one_message_for_report_and_resume(tmp_path, capsys, damage):
    assert search(tmp_path, "ok", "n_trials=2") == 0
    db = tmp_path / "s" / "study.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:  # all in the file, as once closed
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damage(db)
    capsys.readouterr()
    for argv in (
        ["report", str(tmp_path / "s")],
        ["search", f"model={TINY_MODEL}", "seq_len=32", f"out={tmp_path}", "study=s", "n_trials=3"],
    ):
        assert cli.main(argv, executor=fake_executor("ok")) == 2, argv[0]
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.count("error:") == 1, err
        assert f"{db}: not an SQLite database, or damaged (" in err, err


def test_a_study_file_deleted_mid_search_stops_it_and_says_nothing_can_resume(tmp_path, capsys):
    """`rm study.db` while trial 1 runs: SQLite goes on with the deleted file without a word.
    The search warns while the trial runs, stops when it ends, writes the outputs of what it
    had read, and exits 74 saying the study is gone; no new study.db appears."""
    study_dir = tmp_path / "s"
    db = study_dir / "study.db"
    deleted = threading.Event()

    def delete_during_trial_1() -> None:
        deadline = time.monotonic() + SAFETY_NET_S
        while not (study_dir / "trials" / "0001" / "progress.json").exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        db.unlink()
        deleted.set()

    thread = threading.Thread(target=delete_during_trial_1, daemon=True)
    thread.start()
    # `progress` trials take about 2.5 s (25 steps of 0.1 s), writing progress as they go.
    code = search(tmp_path, "progress", "n_trials=6", "warmup_steps=5", "measure_steps=20")
    thread.join()
    assert deleted.is_set()
    out, err = capsys.readouterr()
    assert code == STUDY_FILE_LOST_EXIT_CODE, out[-2000:] + err[-2000:]
    assert f"warning: {db} was deleted or replaced: this search stops when trial 1 ends" in out
    assert f"error: {db} was deleted or replaced while the search ran" in err
    assert "nothing can resume it" in err and f"wrote {study_dir / 'trials.csv'}" in err
    assert "Traceback" not in err
    with open(study_dir / "trials.csv") as file:
        numbers = [int(row["number"]) for row in csv.DictReader(file)]
    assert numbers[:2] == [0, 1] and len(numbers) < 6, "stopped after the running trial"
    assert not db.exists()


@pytest.mark.parametrize("then", ["search", "worker"])
def test_a_run_ends_with_every_trial_in_the_file_while_another_reader_holds_it(tmp_path, then):
    """SQLite moves its write-ahead log into the file when the last connection closes; while
    another one is open (optuna-dashboard, a notebook) it does not, and a copy of study.db
    alone lacked the trials of the latest run: a resumed search's, or a joining worker's."""
    assert search(tmp_path, "ok", "n_trials=2") == 0
    db = tmp_path / "s" / "study.db"
    if then == "worker":  # the study asks for 4 trials: a worker joins to run the other two
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
        study.set_user_attr(SETTINGS_ATTR, study.user_attrs[SETTINGS_ATTR] | {"n_trials": 4})
        del study
    with contextlib.closing(sqlite3.connect(db)) as dashboard:
        dashboard.execute("SELECT count(*) FROM trials").fetchall()  # open, as a viewer keeps it
        if then == "search":
            assert search(tmp_path, "ok", "n_trials=4") == 0
        else:
            worker = ["worker", f"out={tmp_path}", "study=s"]
            assert cli.main(worker, executor=fake_executor("ok")) == 0
        copy = tmp_path / "copy.db"
        copy.write_bytes(db.read_bytes())  # the file alone, no study.db-wal beside it
        with contextlib.closing(sqlite3.connect(copy)) as alone:
            states = alone.execute("SELECT state FROM trials").fetchall()
        assert states == [("COMPLETE",)] * 4
