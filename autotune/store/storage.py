"""Where a study lives: its Optuna storage, opened for the processes that write it (a search
opens its study through `autotune.study.opening`) or read-only for the report and the exports;
every way that can fail, said plainly. Storage only stores: it settles nothing of the plan.

Several processes may write one study at once (`workers=N`, `autotune worker`), so every
storage a search opens is safe for that (`benchmarks/storages.py` measured the choices):

- SQLite (the default, `study.db`): WAL mode, a 30 s busy timeout, and each transaction started
  as `BEGIN IMMEDIATE`. Without the last, Optuna's read-then-write steps race: a queued trial
  was handed to two processes and results were overwritten.
- PostgreSQL (several hosts): row locks make those steps atomic; a connect timeout and a ping
  before reusing a pooled connection (idle through a long trial) are added.
- Stop signals: a Ctrl-C, SIGTERM or SIGHUP arriving during a storage call is raised when the
  call returns (`storage_shield`): raised inside SQLAlchemy's commit it kept SQLite's write
  lock held.
- Heartbeats: each running trial's search records one every `stale_after / 6` seconds; a
  RUNNING trial whose last one is older than `stale_after` is stale (its search died or its
  host was lost) and any other search fails it. The clock is the database server's.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import warnings
from pathlib import Path

import optuna
import sqlalchemy.exc

from autotune.common.errors import StudyError, first_line
from autotune.common.layout import STUDY_DB
from autotune.common.urls import safe_url
from autotune.store import storage_file
from autotune.store.storage_outage import RetryingRDBStorage, outage_retry_s
from autotune.store.storage_shield import ShieldedRDBStorage

SQLITE_BUSY_TIMEOUT_S = 30
"""How long a SQLite writer waits for another's transaction (they last milliseconds; a viewer
holding a read does not block writers in WAL mode)."""
POSTGRES_CONNECT_TIMEOUT_S = 10


def heartbeat_interval_s(stale_after_s: float) -> int:
    """Seconds between a running trial's heartbeats: six chances to beat before it is stale."""
    return max(1, int(stale_after_s // 6))


def open_storage(
    url: str, *, shown: str | None = None, stale_after_s: float | None = None
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage safe for several writing processes, or a StudyError that says why
    it cannot be opened. `stale_after_s` turns heartbeats on (a search's storage)."""
    shown = shown or f"storage={safe_url(url)}"
    _check_user_info(url, shown)
    url = _with_driver(url)
    options: dict = {}
    if stale_after_s is not None:
        options["heartbeat_interval"] = heartbeat_interval_s(stale_after_s)
        options["grace_period"] = math.ceil(stale_after_s)
    sqlite_file = storage_file.sqlite_file(url)
    try:
        if sqlite_file is not None:
            _use_wal(sqlite_file)
        storage = _storage(url, shown, options | _engine_options(url, sqlite_file))
        if sqlite_file is not None:
            # Every transaction takes the write lock when it begins, so Optuna's
            # read-then-write steps (hand out a queued trial, check a trial still runs before
            # writing to it) are atomic across processes, as row locks make them on PostgreSQL.
            # Not kept when a storage is pickled: each process opens its own.
            sqlalchemy.event.listen(storage.engine, "begin", _begin_immediate)
        if url.startswith("sqlite"):
            storage_file.refuse_damage(storage.engine, shown)
        return storage
    except sqlite3.Error as exc:
        _refuse_damaged(exc, shown)
        raise StudyError(f"{shown}: cannot open it: {first_line(exc)}") from exc
    except sqlalchemy.exc.OperationalError as exc:
        _refuse_damaged(exc, shown)
        if "readonly database" in str(exc):
            # Opened read-only, Optuna found none of its tables and tried to create them.
            raise StudyError(
                f"{shown}: not an Optuna study storage (it has no study tables)"
            ) from exc
        raise StudyError(f"{shown}: cannot open it: {first_line(exc.orig or exc)}") from exc
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        _refuse_damaged(exc, shown)
        cause = exc.__cause__ or exc  # Optuna wraps a missing driver's ModuleNotFoundError
        if isinstance(cause, ModuleNotFoundError) and cause.name == "psycopg":
            raise StudyError(
                f"{shown}: cannot open it: the PostgreSQL driver psycopg is not installed; "
                'pip install "autotune[postgres]"'
            ) from exc
        raise StudyError(f"{shown}: cannot open it: {first_line(cause)}") from exc


def _engine_options(url: str, sqlite_file: Path | None) -> dict:
    """SQLAlchemy's options for the storage's database: SQLite waits for a busy file, a
    server's connections are checked before use and give up connecting in time."""
    if sqlite_file is not None:
        # isolation_level=None: pysqlite issues no BEGIN of its own; `_begin_immediate` does.
        connect = {"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}
        return {"engine_kwargs": {"connect_args": connect}}
    if url.startswith("postgresql"):
        return {
            "engine_kwargs": {
                "pool_pre_ping": True,
                "connect_args": {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
            }
        }
    return {}


def _storage(url: str, shown: str, options: dict) -> optuna.storages.RDBStorage:
    """Optuna's storage, which waits out a server's outages (storage_outage); a SQLite file
    has none."""
    retry_s = None if url.startswith("sqlite") else outage_retry_s()
    with warnings.catch_warnings():  # heartbeats: "experimental" since Optuna 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        kind = ShieldedRDBStorage if retry_s is None else RetryingRDBStorage
        storage = kind(url, **options)
    storage.shown = shown
    if retry_s is not None:
        storage.retry_s = retry_s
    return storage


def _refuse_damaged(exc: BaseException, shown: str) -> None:
    if (words := storage_file.damage(exc)) is not None:
        raise storage_file.damaged(shown, words) from None


def _use_wal(path: Path) -> None:
    """Put the database file in WAL mode (stored in the file: every later connection uses it),
    so readers and the writer do not block each other. Creates an empty database file."""
    with contextlib.closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def write_back(url: str) -> None:
    """Copy what an SQLite study's write-ahead log holds into its file, at the end of a run
    that wrote to it, so that `study.db` alone holds every trial (a copy of it, `autotune
    report` elsewhere). SQLite does this itself when its last connection closes; while another
    process has the file open (optuna-dashboard, a notebook, a worker of the same study) it
    does not, and the last trials stay in `study.db-wal`. A passive checkpoint waits for
    nobody: a reader in the middle of a transaction keeps the frames it reads in the log, for
    the next run's write-back. Other storages, and a file that is gone, are left alone."""
    path = storage_file.sqlite_file(url)
    if path is None or not path.is_file():
        return
    with contextlib.suppress(sqlite3.Error):  # the data is safe in the log either way
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as conn:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _with_driver(url: str) -> str:
    """`postgresql://...` -> `postgresql+psycopg://...`, other URLs unchanged.

    SQLAlchemy reads a bare `postgresql://` as psycopg2; the `postgres` extra installs psycopg
    3, so the URL a PostgreSQL user already has works as it is. A named driver is kept."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme == "postgresql" else url


def _check_user_info(url: str, shown: str) -> None:
    """Refuse a URL whose user name or password holds an unencoded `@` (or what makes its port
    unreadable) before it reaches a driver: SQLAlchemy and libpq end the user info at its first
    `@`, so the rest of the password would become the host, and the driver's error would show
    it."""
    _, sep, rest = url.partition("://")
    if not sep or rest.startswith("/") or "@" not in rest:
        return
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return  # RDBStorage names the problem, without the URL
    except ValueError:  # an unreadable port, whose text may be part of the password
        misread = True
    else:
        misread = "@" in f"{parsed.host or ''}{parsed.database or ''}"
    if misread:
        raise StudyError(
            f"{shown}: cannot read its user name, password, host or port: a user name or "
            "password must write '@', ':', '/', '?' and '#' percent-encoded (%40, %3A, %2F, "
            "%3F, %23), as Python's urllib.parse.quote(password, safe='') does"
        )


def load_study_dir(study_dir: Path, storage_url: str | None, name: str | None) -> optuna.Study:
    """A finished or running study, from its folder's study.db or another storage.

    SQLite files are opened read-only: reading a study never writes to it (Optuna would
    otherwise create its tables in any file it is pointed at)."""
    if storage_url is None:
        db = study_dir / STUDY_DB
        if not db.is_file():
            raise StudyError(f"{db}: no such file; give the study folder of a search, or storage=")
        storage_url = f"sqlite:///{db.resolve()}"
    shown = safe_url(storage_url)
    try:
        return load_named(open_storage(_read_only(storage_url), shown=shown), name, shown)
    except json.JSONDecodeError as exc:  # optuna decodes each stored attribute itself
        raise StudyError(damaged(shown, exc, storage_url)) from exc


def damaged(shown: str, exc: json.JSONDecodeError, storage_url: str | None = None) -> str:
    """What a study whose storage holds an attribute that is not JSON is told: where it is
    (`undecodable`) when `storage_url` can be read for it."""
    places = undecodable(storage_url) if storage_url else []
    where = (
        f"{', '.join(places[:5])}{f' and {len(places) - 5} more' if len(places) > 5 else ''}"
        if places
        else "a trial's stored attribute"
    )
    verb = "are" if len(places) > 1 else "is"
    return (
        f"{shown}: {where} {verb} not JSON ({exc}): the study was changed outside autotune; "
        "rerun the search into another out= or study="
    )


_TRIALS_OF = "join trials t on a.trial_id = t.trial_id join studies s on t.study_id = s.study_id"
_STUDIES_OF = "join studies s on a.study_id = s.study_id"
_ATTRIBUTE_QUERIES = (
    # Optuna's RDB schema: each attribute table, its rows named by study (and trial number)
    f"select s.study_name, t.number, a.key, a.value_json from trial_user_attributes a {_TRIALS_OF}",
    f"select s.study_name, t.number, a.key, a.value_json from trial_system_attributes a "
    f"{_TRIALS_OF}",
    f"select s.study_name, null, a.key, a.value_json from study_user_attributes a {_STUDIES_OF}",
    f"select s.study_name, null, a.key, a.value_json from study_system_attributes a {_STUDIES_OF}",
)


def undecodable(storage_url: str) -> list[str]:
    """The attributes of an RDB storage that are not JSON, each as `study S trial N's KEY`
    (or `study S's KEY`), read from Optuna's tables directly: Optuna decodes them all at once
    and names none. [] where the storage cannot be read so."""
    try:
        engine = sqlalchemy.create_engine(_with_driver(_read_only(storage_url)))
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, StudyError):
        return []
    places: list[str] = []
    try:
        with engine.connect() as connection:
            for query in _ATTRIBUTE_QUERIES:
                for study, number, key, value in connection.execute(sqlalchemy.text(query)):
                    try:
                        json.loads(value)
                    except (TypeError, ValueError):
                        trial = f" trial {number}" if number is not None else ""
                        places.append(f"study {study}{trial}'s {key!r}")
    except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error):
        return []
    finally:
        engine.dispose()
    return places


def where_stored(study: optuna.Study) -> str:
    """Where `study` lives, for a message: its SQLite file, else its storage's URL with any
    password masked."""
    url = storage_url_of(study)
    if url is None:
        return "its storage"
    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        return parsed.database.removeprefix("file:")  # the read-only URI form's file, too
    return safe_url(url)


def storage_url_of(study: optuna.Study) -> str | None:
    """The URL of the RDB storage `study` was loaded from; None for another storage. (Optuna
    keeps it on the RDBStorage its cache wraps: no public accessor.)"""
    storage = getattr(study._storage, "_backend", study._storage)
    url = getattr(storage, "url", None)
    return url if isinstance(url, str) else None


def load_named(
    storage: optuna.storages.BaseStorage, name: str | None, shown: str, *, missing: str = ""
) -> optuna.Study:
    """Study `name` of the storage, or its only one when no name is given."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name is None:
        if len(names) != 1:
            raise StudyError(
                f"{shown} holds {len(names)} studies ({', '.join(names)}): pick one with study=NAME"
            )
        name = names[0]
    elif name not in names:
        raise StudyError(
            f"study={name} is not in {shown} (it has: {', '.join(names) or 'none'}){missing}"
        )
    return optuna.load_study(study_name=name, storage=storage)


def _read_only(url: str) -> str:
    """`sqlite:///path` -> SQLite's read-only URI form; other URLs unchanged."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return url  # open_storage names the problem
    if parsed.get_backend_name() != "sqlite" or parsed.query or not parsed.database:
        return url
    path = Path(parsed.database)
    if not path.is_file():
        raise StudyError(f"{path}: no such file")
    return f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"
