"""How a trial's worker process starts. `ForkserverLauncher` (the default) forks each trial
from a server that has torch and transformers imported but has never touched CUDA, so a trial
starts in a fraction of a second instead of paying ~7 s of imports. `CommandLauncher` runs any
command as `COMMAND SPEC RESULT` in a fresh process: the cold path, and the way tests plug in
fake workers."""

from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from pathlib import Path
from typing import Any, Protocol

from autotune.child.forked import forked_main
from autotune.common.output_files import open_log
from autotune.common.placement import Placement
from autotune.common.processes import die_with_parent
from autotune.execute.fork_servers import server_for

WORKER_COMMAND = (sys.executable, "-m", "autotune.child")
PRELOAD = (
    "autotune.child.fork_server_init",
    "torch",
    "transformers",
    "transformers.trainer",
    "autotune.child.worker",
)
"""What the fork server imports once, on a GPU as on a CPU. `fork_server_init` comes first: it
keeps the Trainer's import from initialising CUDA (`child/cuda_free.py` says how), which would
leave every forked trial without a GPU ("Cannot re-initialize CUDA in forked subprocess")."""


class Worker(Protocol):
    pid: int

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while running."""

    def reap(self) -> None:
        """Wait for the (killed or exited) worker so it leaves no zombie."""


class Launcher(Protocol):
    def ready(self, placement: Placement) -> None:
        """Get ready to start workers there at once (called before a trial's clock starts)."""

    def start(
        self, spec_path: Path, result_path: Path, log_path: Path, placement: Placement
    ) -> Worker:
        """A trial's worker process, on `placement`'s devices and cores."""


class _Popen:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def reap(self) -> None:
        self.proc.wait()


@dataclasses.dataclass(frozen=True)
class CommandLauncher:
    command: tuple[str, ...] = WORKER_COMMAND

    def ready(self, placement: Placement) -> None:
        pass  # every worker is a fresh process: nothing to prepare

    def start(
        self, spec_path: Path, result_path: Path, log_path: Path, placement: Placement
    ) -> Worker:
        def in_child() -> None:
            die_with_parent()
            placement.pin()

        with open(open_log(log_path), "wb") as log:
            proc = subprocess.Popen(
                [*self.command, str(spec_path), str(result_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=placement.environment(),
                # Its own session: a timeout kills its whole process group by id.
                start_new_session=True,
                preexec_fn=in_child,
            )
        return _Popen(proc)


class _Forked:
    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def reap(self) -> None:
        self.process.join()


class ForkserverLauncher:
    """Forks each trial from the fork server of its placement (`fork_servers.server_for`)."""

    def __init__(self) -> None:
        self._ready: set[Placement] = set()

    def ready(self, placement: Placement) -> None:
        """Start the placement's server and wait until it has imported PRELOAD (~7 s on 2 CPU
        cores).

        The first fork waits for those imports; done here, they are not charged to the first
        trial's `trial_timeout`."""
        if placement not in self._ready:
            _fork(placement, target=_nothing).join()
            self._ready.add(placement)

    def start(
        self, spec_path: Path, result_path: Path, log_path: Path, placement: Placement
    ) -> Worker:
        args = (str(spec_path), str(result_path), str(log_path))
        return _Forked(_fork(placement, target=forked_main, args=args))


_launching = threading.local()
"""The fork server a `_TrialProcess` being started asks (`_fork`): a process object is pickled
whole to its server, which a server (its lock) cannot be."""


def _fork(placement: Placement, **process: Any) -> _TrialProcess:
    """A started `_TrialProcess`, forked from the placement's server."""
    # Not a daemon: daemonic processes may not have children, and DataLoader workers are.
    started = _TrialProcess(**process)
    _launching.server = server_for(placement, list(PRELOAD))
    try:
        started.start()
    finally:
        _launching.server = None
    return started


_MAIN_MODULE_KEYS = ("init_main_from_path", "init_main_from_name")
"""What tells a fork-server child to import the parent's `__main__` before it runs."""


class _TrialProcess(context.ForkServerProcess):
    """A fork-server child that never imports the search's `__main__`.

    multiprocessing re-imports the parent's main module in each child (as `__mp_main__`) so
    that targets defined there can be unpickled. A trial's target is `forked_main`, found by
    its module's name, so nothing of `__main__` is needed; imported, a user's script without
    an `if __name__ == "__main__":` guard would start a search of its own in every trial, and
    `python - < script.py` would fail on a file named '<stdin>'."""

    @staticmethod
    def _Popen(process_obj: multiprocessing.process.BaseProcess) -> popen_forkserver.Popen:
        return _TrialPopen(process_obj)


class _TrialPopen(popen_forkserver.Popen):
    def _launch(self, process_obj: multiprocessing.process.BaseProcess) -> None:
        # CPython 3.11's own `_launch`, with the main module left out of the data.
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in _MAIN_MODULE_KEYS:
            prep_data.pop(key, None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = _launching.server.connect_to_new_process(self._fds)
        # The parent keeps a copy of the data pipe's write end, as CPython's does.
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def _nothing() -> None:
    """A process that only proves the fork server is up."""
