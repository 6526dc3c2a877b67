"""Two gloo ranks on loopback, started as torchrun would start them (its environment), each
running one Python program: for the checks of what torch, transformers and accelerate do on
several processes outside autotune's own ranks."""

import os
import socket
import subprocess
import sys

JOIN = """
import os as _os
import torch.distributed as _dist
from autotune.child.ranks import listener_on as _listener_on


def join():
    # The process group over a store listening on loopback alone (`init_process_group`'s own
    # store would listen on every interface), as autotune's ranks join theirs.
    rank, world = int(_os.environ["RANK"]), int(_os.environ["WORLD_SIZE"])
    port = int(_os.environ["MASTER_PORT"])
    if rank == 0:
        listener = _listener_on("127.0.0.1", port)
        store = _dist.TCPStore("127.0.0.1", port, world, is_master=True,
                               master_listen_fd=listener.fileno())
    else:
        store = _dist.TCPStore("127.0.0.1", port, world, is_master=False)
    _dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
"""
"""Prepended to each rank's program: its `join()` joins the two ranks' process group."""


def two_ranks(code: str, *args: str, timeout_s: float = 600) -> list[str]:
    """Run `code` (`python -c code *args`, after `JOIN`) as ranks 0 and 1 of 2; their output,
    each rank's. Fails the test, with both outputs' ends, unless both exit 0; a rank still
    running at the end (the other failed, or the time ran out) is killed by its pid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env |= {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN + code, *args],
            env=env | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        logs = [rank.communicate(timeout=timeout_s)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    assert all(rank.returncode == 0 for rank in ranks), [log[-3000:] for log in logs]
    return logs
