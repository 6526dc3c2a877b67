"""A database server that goes away during a search (restarted, failed over, cut off).

Each call to the study's storage is retried while the server does not answer, with a growing
pause, for up to `OUTAGE_RETRY_S` in all; a restart or a fail-over fits in that. Past it the
search stops with one `StorageUnavailable` naming the server, and from then on the storage
answers reads from the last answers it had, so that the outputs of the trials finished so far
are written from what was read. The study itself is intact: the same command resumes it once
the server is back (a trial that was running is run again).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
from collections.abc import Callable
from typing import Any

import optuna
import sqlalchemy.exc

from autotune.common.errors import ConfigError, StudyError, first_line
from autotune.store.storage_shield import ShieldedRDBStorage

OUTAGE_RETRY_S = 60.0
"""How long a search waits in all for a database server that does not answer, unless
`$AUTOTUNE_STORAGE_RETRY_S` says otherwise (`outage_retry_s`)."""
RETRY_ENV = "AUTOTUNE_STORAGE_RETRY_S"
FIRST_PAUSE_S = 0.5
"""The first pause between two tries; each pause doubles, up to MAX_PAUSE_S."""
MAX_PAUSE_S = 8.0
OUTAGE_EXIT_CODE = 75
"""`autotune search` and `autotune worker` exit with this (sysexits' EX_TEMPFAIL: try again
later) when the storage server stayed away: the same command resumes the study."""

_READS = ("get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
          "get_study_id_from_name", "get_study_name_from_id", "get_all_studies", "get_trial",
          "get_trial_id_from_study_id_trial_number")  # fmt: skip
"""Reads whose last answer is kept, to write the outputs from once the server is gone."""
_TRIALS = "_get_trials"
"""Optuna's cache in front of this storage keeps the trials it read, and asks here only for
what changed since: once the server is gone, nothing has, as far as this process can know."""
_OTHERS = ("create_new_study", "set_study_user_attr", "set_study_system_attr",
           "_create_new_trial", "_set_trial_param", "set_trial_state_values",
           "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
           "_get_best_trial_id", "_get_stale_trial_ids")  # fmt: skip
# Not retried: record_heartbeat (a missed beat is harmless, the next one goes on; retrying it
# would hold the heartbeat thread, and the trial's end that waits for it).


class StorageUnavailable(StudyError):
    """The study's database server did not answer for `outage_retry_s()`."""


def outage_retry_s() -> float:
    """How long to wait out an outage: `$AUTOTUNE_STORAGE_RETRY_S` seconds (a cluster whose
    database fails over in longer than a minute sets it higher), else OUTAGE_RETRY_S."""
    given = os.environ.get(RETRY_ENV)
    if given is None:
        return OUTAGE_RETRY_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{RETRY_ENV}={given!r}: expected a number of seconds, 0 or more")
    return seconds


def is_disconnect(exc: BaseException) -> bool:
    """Whether an error (Optuna wraps SQLAlchemy's in StorageInternalError) says the server
    could not be reached or dropped the connection, rather than refusing what was sent."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RetryingRDBStorage(ShieldedRDBStorage):
    """Optuna's RDB storage whose calls wait out a server outage (a server, not SQLite: a
    file has no outage to wait for). `shown` names the server in messages (credentials
    masked). Each try is shielded from stop signals, the pauses between them are not."""

    shown: str = "storage"
    retry_s: float = OUTAGE_RETRY_S
    """How long to wait out an outage: `open_storage` sets it once (`outage_retry_s`)."""
    _gone: BaseException | None = None
    _last: dict[tuple[str, str], Any]

    def _call(self, name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        key = (name, repr((args, {k: v for k, v in kwargs.items() if k != "deepcopy"})))
        last = self.__dict__.setdefault("_last", {})
        started, pause_s = time.monotonic(), FIRST_PAUSE_S
        if self._gone is not None:  # given up before: what was read stands for the study
            if name == _TRIALS:
                return []
            if key in last:
                return copy.deepcopy(last[key])  # callers may change what they are given
        while self._gone is None:
            try:
                answer = method(self, *args, **kwargs)
            except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
                if not is_disconnect(exc):
                    raise
                if time.monotonic() - started + pause_s > self.retry_s:
                    self._gone = exc
                    break
                time.sleep(pause_s)
                pause_s = min(2 * pause_s, MAX_PAUSE_S)
                continue
            if name in _READS:
                last[key] = answer
            elif name in ("set_study_user_attr", "set_study_system_attr"):
                # What this process wrote is part of what it last read (its run's settings).
                study_id, attr, value = args
                read = last.get((name.replace("set_", "get_") + "s", repr(((study_id,), {}))))
                if read is not None:
                    read[attr] = value
            return answer
        raise StorageUnavailable(
            f"{self.shown}: the database server did not answer for {self.retry_s:.0f} s "
            f"({_driver_error(self._gone)}). The study keeps every trial finished so far; start "
            "the server again (or check the network) and run the same command to resume it"
        ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for own in ("_last", "_gone"):
            state.pop(own, None)  # another process reads for itself
        return state


def _retrying(name: str) -> Callable[..., Any]:
    method = getattr(ShieldedRDBStorage, name)

    @functools.wraps(method)
    def call(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, method, *args, **kwargs)

    return call


for _name in (*_READS, _TRIALS, *_OTHERS):
    setattr(RetryingRDBStorage, _name, _retrying(_name))


def _driver_error(exc: BaseException) -> str:
    """The driver's words, not Optuna's wrapper's, in one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return first_line(exc)
