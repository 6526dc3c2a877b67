"""One search per study folder at a time (parent side).

A second `autotune search` on a study that is being searched is most likely a mistake (the same
command run twice, in two terminals): it is refused, naming the one running. Sharing a study on
purpose is what `workers=N` and `autotune worker` are for; their worker processes do not take
this lock (the storage keeps them apart: `autotune.study.loop`).

The lock is an exclusive `flock` on `search.lock` in the study folder. The kernel drops it
when its holder's last descriptor closes, so it is released on any exit, kill -9 included, and
a lock whose process is gone is never in the way. The file names the holder (host, pid, start)
for the message a refused search prints.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
from pathlib import Path
from typing import Self

from autotune.common.errors import StudyError
from autotune.common.layout import LOCK_FILE


class StudyLock:
    """Held from `acquire` until `release` (or the process ends, however it ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, study_dir: Path, study_name: str, what: str = "search") -> Self:
        """The study folder's lock, for `autotune {what}` (named in the lock file, for whoever
        finds the study busy)."""
        path = study_dir / LOCK_FILE
        try:
            # Not inherited by child processes (PEP 446), so only this process holds it.
            # O_NOFOLLOW: the holder is written into the file, never through a planted link.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StudyError(
                    f"{path}: a symbolic link, not the lock file autotune makes; remove it if "
                    "you made it, else ask who did"
                ) from exc
            raise StudyError(f"cannot create {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, running = _describe_holder(fd)
            join = shlex.join(
                ["autotune", "worker", f"study={study_name}", f"out={study_dir.parent}"]
            )
            os.close(fd)
            if running != "search":  # a confirm or a verify: nothing to join
                raise StudyError(
                    f"study {study_name} is busy: `autotune {running}` runs on it right now "
                    f"({holder}); wait for it to end"
                ) from None
            raise StudyError(
                f"study {study_name} is being searched right now by {holder}. To add a "
                f"worker to it: {join}; else wait for it to end, or use another study= name "
                "or out= folder"
            ) from None
        holder = {
            "what": what,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no stale holder named in the file
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe_holder(fd: int) -> tuple[str, str]:
    """Who holds the lock, in words, and what it runs (`search`, `confirm`, `verify`)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        who = f"pid {holder['pid']} on host {holder['host']} (since {holder['since']})"
        return who, str(holder.get("what", "search"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "another process (it has not written its name yet)", "search"
