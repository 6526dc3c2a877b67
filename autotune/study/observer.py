"""What the search loop tells whoever watches it: the interface the terminal view and a
notebook implement (`autotune.outputs.view.TerminalView`)."""

from __future__ import annotations

import contextlib
from typing import Any

from autotune.common.trial import Progress, TrialResult
from autotune.plan.plan import SearchPlan
from autotune.store.records import TrialRecord


class SearchObserver:
    """What the loop tells whoever watches it (the terminal, a notebook); each does nothing
    here. Called in the search process, between trials or while one runs."""

    def busy(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Around work before the search (`probing the device`)."""
        return contextlib.nullcontext()

    def planned(self, plan: SearchPlan, done_before: int) -> None:
        """The study is open (under its lock); `done_before` trials were recorded earlier."""

    def watching(self) -> contextlib.AbstractContextManager[None]:
        """Around the loop (a live display)."""
        return contextlib.nullcontext()

    def ended(self, stopped: str) -> None:
        """The loop ended normally; `stopped` says why."""

    def retried(self, number: int, refused: str | None = None) -> None:
        """Trial `number` was interrupted earlier, or `refused` (a link planted in its
        folder: why): its settings run again first."""

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        """A worker is starting on these settings."""

    def progress(self, number: int, progress: Progress) -> None:
        """The running trial's worker wrote a new progress record."""

    def trial_ended(self, record: TrialRecord) -> None:
        """A trial was recorded (measured, failed or skipped)."""

    def worker_failed(self, index: int, how: str, log_tail: str) -> None:
        """Worker `index` of several (`workers=N`) ended in an error; the others go on."""

    def runs_code(self, what: str) -> None:
        """Code the stored study names is about to run (`autotune confirm`, `verify`): which
        file, with its sha256, said before it is imported."""

    def warned(self, message: str) -> None:
        """Something the user must hear now, while a trial runs (the study file deleted)."""

    def looking_again(self, message: str) -> None:
        """The search ended with every trial after the baseline stopped early: the fastest
        runs once more, to its end, as one more trial (`study.second_look`); `message` says
        why."""

    def lost(self, number: int) -> None:
        """Trial `number` ran here, but another process had failed it as stale meanwhile (this
        one sent no heartbeat for `stale_after`): its result was dropped; a retry runs it."""

    def confirming(self, picks: int, rounds: int, expected_s: float) -> None:
        """The search ended; `picks` trials run again `rounds` times, interleaved, in about
        `expected_s` (what their trials took)."""

    def confirmed_run(self, round_number: int, record: TrialRecord, result: TrialResult) -> None:
        """One run of the confirmation ended."""
