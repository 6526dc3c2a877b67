"""Stopping a search from outside: Ctrl-C (SIGINT), and SIGTERM and SIGHUP, which schedulers
(Slurm, Kubernetes, systemd), `timeout` and a closed terminal send. All three end a search the
same way: the running trial is stopped and recorded as interrupted, every output is written,
then `SearchInterrupted` (a KeyboardInterrupt) goes on; the command line exits 128 + the
signal's number (130, 143, 129), as a shell reports a process ended by that signal. A signal
that arrives during a call to the study's storage is raised once the call has returned
(`autotune.store.storage_shield`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from autotune.store import storage_shield

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SearchInterrupted(KeyboardInterrupt):
    """The search was stopped by a signal; what finished is written (`paths`)."""

    def __init__(self, signum: int, paths: list[Path] | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.paths = paths or []
        self.ended = ""
        """`interrupted after 2 of 6 trials (SIGTERM)`, once the search has said so."""

    @property
    def signal_name(self) -> str:
        """SIGINT, SIGTERM, SIGHUP."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """What a shell shows for a process this signal ended: 130, 143, 129."""
        return 128 + self.signum


class StopSignals:
    """What `stop_signals` installed: the first stop signal received, if any."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.raised = False
        self._deferring = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            # Already stopping (a scheduler may send SIGTERM to every process of the job, a
            # user may press Ctrl-C twice): a second exception would cut the outputs short.
            return
        self.received = signum
        if self._deferring:
            return
        self.raised = True
        if not storage_shield.hold(SearchInterrupted(signum)):  # else: once the call returns
            raise SearchInterrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A signal arriving in here (while the outputs are written) waits until the end,
        then stops the search: a half-written output would be worse than a late stop."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.received is not None and not self.raised:
            self.raised = True
            raise SearchInterrupted(self.received)

    def interrupted(self, exc: BaseException) -> SearchInterrupted:
        """The exception to end the search with, for a KeyboardInterrupt met in the loop."""
        if isinstance(exc, SearchInterrupted):
            return exc
        return SearchInterrupted(self.received or signal.SIGINT)


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """While the search runs, SIGINT, SIGTERM and SIGHUP raise `SearchInterrupted` in this
    (the main) thread; the previous handlers come back afterwards (a notebook goes on as it
    was). Elsewhere than in the main thread Python allows no handler: nothing is installed."""
    signals = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {s: signal.signal(s, signals.handle) for s in STOP_SIGNALS}
    try:
        yield signals
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
