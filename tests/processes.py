"""Reading other processes in tests, where any of them may end between two reads: a listed
process may be gone, or a zombie not yet reaped, by the time it is read."""

import psutil


def tree(pid: int) -> list[psutil.Process]:
    """The descendants of `pid` (none once it has ended)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(pids: set[int]) -> set[int]:
    """Those still running (a zombie has ended: it only waits for its parent to reap it)."""
    running = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.add(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def command_of(process: psutil.Process | int) -> str:
    """Its command line as one string; empty once it has ended (a zombie's is unreadable)."""
    try:
        found = psutil.Process(process) if isinstance(process, int) else process
        return " ".join(found.cmdline())
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return ""
