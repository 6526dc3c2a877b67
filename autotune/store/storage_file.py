"""The study's SQLite file (the default storage, `study.db`) when it is not what it was: damaged
(truncated, overwritten, not a database at all), or deleted or replaced while a search runs.
Each is said once, naming the file, as a StudyError; none may pass for an empty study.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from pathlib import Path

import sqlalchemy

from autotune.common.errors import StudyError

STUDY_FILE_LOST_EXIT_CODE = 74
"""`autotune search` and `autotune worker` exit with this (sysexits' EX_IOERR, beside the
storage outage's 75) when the study's SQLite file was deleted or replaced under them: the
outputs hold what was read, but nothing can resume the study."""


class StudyFileDamaged(StudyError):
    """The study's SQLite file is not a database, or is damaged."""


class StudyFileLost(StudyError):
    """The study's SQLite file was deleted or replaced while a search used it."""

    paths: list[Path]
    """The outputs written from what the search had read (set by the search that stopped)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.paths = []


def sqlite_file(url: str) -> Path | None:
    """The database file of a `sqlite:///path` URL opened for writing; None for other URLs,
    in-memory databases and SQLite's URI form (the read-only one)."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None  # RDBStorage names the problem
    if parsed.get_backend_name() != "sqlite" or parsed.query:
        return None
    if not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def damage(exc: BaseException) -> str | None:
    """SQLite's words when an error (or one it was raised from) says the file is not a
    database or is damaged; None for any other error (a lock, a full disk, a bug)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.DatabaseError) and (
            (getattr(seen, "sqlite_errorname", None) or "").startswith(
                ("SQLITE_CORRUPT", "SQLITE_NOTADB")
            )
            # Python's sqlite3 says so itself for bytes that are no longer text.
            or str(seen).startswith("Could not decode to UTF-8")
        ):
            return str(seen).splitlines()[0].split(" with text ")[0]  # not the garbage
        seen = seen.__cause__ or seen.__context__
    return None


def damaged(shown: str, words: str) -> StudyFileDamaged:
    return StudyFileDamaged(
        f"{shown}: not an SQLite database, or damaged ({words}); restore it from a copy, or "
        "start the study afresh under another study= name or out= folder"
    )


def refuse_damage(engine: sqlalchemy.engine.Engine, shown: str) -> None:
    """Make every read or write that meets a damaged file raise one StudyFileDamaged naming
    it, instead of the driver's error wrapped by SQLAlchemy and again by Optuna (tracebacks
    chained six deep). SQLAlchemy's `handle_error` event is the documented way to replace
    the exception a statement raises."""

    def refuse(context: sqlalchemy.engine.ExceptionContext) -> None:
        words = damage(context.original_exception)
        if words is not None:
            raise damaged(shown, words) from None

    sqlalchemy.event.listen(engine, "handle_error", refuse)


@dataclasses.dataclass(frozen=True, slots=True)
class FileWatch:
    """Tells whether a study file is still the one a search opened. SQLite keeps using a
    deleted file (its open handle holds the data) without a word, and a new file at the same
    path is another, empty study: either way the study on disk is lost. The inode number tells
    them apart: the search's own connection keeps the deleted file's inode, so no new file can
    be given its number meanwhile."""

    path: Path
    identity: tuple[int, int] | None

    @classmethod
    def of(cls, url: str) -> FileWatch | None:
        """A watch on a storage URL's SQLite file; None for a database server."""
        path = sqlite_file(url)
        return None if path is None else cls(path, _identity(path))

    def lost(self) -> bool:
        return _identity(self.path) != self.identity

    def error(self, done: int) -> StudyFileLost:
        return StudyFileLost(
            f"{self.path} was deleted or replaced while the search ran: it stopped after its "
            f"running trial, with {done} trial(s) read, but the study itself is gone and "
            "nothing can resume it (a search started again begins from nothing)"
        )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino
