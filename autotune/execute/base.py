"""The seam for running a trial: what the search asks of whatever runs it.

The search submits a trial (`Submission`: the spec, where its files may be kept, its limits)
and gets a handle; the handle tells its progress, its result (whose `wall_s`, and so its
`device_s`, is the trial's cost), and can cancel it. Nothing here names a process or a host:
the local executor (`execute/local.py`: a fork server, a watchdog, a process group) keeps its
pids to itself, the simulated one (`execute/simulated.py`) has none, and one that runs trials
elsewhere (ranks started by torchrun across nodes, a Ray placement group) answers the same
handle from what it tracks there. The model is Ray's `ray.air.execution`: a resource manager
with local and cluster implementations, tracked actors in place of pids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from autotune.common.placement import Placement
from autotune.common.trial import Progress, TrialResult, TrialSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """One trial to run, and its limits."""

    spec: TrialSpec
    place: str
    """Where the trial's own files (its log, its result) may be kept: a folder of the study's
    for the local executor, a key of a cluster's storage for a remote one."""
    timeout_s: float
    """The trial is `timeout` when it has no result after this long."""
    within: str | None = None
    """The study folder `place` (and the spec's compile cache) lies in: the local executor
    makes them there, each part checked (no link, this user's, not writable by others:
    `output_files.make_folder`); None: `place` is made as it is (a benchmark's own folder)."""
    memory_limit_bytes: int | None = None
    """A host-memory budget the executor enforces itself (CPU trials; on a GPU the worker caps
    its allocator at `spec.memory_budget_bytes`): past it the trial is `oom`."""
    placement: Placement = dataclasses.field(default_factory=Placement)
    """Where the trial runs on its host: its devices or cores (the submitting worker's slot).
    The executor starts the trial's process there; the submitter's own environment is left
    as it is."""


class TrialHandle(Protocol):
    """A submitted trial."""

    def progress(self) -> Progress | None:
        """The trial's last progress record, None before its first."""

    def result(self, on_progress: Callable[[Progress], None] | None = None) -> TrialResult:
        """Wait for the trial's end and return what happened to it, its cost included;
        `on_progress` sees each new progress record meanwhile, and what it raises cancels
        the trial and propagates."""

    def cancel(self) -> None:
        """End the trial now, with everything it started; a result it leaves is not used."""


class TrialExecutor(Protocol):
    """Runs trials (`submit`) after getting ready once (`ready`, outside any trial's clock)."""

    def ready(self) -> None: ...

    def submit(self, submission: Submission) -> TrialHandle: ...


def run_trial(
    executor: TrialExecutor,
    submission: Submission,
    on_progress: Callable[[Progress], None] | None = None,
) -> TrialResult:
    """Submit a trial and wait for its result; ended with the caller (Ctrl-C, an error),
    it is cancelled."""
    executor.ready()
    handle = executor.submit(submission)
    try:
        return handle.result(on_progress)
    except BaseException:
        handle.cancel()
        raise
