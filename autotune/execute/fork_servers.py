"""One fork server per placement: the process trials are forked from, started on the
placement's devices and cores (`Placement.environment`, `Placement.pin`), so that every trial
forked from it runs there, and the search process's own environment and affinity stay as they
are. Servers are kept for the life of this process, one per placement, shared by every
executor in it (a server costs ~7 s of imports on 2 cores and the memory of torch).

multiprocessing's fork server is one per process and starts with that process's environment;
this is CPython 3.11's `ForkServer.ensure_running`, with the child started by `subprocess`
with an environment and cores of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from multiprocessing import connection, forkserver, resource_tracker, spawn, util

from autotune.common import socket_folders
from autotune.common.placement import Placement

SERVER_ENVIRONMENT = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
"""Imports may ask torch.cuda.is_available(); answered through NVML it leaves CUDA
uninitialised in the server, so forked trials can still create their own context."""


class PlacedForkServer(forkserver.ForkServer):
    """A fork server whose process is started on `placement`."""

    def __init__(self, placement: Placement, preload: list[str]) -> None:
        super().__init__()
        self.placement = placement
        self.set_forkserver_preload(preload)
        self._process: subprocess.Popen | None = None

    def ensure_running(self) -> None:
        with self._lock:
            resource_tracker.ensure_running()
            if self._process is not None:
                if self._process.poll() is None:  # Popen reaps it: no waitpid of ours
                    return  # still alive
                os.close(self._forkserver_alive_fd)  # dead: started again below
                self._forkserver_address = self._forkserver_alive_fd = None
                self._forkserver_pid = None
            cmd = "from multiprocessing.forkserver import main; main(%d, %d, %r, **%r)"
            data = spawn.get_preparation_data("ignore")
            data = {k: v for k, v in data.items() if k in ("main_path", "sys_path")}
            socket_folders.claim()  # the listener's folder: removed even after a kill -9
            with socket.socket(socket.AF_UNIX) as listener:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                # Every client owns the write end of the "alive" pipe: when all have ended,
                # the server sees its read end ready and exits.
                alive_r, alive_w = os.pipe()
                try:
                    fds = [listener.fileno(), alive_r]
                    cmd %= (listener.fileno(), alive_r, self._preload_modules, data)
                    exe = spawn.get_executable()
                    args = [exe, *util._args_from_interpreter_flags(), "-c", cmd]
                    env = self.placement.environment()
                    for name, value in SERVER_ENVIRONMENT.items():
                        env.setdefault(name, value)  # a user's own setting stands
                    # Pinned before it imports torch. preexec_fn forks without posix_spawn,
                    # and is used only where there are cores to pin.
                    pin = self.placement.pin if self.placement.cpus is not None else None
                    self._process = subprocess.Popen(
                        args, executable=exe, pass_fds=fds, env=env, preexec_fn=pin
                    )
                except BaseException:
                    os.close(alive_w)
                    raise
                finally:
                    os.close(alive_r)
                self._forkserver_address = address
                self._forkserver_alive_fd = alive_w
                self._forkserver_pid = self._process.pid


_SERVERS: dict[Placement, PlacedForkServer] = {}
_LOCK = threading.Lock()


def server_for(placement: Placement, preload: list[str]) -> PlacedForkServer:
    """This process's fork server for `placement` (made on first use, started on first fork)."""
    with _LOCK:
        if placement not in _SERVERS:
            _SERVERS[placement] = PlacedForkServer(placement, preload)
        return _SERVERS[placement]
