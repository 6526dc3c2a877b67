"""The simulated executor: each trial answered by a function of its spec (a recorded landscape,
a performance model), its cost included, and no process started.

What the answer says the trial cost (`wall_s`) is what the search sees, so a replayed search
replays its clock as well as its figures. The clock is the search's simulated wall time:
each thread's trials one after another, the threads side by side (`workers=N` runs the loops
of N workers as threads of one process with this executor, `autotune.workers`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from autotune.common.trial import Progress, Status, TrialResult, TrialSpec
from autotune.execute.base import Submission

Answer = Callable[[TrialSpec], TrialResult]
"""A trial's settings -> what it measured, `wall_s` (its cost) included."""


class SimulatedExecutor:
    """Answers trials at once, from several threads too (`workers=N`): the answer is then
    called from them at the same time, and must be safe for that (a function of the spec
    alone is)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.answered: list[TrialResult] = []
        """Every answer given, in order: what a real search would have run."""
        self.device_s = 0.0
        """The device time the answered trials took, all of them (wall x devices, summed)."""
        self._clocks: dict[threading.Thread, float] = {}
        """Each submitting thread's simulated time, its trials one after another."""
        self._lock = threading.Lock()

    @property
    def clock_s(self) -> float:
        """The simulated wall time: the longest thread's clock (with several workers, the
        makespan, less than the trials' `wall_s` summed). The workers took their trials in the
        order this process ran them, instantly, not in the one simulated time would give."""
        with self._lock:
            return max(self._clocks.values(), default=0.0)

    @property
    def clocks_s(self) -> dict[str, float]:
        """Each thread's clock by its name (`worker 3: cuda device 3`; `MainThread` for a
        search of one worker, and for the confirmation after several)."""
        with self._lock:
            return {thread.name: clock_s for thread, clock_s in self._clocks.items()}

    def ready(self) -> None:
        pass  # nothing to start

    def submit(self, submission: Submission) -> SimulatedTrial:
        result = self.answer(submission.spec)
        wall_s = result.wall_s
        if wall_s is not None and wall_s > submission.timeout_s:
            # As the local executor ends it: no figures, the time spent is the limit.
            result = TrialResult(
                status=Status.TIMEOUT,
                wall_s=submission.timeout_s,
                reason="no result before trial_timeout",
            )
            wall_s = submission.timeout_s
        if wall_s is not None:
            result = dataclasses.replace(result, device_s=wall_s * submission.spec.devices)
        with self._lock:
            if wall_s is not None:
                self._tick(wall_s, result.device_s)
            self.answered.append(result)
        return SimulatedTrial(result)

    def _tick(self, wall_s: float, device_s: float) -> None:
        thread = threading.current_thread()
        if thread not in self._clocks:
            # A thread's first trial starts when the threads that have ended did: the
            # confirmation after the workers' threads, not beside them.
            ended = [c for t, c in self._clocks.items() if not t.is_alive()]
            self._clocks[thread] = max(ended, default=0.0)
        self._clocks[thread] += wall_s
        self.device_s += device_s


class SimulatedTrial:
    def __init__(self, result: TrialResult) -> None:
        self._result = result

    def progress(self) -> Progress | None:
        return None  # it ends as it starts

    def result(self, on_progress: Callable[[Progress], None] | None = None) -> TrialResult:
        return self._result

    def cancel(self) -> None:
        pass  # nothing runs
