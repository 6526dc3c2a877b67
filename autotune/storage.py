"""Where a study lives: opening its Optuna storage (under the study folder's lock) for a
search, or read-only for the report and the exports; every way that can fail, said plainly."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
import sqlalchemy.exc

from autotune.errors import StudyError
from autotune.plan import SearchPlan
from autotune.records import RUN_ATTR, RunInfo, is_recorded, store_run_info
from autotune.study import make_sampler
from autotune.study_lock import StudyLock
from autotune.units import format_bytes

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
# What makes a study what it is: a resumed study must have been made for the same.
IDENTITY = ("model", "task", "seq_len", "device", "space", "effective_batch_size")


@contextlib.contextmanager
def locked_study(plan: SearchPlan) -> Iterator[tuple[optuna.Study, SearchPlan]]:
    """The study, opened under the study folder's lock, and the plan with the stored budget.

    Refuses a study another search holds. A failure before the study opens leaves no trace: a
    study folder made by this call is removed again.
    """
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


def open_storage(url: str, *, shown: str | None = None) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage, or a StudyError that says why it cannot be opened."""
    shown = shown or f"storage={_safe_url(url)}"
    try:
        return optuna.storages.RDBStorage(_with_driver(url))
    except sqlalchemy.exc.OperationalError as exc:
        if "readonly database" in str(exc):
            # Opened read-only, Optuna found none of its tables and tried to create them.
            raise StudyError(
                f"{shown}: not an Optuna study storage (it has no study tables)"
            ) from exc
        raise StudyError(f"{shown}: cannot open it: {_first_line(exc.orig or exc)}") from exc
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        cause = exc.__cause__ or exc  # Optuna wraps a missing driver's ModuleNotFoundError
        if isinstance(cause, ModuleNotFoundError) and cause.name == "psycopg":
            raise StudyError(
                f"{shown}: cannot open it: the PostgreSQL driver psycopg is not installed; "
                'pip install "autotune[postgres]"'
            ) from exc
        raise StudyError(f"{shown}: cannot open it: {_first_line(cause)}") from exc


def _with_driver(url: str) -> str:
    """`postgresql://...` -> `postgresql+psycopg://...`, other URLs unchanged.

    SQLAlchemy reads a bare `postgresql://` as psycopg2; the `postgres` extra installs psycopg
    3, so the URL a PostgreSQL user already has works as it is. A named driver is kept."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme == "postgresql" else url


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _safe_url(url: str) -> str:
    """The URL with any password masked, for messages."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def open_study(plan: SearchPlan) -> tuple[optuna.Study, SearchPlan]:
    """Create the study, or load it when it exists and was made for the same run.

    The memory budget is part of a study: resolved once and stored, so that every trial's
    feasibility is judged against the same figure. A resumed study keeps its stored budget; an
    explicit `memory_budget=` that differs is refused.
    """
    storage = open_storage(plan.storage_url)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        load_if_exists=True,
    )
    if RUN_ATTR in study.user_attrs:  # an existing study: it must have been made for this run
        stored = RunInfo.of(study)
        made_for = {k: getattr(stored, k) for k in IDENTITY}
        wanted = {k: getattr(plan.info, k) for k in IDENTITY}
        if made_for != wanted:
            raise StudyError(
                f"study={plan.study_name} in {_safe_url(plan.storage_url)} was made for "
                f"{made_for}, not {wanted}; pick another study= name or out= folder"
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
        plan = dataclasses.replace(
            plan, info=dataclasses.replace(plan.info, memory_budget_bytes=budget)
        )
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time.
    recorded = sum(is_recorded(t) for t in study.get_trials(deepcopy=False))
    study.sampler = make_sampler(plan, seed=plan.config.seed + recorded)
    with warnings.catch_warnings():
        # Stable in practice since Optuna 3.2; it names the objectives in Optuna's own tools.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    store_run_info(study, plan.info)
    return study, plan


def load_study_dir(study_dir: Path, storage_url: str | None, name: str | None) -> optuna.Study:
    """A finished or running study, from its folder's study.db or another storage.

    SQLite files are opened read-only: reading a study never writes to it (Optuna would
    otherwise create its tables in any file it is pointed at)."""
    if storage_url is None:
        db = study_dir / "study.db"
        if not db.is_file():
            raise StudyError(f"{db}: no such file; give the study folder of a search, or storage=")
        storage_url = f"sqlite:///{db.resolve()}"
    shown = _safe_url(storage_url)
    storage = open_storage(_read_only(storage_url), shown=shown)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name is None:
        if len(names) != 1:
            raise StudyError(f"{shown} holds {len(names)} studies ({', '.join(names)}): "
                             "pick one with study=NAME")  # fmt: skip
        name = names[0]
    elif name not in names:
        raise StudyError(f"study={name} is not in {shown} (it has: {', '.join(names)})")
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
