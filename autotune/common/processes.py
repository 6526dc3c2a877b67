"""Process lifetime, shared by both sides: nothing a search starts may outlive it.

The chain, however the search dies (kill -9 included): the fork server is sent SIGTERM and
exits; each worker is SIGKILLed when its parent (the server, or the search for a plain command)
dies; each process a worker forks (DataLoader workers) is SIGKILLed when the worker dies. Every
link is the kernel's `PR_SET_PDEATHSIG`, so it holds even when the dying process runs no code.

Processes a trial starts in other ways (a `subprocess` of the user's factory, one in a session
of its own, a double fork) carry no such link. For them the worker is a child subreaper
(`PR_SET_CHILD_SUBREAPER`): whatever it starts stays in its process tree however its parents
end, so the tree can be ended whole: by the worker before it exits, by the search at the
trial's end, and by the fork server when the search dies (the server's death signal is
SIGTERM, and it ends its tree before it exits; see `fork_server_init`).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FREEZE_ROUNDS = 100  # a tree that still grows after this many rounds is killed as it is


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send `signum` to this process when the thread that forked it ends."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)


def children_die_with_this_process() -> None:
    """Every process forked from here on (DataLoader workers) dies with this one."""
    os.register_at_fork(after_in_child=die_with_parent)


def keep_orphans_in_this_tree() -> None:
    """Orphaned descendants (double forks, a parent that exited) become this process's
    children instead of PID 1's, so they stay among its descendants."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants(process: psutil.Process) -> list[psutil.Process]:
    """Every living descendant of `process`, in any session; [] when it is gone (its pid
    taken by another process included)."""
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end_processes(processes: list[psutil.Process]) -> None:
    """SIGKILL these processes and every descendant of them.

    They are stopped first, round by round, until no new descendant appears: a stopped
    process cannot fork, so none escapes between the listing and the kill. psutil checks
    each process's start time before signalling it, so a reused pid is left alone."""
    frozen: dict[int, psutil.Process] = {}
    for _ in range(_MAX_FREEZE_ROUNDS):
        found = list(processes)
        for parent in [*frozen.values(), *processes]:
            found += descendants(parent)
        new = [p for p in found if p.pid not in frozen]
        if not new:
            break
        for process in new:
            frozen[process.pid] = process
            _signal(process, signal.SIGSTOP)
    for process in frozen.values():
        _signal(process, signal.SIGKILL)


def end_own_descendants() -> None:
    """SIGKILL every descendant of this process but its own multiprocessing children
    (DataLoader workers): multiprocessing joins those as this process exits, and takes a
    child it did not end for a crash; they die with this process by their death signal."""
    joined = {child.pid for child in multiprocessing.active_children()}
    children = [c for c in _children(psutil.Process()) if c.pid not in joined]
    end_processes(children)


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children()
    except psutil.NoSuchProcess:
        return []


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass  # already gone (or its pid reused by someone else's process: not ours to end)
