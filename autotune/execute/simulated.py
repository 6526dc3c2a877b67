"""The simulated executor: each trial answered by a function of its spec (a recorded landscape,
a performance model), its cost included, and no process started.

What the answer says the trial cost (`wall_s`) is what the search sees, so a replayed search
replays its clock as well as its figures; `clock_s` adds up the simulated time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from autotune.common.trial import Progress, Status, TrialResult, TrialSpec
from autotune.execute.base import Submission

Answer = Callable[[TrialSpec], TrialResult]
"""A trial's settings -> what it measured, `wall_s` (its cost) included."""


class SimulatedExecutor:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.answered: list[TrialResult] = []
        """Every answer given, in order: what a real search would have run."""
        self.clock_s = 0.0
        """The simulated time the answered trials took, one after another."""

    def ready(self) -> None:
        pass  # nothing to start

    def submit(self, submission: Submission) -> SimulatedTrial:
        result = self.answer(submission.spec)
        wall_s = result.wall_s
        if wall_s is not None and wall_s > submission.timeout_s:
            # As the local executor ends it: no figures, the time spent is the limit.
            result = TrialResult(status=Status.TIMEOUT, wall_s=submission.timeout_s,
                                 reason="no result before trial_timeout")  # fmt: skip
            wall_s = submission.timeout_s
        if wall_s is not None:
            result = dataclasses.replace(result, device_s=wall_s * submission.spec.devices)
            self.clock_s += wall_s
        self.answered.append(result)
        return SimulatedTrial(result)


class SimulatedTrial:
    def __init__(self, result: TrialResult) -> None:
        self._result = result

    def progress(self) -> Progress | None:
        return None  # it ends as it starts

    def result(self, on_progress: Callable[[Progress], None] | None = None) -> TrialResult:
        return self._result

    def cancel(self) -> None:
        pass  # nothing runs
