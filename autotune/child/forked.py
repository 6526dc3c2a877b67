"""The first code a trial forked from the fork server runs (`runner.ForkserverLauncher`): it
cuts the trial loose from the server, then runs the worker. Imported by the search process,
which hands `forked_main` to multiprocessing by reference, so it imports nothing heavy at
import time: the worker (torch, transformers) is imported here only in the forked child, where
the server has preloaded it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

from autotune.common.processes import die_with_parent


def forked_main(spec_path: str, result_path: str, log_path: str) -> None:
    """Runs in the forked trial process: `python -m autotune.child` as a fork."""
    # The fork server's SIGTERM handler (fork_server_init) is not the worker's.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()  # its own session and process group, as with CommandLauncher
    # multiprocessing hands every forked child the write end of the server's "alive" pipe (so
    # that children may start processes of their own); the server exits only when every copy
    # is closed. Kept here, a search killed with -9 would leave the server, and so this
    # worker, running to the end of the trial.
    from multiprocessing import forkserver

    alive_fd = forkserver._forkserver._forkserver_alive_fd
    if alive_fd is not None:
        os.close(alive_fd)
        forkserver._forkserver._forkserver_alive_fd = None
    die_with_parent()  # the parent is the fork server, which now exits with the search
    # A forked child inherits the server's start method; DataLoader workers started through a
    # fork server of this worker's own would hold its alive pipe and outlive everything. Fork
    # them, as a worker started by CommandLauncher does, so they die with this process.
    multiprocessing.set_start_method("fork", force=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    for fd in (1, 2):
        os.dup2(log_fd, fd)
    started_s = time.perf_counter()
    from autotune.child import worker  # preloaded by the server: nothing left to import

    sys.exit(worker.main([spec_path, result_path], imports_s=time.perf_counter() - started_s))
