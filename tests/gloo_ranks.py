"""Two gloo ranks on loopback, started as torchrun would start them (its environment), each
running one Python program: for the checks of what torch, transformers and accelerate do on
several processes outside autotune's own ranks."""

import os
import socket
import subprocess
import sys


def two_ranks(code: str, *args: str, timeout_s: float = 600) -> list[str]:
    """Run `code` (`python -c code *args`) as ranks 0 and 1 of 2; their output, each rank's.
    Fails the test, with both outputs' ends, unless both exit 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env |= {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=env | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [rank.communicate(timeout=timeout_s)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [log[-3000:] for log in logs]
    return logs
