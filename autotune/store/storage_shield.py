"""A stop signal that arrives in the middle of a call to the study's storage waits until the
call has returned.

Ctrl-C, SIGTERM and SIGHUP raise an exception wherever the main thread is
(`autotune.study.interrupts`). Raised inside SQLAlchemy's commit, after SQLite's `BEGIN
IMMEDIATE` and before the `COMMIT`, it left the connection checked out with its transaction
open: the file's write lock stayed held by the search itself, so the interrupted trials could
not be recorded (by it, or by its workers) and writing the outputs failed after the 30 s busy
timeout ("database is locked"). Every call to a storage `open_storage` makes runs shielded: a
stop signal is held until the call returns and is raised then. A call waits at most the
storage's own timeouts (SQLite's busy timeout, a server's connect timeout); a server outage's
retries (`storage_outage`) pause outside the shield, where a stop signal acts at once.

Only the main thread is shielded: Python runs signal handlers there alone, and a heartbeat
thread's calls must not hold a signal meant for the main thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import optuna

_depth = 0
"""How many shielded calls the main thread is inside (a storage call may make others)."""
_held: BaseException | None = None
"""The stop signal's exception, held until the outermost shielded call returns."""


def hold(exc: BaseException) -> bool:
    """Hold `exc` (a stop signal's) until the storage call the main thread is in returns;
    False when it is in none and the caller raises it now."""
    global _held
    if _depth == 0:
        return False
    _held = _held or exc
    return True


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A storage call: a stop signal arriving in here is raised when it has returned."""
    global _depth, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _held is not None:  # before an error of the call's: it was asked
            held, _held = _held, None
            raise held


class ShieldedRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose every call to the database is shielded."""


def _shielded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: ShieldedRDBStorage, *args: Any, **kwargs: Any) -> Any:
        with shielded():
            return method(self, *args, **kwargs)

    return call


DATABASE_CALLS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
    "get_study_user_attrs", "get_study_system_attrs", "get_all_studies", "create_new_trial",
    "set_trial_param", "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id",
    "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
    "set_trial_user_attr", "set_trial_system_attr", "get_trial", "get_all_trials",
    "get_n_trials", "get_best_trial", "get_trial_params", "get_trial_user_attrs",
    "get_trial_system_attrs", "check_trial_is_updatable", "record_heartbeat",
    "get_current_version", "get_head_version", "get_all_versions", "upgrade",
    # What Optuna's cache in front of the storage calls directly:
    "_create_new_trial", "_set_trial_param", "_get_trials", "_get_best_trial_id",
    "_get_stale_trial_ids",
)  # fmt: skip
"""The storage's methods that reach the database; `test_storage_shield` checks that every
method Optuna's RDBStorage has is here or reaches none."""

for _name in DATABASE_CALLS:
    setattr(ShieldedRDBStorage, _name, _shielded(getattr(optuna.storages.RDBStorage, _name)))
