"""Process lifetime, shared by both sides: nothing a search starts may outlive it.

The chain, however the search dies (kill -9 included): the fork server sees the search's end of
its "alive" pipe close and exits; each worker is SIGKILLed when its parent (the server, or the
search for a plain command) dies; each process a worker forks (DataLoader workers) is SIGKILLed
when the worker dies. Every link is the kernel's `PR_SET_PDEATHSIG`, so it holds even when the
dying process runs no code at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it ends."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def children_die_with_this_process() -> None:
    """Every process forked from here on (DataLoader workers) dies with this one."""
    os.register_at_fork(after_in_child=die_with_parent)
