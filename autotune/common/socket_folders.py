"""The folder of a process's multiprocessing sockets in the system's temp folder (the search's
fork server listener; a trial's DataLoader sockets where its trial folder is too deep for a
socket's path), and the removal of those whose process died without removing them.

multiprocessing makes a `pymp-*` folder for them and removes it at exit; a search killed with
SIGKILL (an OOM killer, `kill -9`, a scheduler's hard stop) runs no exit code, and the folder
stayed in $TMPDIR forever. Here the folder is `autotune-mp-<pid>-*` and holds a lock file that
its process keeps locked (`flock`) for its life; the kernel drops the lock when the process
ends, however it ends. The next process to make its folder removes every one of this user's
whose lock it can take. A lock, not the pid: another container or pid namespace sharing the
temp folder may run a process under the same number.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import shutil
import tempfile
from multiprocessing import util
from pathlib import Path

from autotune.common.layout import SOCKET_FOLDER_PREFIX, socket_folder_prefix

SOCKET_FOLDER_CHARS = 80
"""The longest folder multiprocessing's sockets go in: an AF_UNIX path holds 107 bytes, and a
socket's own name (`/listener-XXXXXXXX`) takes 18 of them."""
OWNER_FILE = ".owner"
"""The lock file in each folder: locked while its process lives."""

_owned: list[int] = []
"""The lock files' descriptors, open (and locked) for the life of this process."""


def claim() -> str:
    """This process's multiprocessing temp folder: one of its own, locked, made on the first
    call (removed at exit as multiprocessing removes its own), after removing the folders of
    processes that died. A folder multiprocessing already made is kept."""
    config = multiprocessing.current_process()._config
    if config.get("tempdir") is not None:
        return config["tempdir"]
    for base in _bases(tempfile.gettempdir()):
        remove_abandoned(Path(base))
    folder = short_folder(tempfile.gettempdir())
    if folder is None:  # no temp folder leaves room for a socket's path: as multiprocessing
        return util.get_temp_dir()
    # As multiprocessing's own get_temp_dir: removed at exit, after the processes it started.
    util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
    config["tempdir"] = folder
    return folder


def _bases(system: str) -> list[str]:
    return list(dict.fromkeys((system, "/tmp", "/var/tmp")))


def short_folder(system: str) -> str | None:
    """A new folder for this process's sockets under the system's temp folder, or /tmp, or
    /var/tmp: the first whose path leaves room for a socket's name; None where none does."""
    for base in _bases(system):
        if len(base) + len(f"/{socket_folder_prefix(os.getpid())}XXXXXXXX") <= SOCKET_FOLDER_CHARS:
            if os.access(base, os.W_OK):
                folder = tempfile.mkdtemp(dir=base, prefix=socket_folder_prefix(os.getpid()))
                _lock(Path(folder))
                return folder
    return None


def _lock(folder: Path) -> None:
    """Lock the folder's owner file for the life of this process (and of what it forks)."""
    owner = os.open(folder / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _owned.append(owner)


def remove_abandoned(base: Path) -> list[Path]:
    """Remove this user's socket folders under `base` whose process has ended (its lock can
    be taken); returns them. A folder without a lock file is left (another autotune's)."""
    removed = []
    for folder in base.glob(f"{SOCKET_FOLDER_PREFIX}*"):
        lock = folder / OWNER_FILE
        try:
            if folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, another user's, or no lock file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its process lives
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
