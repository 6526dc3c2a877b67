"""Where a trial's temporary files go: a folder of its own inside the trial's folder, removed
with it (multiprocessing's sockets too, in a short folder where that one is too deep)."""

from __future__ import annotations

import contextlib
import getpass
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from autotune.common.layout import TRIAL_TEMP_PREFIX
from autotune.common.socket_folders import SOCKET_FOLDER_CHARS, short_folder


def _user_name() -> str:
    """As torch names its default compile cache (`torchinductor_<user>`)."""
    try:
        return re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):
        return f"uid_{os.getuid()}"


@contextlib.contextmanager
def temporary_files_in(trial_dir: Path) -> Iterator[None]:
    """Every temporary file of this process, and of the processes it starts, in a new folder
    inside `trial_dir`, removed when the trial ends.

    Nothing of a trial lands in the system's temp folder: a worker killed at its timeout
    (SIGKILL: none of its code runs) leaves its Trainer's output folder and its DataLoader
    workers' sockets among the trial's own files, not as `autotune-trainer-*` and `pymp-*`
    folders in $TMPDIR that nothing removes."""
    system = tempfile.gettempdir()
    folder = tempfile.mkdtemp(dir=trial_dir, prefix=TRIAL_TEMP_PREFIX)
    # multiprocessing keeps the folder of its sockets in the process's config, copied from the
    # parent: forked from the fork server, the search's own `pymp-*` folder in $TMPDIR. Its
    # sockets (a DataLoader worker hands tensors over one) need a path of at most 107 bytes:
    # a deep study folder gets a short folder of the system's instead, removed as well.
    sockets = folder if len(folder) <= SOCKET_FOLDER_CHARS else short_folder(system) or folder
    config = multiprocessing.current_process()._config
    before = tempfile.tempdir, os.environ.get("TMPDIR"), config.get("tempdir")
    # torch.compile's cache stays where it was (torch derives it from the temp folder): a
    # trial without a study's cache (`compile_cache_dir`) reuses what earlier ones compiled.
    cache = "TORCHINDUCTOR_CACHE_DIR"
    kept_cache = cache in os.environ
    os.environ.setdefault(cache, os.path.join(system, f"torchinductor_{_user_name()}"))
    tempfile.tempdir = folder  # this process and what it forks (DataLoader workers, ranks)
    os.environ["TMPDIR"] = folder  # the programs it runs (compilers, a factory's subprocesses)
    config["tempdir"] = sockets
    try:
        yield
    finally:
        # What cannot be removed stays in the trial's folder; the result is written already.
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)
        tempfile.tempdir, environ, config["tempdir"] = before
        if not kept_cache:
            os.environ.pop(cache, None)
        if environ is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = environ
