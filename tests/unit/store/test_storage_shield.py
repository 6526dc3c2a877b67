"""A stop signal during a call to the study's storage (autotune.store.storage_shield): raised
inside SQLAlchemy's commit it kept SQLite's write lock held; shielded, it is raised once the
call has returned, and the file is free."""

import inspect
import signal
import sqlite3
import threading

import optuna
import pytest
import sqlalchemy

from autotune.store import storage_shield
from autotune.store.storage import open_storage
from autotune.study.interrupts import SearchInterrupted, stop_signals

NO_DATABASE = {
    "_build_frozen_trial_from_trial_model", "_create_unique_study_name",
    "_fill_storage_url_template", "_get_prepared_new_trial", "_set_default_engine_kwargs_for_mysql",
    "_set_trial_attr_without_commit", "_set_trial_intermediate_value_without_commit",
    "_set_trial_param_without_commit", "_set_trial_value_without_commit",
    "get_heartbeat_interval", "get_failed_trial_callback", "get_heartbeat_stale_trial_callback",
    "remove_session",
}  # fmt: skip
"""RDBStorage's methods that open no session of their own (the `_without_commit` ones run in
the session of a shielded call)."""


def _study(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    return storage, optuna.create_study(storage=storage, study_name="s")._study_id


def _signal_in_the_next_commit(storage, event="commit"):
    """SIGINT to this process from inside SQLAlchemy's commit: after SQLite's BEGIN IMMEDIATE,
    before its COMMIT (where a Ctrl-C once landed); or at another of the engine's `event`s."""

    def send(*args):
        signal.raise_signal(signal.SIGINT)

    sqlalchemy.event.listen(storage.engine, event, send, once=True)


def _write_lock_free(tmp_path) -> bool:
    with sqlite3.connect(tmp_path / "study.db", timeout=0) as other:
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        other.execute("ROLLBACK")
    return True


def test_a_signal_inside_an_unshielded_commit_keeps_the_write_lock_held(tmp_path):
    """Why the shield is there: Optuna's own method, interrupted in its commit, leaves the
    connection's transaction open, and the file locked for every process."""
    storage, study_id = _study(tmp_path)
    _signal_in_the_next_commit(storage)
    with pytest.raises(SearchInterrupted) as raised, stop_signals():
        optuna.storages.RDBStorage.get_study_user_attrs(storage, study_id)
    assert not _write_lock_free(tmp_path)
    del raised  # its traceback holds the connection


def test_a_signal_inside_a_storage_call_is_raised_when_the_call_has_returned(tmp_path):
    storage, study_id = _study(tmp_path)
    storage.set_study_user_attr(study_id, "run", {"trials": 3})
    _signal_in_the_next_commit(storage)
    with pytest.raises(SearchInterrupted) as raised, stop_signals():
        storage.get_study_user_attrs(study_id)
    assert raised.value.signal_name == "SIGINT"
    assert _write_lock_free(tmp_path)
    # The storage goes on: the interrupted search writes its outputs from it.
    storage.set_study_user_attr(study_id, "end", "interrupted")
    assert storage.get_study_user_attrs(study_id) == {"run": {"trials": 3}, "end": "interrupted"}


def test_a_signal_held_through_a_failing_call_is_raised_instead_of_its_error(tmp_path):
    storage, _ = _study(tmp_path)
    _signal_in_the_next_commit(storage, "after_cursor_execute")  # its query, then its KeyError
    with pytest.raises(SearchInterrupted) as raised, stop_signals():
        storage.get_study_id_from_name("no such study")
    assert isinstance(raised.value.__context__, KeyError)
    assert _write_lock_free(tmp_path)


def test_a_call_in_another_thread_holds_no_signal_of_the_main_threads():
    inside, leave = threading.Event(), threading.Event()

    def call():
        with storage_shield.shielded():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=call)
    thread.start()
    inside.wait()
    try:
        assert storage_shield.hold(SearchInterrupted(signal.SIGINT)) is False
    finally:
        leave.set()
        thread.join()


def test_every_method_that_reaches_the_database_is_shielded():
    methods = {
        name
        for name, _ in inspect.getmembers(optuna.storages.RDBStorage, inspect.isfunction)
        if not name.startswith("__")
    }
    assert methods - NO_DATABASE == set(storage_shield.DATABASE_CALLS)
