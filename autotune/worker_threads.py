"""`workers=N` with an executor that runs trials elsewhere (the simulated one, a cluster's): N
threads of this process, each the search loop on its slot, shown as one search, N trials in
flight. With this host's executor, `workers` runs worker processes instead."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any

import optuna

from autotune.common.trial import Progress
from autotune.execute.base import Submission, TrialExecutor, TrialHandle
from autotune.plan.plan import SearchPlan
from autotune.store.outcomes import Stop
from autotune.store.records import (
    TrialRecord,
)
from autotune.store.storage import open_storage
from autotune.study.loop import run_search
from autotune.study.observer import SearchObserver


def worker_plan(plan: SearchPlan, index: int) -> SearchPlan:
    """The plan as worker `index` runs it: its slot alone, one worker."""
    config = plan.config.model_copy(update={"workers": 1, "devices": "auto"})
    return dataclasses.replace(plan, config=config, slots=[plan.slots[index]])


def run_threads(
    plan: SearchPlan, study: optuna.Study, observer: SearchObserver, executor: TrialExecutor
) -> Stop:
    """`workers=N` with an executor that runs trials elsewhere: N threads of this process, each
    the loop on its slot with a study handle of its own, as a worker process runs it, shown as
    one search. An exception in one stops the others before their next trial (so does
    Ctrl-C), and goes on from here once they have stopped.

    A slot reaches a trial through its submission (`Submission.placement`): the executor
    places the trial's process there, and these trials have none. Each thread's plan holds its
    slot alone, as a worker process's does, and its name says which (`worker 3: cuda device
    3`, what the simulated executor's `clocks_s` are keyed by)."""
    view, stop = _OneView(observer), threading.Event()
    plans = [worker_plan(plan, k) for k in range(len(plan.slots))]
    handles = [_handle(p, study.sampler) for p in plans]  # opened before any runs
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(plans)) as pool:
        futures = [
            pool.submit(
                _loop_in_thread,
                f"worker {k}: {p.slots[0].describe()}",
                p,
                handle,
                view,
                _UntilStopped(executor, stop),
            )
            for k, (p, handle) in enumerate(zip(plans, handles, strict=True))
        ]
        try:
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        finally:
            stop.set()  # and leaving the pool waits for every thread
    errors = [f.exception() for f in futures if f.exception() is not None]
    failed = next((e for e in errors if not isinstance(e, _Stopped)), None)
    if failed is not None:
        raise failed
    return Stop.of_all([f.result() for f in futures])


def _handle(plan: SearchPlan, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """A worker thread's own handle on the study (its own storage connections), with the
    search's sampler: Optuna's `study.optimize(n_jobs=N)` shares one among its threads too.
    The plan was settled for the study by this search a moment ago: nothing to check again."""
    storage = open_storage(plan.storage_url, stale_after_s=plan.config.stale_after)
    return optuna.load_study(study_name=plan.study_name, storage=storage, sampler=sampler)


def _loop_in_thread(
    name: str,
    plan: SearchPlan,
    study: optuna.Study,
    observer: SearchObserver,
    executor: TrialExecutor,
) -> Stop:
    threading.current_thread().name = name  # a pool's thread, this worker's while it runs
    return run_search(plan, study, observer=observer, executor=executor)


class _Stopped(Exception):
    """Another worker thread failed, or the search was interrupted: this one stops too."""


class _UntilStopped:
    """The executor, for one worker thread: once `stop` is set, a trial is refused before it
    starts (the loop records it as interrupted: a resume runs it again); a trial that raises
    sets it."""

    def __init__(self, executor: TrialExecutor, stop: threading.Event) -> None:
        self.executor, self.stop = executor, stop

    def ready(self) -> None:
        if self.stop.is_set():
            raise _Stopped
        self.executor.ready()

    def submit(self, submission: Submission) -> TrialHandle:
        try:
            return self.executor.submit(submission)
        except BaseException:
            # At once: the loop records this trial before the exception leaves the thread,
            # and the others would go on taking trials meanwhile.
            self.stop.set()
            raise


class _OneView(SearchObserver):
    """What the worker threads' loops tell, passed on to one observer a call at a time (the
    terminal view keeps the running trials in plain dicts)."""

    def __init__(self, observer: SearchObserver) -> None:
        self.observer, self.lock = observer, threading.Lock()

    def retried(self, number: int, refused: str | None = None) -> None:
        with self.lock:
            self.observer.retried(number, refused)

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        with self.lock:
            self.observer.trial_started(number, params)

    def progress(self, number: int, progress: Progress) -> None:
        with self.lock:
            self.observer.progress(number, progress)

    def trial_ended(self, record: TrialRecord) -> None:
        with self.lock:
            self.observer.trial_ended(record)

    def warned(self, message: str) -> None:
        with self.lock:
            self.observer.warned(message)

    def lost(self, number: int) -> None:
        with self.lock:
            self.observer.lost(number)
