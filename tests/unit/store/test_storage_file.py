import contextlib
import sqlite3

import pytest

from autotune.store.storage_file import FileWatch, damage


def error_reading(db) -> sqlite3.Error:
    with contextlib.closing(sqlite3.connect(db, timeout=0)) as conn:
        with pytest.raises(sqlite3.Error) as raised:
            conn.execute("SELECT * FROM trials").fetchall()
    return raised.value


def test_damage_is_a_file_that_is_not_a_database_not_a_lock(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database " * 100)
    assert damage(RuntimeError("no cause")) is None
    wrapped = RuntimeError("Optuna's wrapper")
    wrapped.__cause__ = error_reading(garbage)
    assert damage(wrapped) == "file is not a database"

    locked = tmp_path / "locked.db"
    with contextlib.closing(sqlite3.connect(locked, isolation_level=None)) as holder:
        holder.execute("CREATE TABLE trials (x)")
        holder.execute("BEGIN EXCLUSIVE")
        assert damage(error_reading(locked)) is None  # database is locked: not damage


def test_a_watch_sees_its_file_deleted_or_replaced_and_nothing_else(tmp_path):
    db = tmp_path / "study.db"
    db.write_bytes(b"x")
    watch = FileWatch.of(f"sqlite:///{db}")
    with open(db, "rb"):  # as the search's SQLite connection holds it
        assert not watch.lost()
        db.write_bytes(b"written again in place")
        assert not watch.lost()
        db.unlink()
        assert watch.lost()
        db.write_bytes(b"another file at the same path")
        assert watch.lost()
    assert FileWatch.of("postgresql://db-host/autotune") is None
