"""How autotune writes a file it leaves behind (both sides: the search's outputs, a trial's spec,
progress and result, the software cache): whole or not at all, never through a link, and only
in a study folder of this user's own.

A file is written to a new temp file in its folder, synced, then renamed over its name. A
reader sees the old file or the new one; a full disk or a lost permission leaves the old one
as it was (never a 0-byte trials.csv or half a report.html). The temp file is created with
O_CREAT|O_EXCL|O_NOFOLLOW (`tempfile.mkstemp`), so a link planted under its name is refused,
and the rename replaces a link at the target's name itself, leaving the file it pointed to
untouched.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

from autotune.common.errors import StudyError, UnsafePath

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""A full disk, a full quota, or a file size limit (RLIMIT_FSIZE): said with the figures."""


def write_atomic(
    path: Path, content: str | bytes, *, fsync: bool = True, mode: int = 0o644
) -> Path:
    """Write `content` (text as UTF-8) to `path` atomically; returns `path`.

    `fsync` also makes the file, and its name, survive a machine crash: outputs and results
    need that, a record read only while its trial runs does not. Raises a StudyError naming
    the path (and, for a full disk, the bytes needed and free) and leaves no temp file."""
    data = content.encode() if isinstance(content, str) else content
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _write_error(path, len(data), exc) from exc
    try:
        try:
            os.fchmod(fd, mode)  # mkstemp makes 0600; outputs are ordinary files
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise _write_error(path, len(data), exc) from exc
    except BaseException:
        os.unlink(tmp)
        raise
    if fsync:
        _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (ext4 and xfs may otherwise lose it in a crash)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot sync a folder: nothing to do
            raise
    finally:
        os.close(fd)


def _write_error(path: Path, size_bytes: int, exc: OSError) -> StudyError:
    why = exc.strerror or str(exc)
    if exc.errno in NO_SPACE:
        try:  # exact bytes: outputs range from a few hundred bytes to megabytes
            free = f"{shutil.disk_usage(path.parent).free:,} bytes"
        except OSError:
            free = "an unknown number of bytes"
        return StudyError(
            f"cannot write {path}: {why} (it needs {size_bytes:,} bytes, {free} free); "
            "the previous file, if any, is kept. Free some space (or raise the quota) and run "
            "again; `autotune report` rewrites a study's outputs from its storage"
        )
    return StudyError(
        f"cannot write {path}: {why}; the previous file, if any, is kept. Check that the "
        "folder is this user's and writable"
    )


def check_owner(folder: Path) -> None:
    """Refuse an existing study folder that another user owns or may write into, before
    anything is written into it.

    Whoever can write into a folder can plant links and files in it at any moment, and a
    search trusts what its study folder holds: trials read the data cache there, worker
    processes run the command their spec there names, and logs are written there."""
    try:
        info = folder.stat()
    except OSError:
        return  # none yet: made by this process, as this user (or its making says why not)
    _refuse_unsafe(folder, info)


def make_folder(folder: Path, root: Path) -> Path:
    """Create `folder` (and what is missing of it) inside the study folder `root`, each part
    from `root` down checked as it is met: a real folder (not a link), this user's, and not
    writable by others. Nobody else can then put a link on the way to what autotune writes in
    it; a file there is still opened without following a link (`open_log`, `write_atomic`).
    Raises a StudyError naming the part refused."""
    _refuse_unsafe(root, root.stat())
    current = root
    for part in folder.relative_to(root).parts:
        current = current / part
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _write_error(current, 0, exc) from exc
        _refuse_unsafe(current, os.lstat(current))
    return folder


def open_log(path: Path, *, append: bool = False, read: bool = False) -> int:
    """A file descriptor for writing a log at `path` (and reading it back: `read`), created if
    missing, emptied unless `append`, never through a link planted at its name (O_NOFOLLOW).
    Raises a StudyError."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_TRUNC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(
                f"{path} is a link: autotune does not write through links in a study folder "
                "(someone may have planted it to have a file of yours overwritten). Remove it "
                "and run again"
            ) from None
        raise _write_error(path, 0, exc) from exc


def _refuse_unsafe(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePath(
            f"{path} is a link: autotune does not write through links in a study folder "
            "(someone may have planted it to have a file of yours overwritten). Remove it and "
            "run again"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise StudyError(f"cannot use {path} as a folder: it is not one")
    if info.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} is owned by {_user(info.st_uid)}, not by this user "
            f"({_user(os.geteuid())}): its owner could replace what autotune writes and runs "
            "there. Use an out= folder of your own"
        )
    if info.st_mode & stat.S_IWOTH:
        raise UnsafePath(
            f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}): any of "
            "them could plant a link there for autotune to write through. Run `chmod o-w "
            f"{path}`, or use an out= folder of your own"
        )


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
