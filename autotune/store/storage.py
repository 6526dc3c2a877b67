"""Where a study lives: opening its Optuna storage for a search (under the study folder's
lock), for a worker joining one, or read-only for the report and the exports; every way that
can fail, said plainly.

Several processes may write one study at once (`workers=N`, `autotune worker`), so every
storage a search opens is safe for that (`benchmarks/storages.py` measured the choices):

- SQLite (the default, `study.db`): WAL mode, a 30 s busy timeout, and each transaction started
  as `BEGIN IMMEDIATE`. Without the last, Optuna's read-then-write steps race: a queued trial
  was handed to two processes and results were overwritten.
- PostgreSQL (several hosts): row locks make those steps atomic; a connect timeout and a ping
  before reusing a pooled connection (idle through a long trial) are added.
- Heartbeats: each running trial's search records one every `stale_after / 6` seconds; a
  RUNNING trial whose last one is older than `stale_after` is stale (its search died or its
  host was lost) and any other search fails it. The clock is the database server's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RDBStorage

from autotune.common.errors import ConfigError, StudyError, first_line
from autotune.common.units import format_bytes
from autotune.plan import conditions
from autotune.plan.config import PER_PROCESS_SETTINGS, RunConfig, WorkerConfig, make_config
from autotune.plan.factory_trust import factory_to_run
from autotune.plan.plan import SearchPlan, fit_batches_to_budget
from autotune.search.study import enqueue_baseline, make_sampler
from autotune.store import storage_file
from autotune.store.records import RUN_ATTR, SETTINGS_ATTR, RunInfo, is_recorded, store_run_info
from autotune.store.storage_outage import RetryingRDBStorage, outage_retry_s
from autotune.store.study_lock import StudyLock

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
# What makes a study what it is: a resumed study must have been made for the same.
# (seq_len, steps, cores or GPU model: `conditions.changed_conditions`, checked first.)
IDENTITY = ("model", "task", "device", "space", "effective_batch_size",
            "data_fingerprint", "trainer_factory")  # fmt: skip


@contextlib.contextmanager
def locked_study(plan: SearchPlan) -> Iterator[tuple[optuna.Study, SearchPlan]]:
    """The study, opened under the study folder's lock, and the plan with the stored budget.

    Refuses a study another search holds. A failure before the study opens leaves no trace: a
    study folder made by this call is removed again, and so is an `out=` folder it made (when
    nothing else was put in it meanwhile).
    """
    missing = [p for p in (plan.study_dir, *plan.study_dir.parents) if not p.exists()]
    created = _make_study_dir(plan.study_dir)
    opened = False
    try:
        with StudyLock.acquire(plan.study_dir, plan.study_name):
            study, plan = open_study(plan)
            opened = True
            yield study, plan
    finally:
        if created and not opened:
            shutil.rmtree(plan.study_dir, ignore_errors=True)
            for folder in missing[1:]:  # innermost first; rmdir leaves one in use alone
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _make_study_dir(study_dir: Path) -> bool:
    """Create the study folder; True when it did not exist before."""
    try:
        study_dir.mkdir(parents=True)
    except FileExistsError:
        if study_dir.is_dir():
            return False  # made before, or a moment ago by a search started at the same time
        raise StudyError(
            f"cannot create the study folder {study_dir}: a file has its name"
        ) from None
    except OSError as exc:
        raise StudyError(
            f"cannot create the study folder {study_dir}: {exc.strerror}; "
            "check out= (it must be a folder this user can write)"
        ) from exc
    return True


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
            options["engine_kwargs"] = {
                # isolation_level=None: pysqlite issues no BEGIN of its own; ours below does.
                "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}
            }
        elif url.startswith("postgresql"):
            options["engine_kwargs"] = {
                "pool_pre_ping": True,
                "connect_args": {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
            }
        # A server's outages are waited out (storage_outage); a SQLite file has none.
        retry_s = None if url.startswith("sqlite") else outage_retry_s()
        with warnings.catch_warnings():  # heartbeats: "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            kind = RDBStorage if retry_s is None else RetryingRDBStorage
            storage = kind(url, **options)
            storage.shown = shown
            if retry_s is not None:
                storage.retry_s = retry_s
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


def _refuse_damaged(exc: BaseException, shown: str) -> None:
    if (words := storage_file.damage(exc)) is not None:
        raise storage_file.damaged(shown, words) from None


def _use_wal(path: Path) -> None:
    """Put the database file in WAL mode (stored in the file: every later connection uses it),
    so readers and the writer do not block each other. Creates an empty database file."""
    with contextlib.closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _with_driver(url: str) -> str:
    """`postgresql://...` -> `postgresql+psycopg://...`, other URLs unchanged.

    SQLAlchemy reads a bare `postgresql://` as psycopg2; the `postgres` extra installs psycopg
    3, so the URL a PostgreSQL user already has works as it is. A named driver is kept."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme == "postgresql" else url


MASK = "***"
# Query (or libpq key=value) settings that hold a secret: libpq's `password` and `sslpassword`,
# and what other dialects call theirs (`passwd`, `pwd`, tokens). Paths to files that hold one
# (`passfile`, `sslkey`) say nothing secret and are shown.
_SECRET_SETTING = re.compile(
    r"(?P<key>(?:^|[?&;\s])[\w.-]*(?:passw|pwd|secret|token|credential)[\w.-]*=)(?P<value>[^&;\s]*)",
    re.IGNORECASE,
)


def safe_url(url: str) -> str:
    """The URL as typed, with every credential masked, for messages: the password of its user
    info and secret query settings (`?password=`, `?sslpassword=`, ...).

    Not SQLAlchemy's `render_as_string(hide_password=True)`: it shows `?password=` as it is,
    and a password holding an unencoded `@` only up to that `@` (make_url splits there). The
    user info here runs to the URL's last `@`: a query value holding an `@` masks more than it
    needs to, never less."""
    url = _SECRET_SETTING.sub(lambda m: m["key"] + MASK, url)
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0 or rest.startswith("/"):  # no user info (sqlite:///path: a path)
        return url
    user, colon, _ = rest[:at].partition(":")
    return f"{scheme}://{user}{colon and ':' + MASK}{rest[at:]}"


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


def open_study(plan: SearchPlan, *, joining: bool = False) -> tuple[optuna.Study, SearchPlan]:
    """Create the study, or load it when it exists and was made for the same run.

    The memory budget is part of a study: resolved once and stored, so that every trial's
    feasibility is judged against the same figure. A resumed study keeps its stored budget; an
    explicit `memory_budget=` that differs is refused. A search stores its settings with the
    study, for workers that join it; a worker (`joining`) takes them as they are.
    """
    storage = open_storage(plan.storage_url, stale_after_s=plan.config.stale_after)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        load_if_exists=True,
    )
    if RUN_ATTR in study.user_attrs:  # an existing study: it must have been made for this run
        stored = RunInfo.of(study)
        # What the trials are measured under: a worker joining with other cores or another
        # GPU model is refused as a resume is.
        if changed := conditions.changed_conditions(stored, plan.info):
            raise StudyError(conditions.refusal(plan.study_name, changed))
        # A joining worker's own trainer= stands in for the study's (`join_config` checked it).
        identity = [k for k in IDENTITY if not (joining and k == "trainer_factory")]
        changed = [
            f"{k} {getattr(stored, k)} -> {getattr(plan.info, k)}"
            for k in identity
            if getattr(stored, k) != getattr(plan.info, k)
        ]
        if changed:
            # data_fingerprint covers the data files' bytes, the tokenizer, column and seq_len.
            raise StudyError(
                f"study={plan.study_name} in {safe_url(plan.storage_url)} was made for other "
                f"settings (the study's -> this run's): {', '.join(changed)}; pick another "
                "study= name or out= folder"
            )
        explicit = plan.config.memory_budget
        if explicit is not None and int(explicit) != stored.memory_budget_bytes:
            raise StudyError(
                f"memory_budget={format_bytes(int(explicit))}: study={plan.study_name} was "
                f"searched with a budget of {format_bytes(stored.memory_budget_bytes)}, and its "
                "trials were judged against it. Leave memory_budget out to resume with the "
                "stored one, or use another study= name for another budget"
            )
        budget = stored.memory_budget_bytes
        # The study's versions stay its own: trials run under others are marked (conditions).
        versions = stored.versions or plan.info.versions
        plan = dataclasses.replace(
            plan,
            info=dataclasses.replace(plan.info, memory_budget_bytes=budget, versions=versions),
        )
    plan = fit_batches_to_budget(plan)  # the budget is settled: drop what cannot fit
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time; a worker among several by its pid, so
    # that they do not all propose the same start-up points.
    recorded = sum(is_recorded(t) for t in study.get_trials(deepcopy=False))
    seed = plan.config.seed + recorded + (os.getpid() if joining else 0)
    study.sampler = make_sampler(plan, seed=seed % 2**32)
    if not joining:
        with warnings.catch_warnings():
            # Stable in practice since Optuna 3.2; it names the objectives in Optuna's tools.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(OBJECTIVES))
        store_run_info(study, plan.info)
        study.set_user_attr(SETTINGS_ATTR, study_settings(plan))
        # Queued before any worker starts, so that none of them queues it too.
        enqueue_baseline(study, plan.space.optuna_params(plan.baseline, plan.rules))
    return study, plan


def study_settings(plan: SearchPlan) -> dict[str, Any]:
    """The settings a worker joining the study takes from it (the rest are its own); the
    device as resolved (a worker on a host without the study's device is refused)."""
    settings = plan.config.model_dump(mode="json") | {"device": plan.device}
    return {k: v for k, v in settings.items() if k not in PER_PROCESS_SETTINGS}


def join_config(worker: WorkerConfig) -> RunConfig:
    """The settings of the study a worker joins (`autotune worker`), with the worker's own.

    The study must exist: a worker joins a search, it does not start one."""
    url = worker.storage
    if url is None:
        if worker.study is None:
            raise ConfigError("study: required when storage= is not given (the study folder "
                              "OUT/STUDY holds study.db)")  # fmt: skip
        db = worker.out / worker.study / "study.db"
        if not db.is_file():
            raise StudyError(f"{db}: no such file; start the study with autotune search, or "
                             "give its storage=")  # fmt: skip
        url = f"sqlite:///{db.resolve()}"
    shown = f"storage={safe_url(url)}"
    study = _load_named(open_storage(url, shown=shown), worker.study, shown,
                        missing="; start it with autotune search")  # fmt: skip
    name = study.study_name
    settings = study.user_attrs.get(SETTINGS_ATTR)
    if settings is None:
        raise StudyError(
            f"study={name} stores no search settings (it was made by an older autotune or by "
            "Optuna alone): resume it with autotune search"
        )
    stored_trainer = study.user_attrs.get(RUN_ATTR, {}).get("trainer")
    # Before anything imports it: the worker's own choice, or the very file the search checked.
    trainer = factory_to_run(stored_trainer, worker.trainer, Path.cwd(), name)
    own = worker.model_dump(exclude={"study", "storage", "trainer"})
    return make_config({**settings, **own, "study": name, "storage": url, "trainer": trainer})


def load_study_dir(study_dir: Path, storage_url: str | None, name: str | None) -> optuna.Study:
    """A finished or running study, from its folder's study.db or another storage.

    SQLite files are opened read-only: reading a study never writes to it (Optuna would
    otherwise create its tables in any file it is pointed at)."""
    if storage_url is None:
        db = study_dir / "study.db"
        if not db.is_file():
            raise StudyError(f"{db}: no such file; give the study folder of a search, or storage=")
        storage_url = f"sqlite:///{db.resolve()}"
    shown = safe_url(storage_url)
    return _load_named(open_storage(_read_only(storage_url), shown=shown), name, shown)


def _load_named(
    storage: optuna.storages.BaseStorage, name: str | None, shown: str, *, missing: str = ""
) -> optuna.Study:
    """Study `name` of the storage, or its only one when no name is given."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name is None:
        if len(names) != 1:
            raise StudyError(f"{shown} holds {len(names)} studies ({', '.join(names)}): "
                             "pick one with study=NAME")  # fmt: skip
        name = names[0]
    elif name not in names:
        raise StudyError(f"study={name} is not in {shown} (it has: {', '.join(names) or 'none'})"
                         f"{missing}")  # fmt: skip
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
