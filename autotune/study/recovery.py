"""Trials a search left behind: who runs a trial (its owner and its heartbeats), when its
search has died, and running its settings once more. Several searches may recover at once;
each step is safe for that."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from autotune.common.layout import set_aside_result, trial_dir
from autotune.common.placement import Placement
from autotune.store.records import (
    BASELINE_ATTR,
    INTERRUPTED_BY_ATTR,
    OWNER_ATTR,
    REFERENCE_ATTR,
    RETRY_OF_ATTR,
    SECOND_LOOK_ATTR,
    is_interrupted,
)
from autotune.study.interrupts import SearchInterrupted

UNOWNED_GRACE_S = 60.0
"""A RUNNING trial that names no owner this long after it started was left by an old search."""


@contextlib.contextmanager
def heartbeat(trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat every `heartbeat_interval` seconds while it runs, from a
    thread of this process, so another process can tell a dead search's trial from a slow one.
    (Optuna beats only inside `study.optimize`; this loop asks and tells itself.)"""
    storage = trial.storage
    interval = storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None
    if interval is None:
        yield
        return
    study_id = storage.get_study_id_from_name(trial.study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a storage hiccup: the next beat may pass
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def note_interruption(trial: optuna.Trial, exc: BaseException) -> None:
    """Which signal stopped the search while this trial ran, for its row in the outputs. On
    the way out: one quick write, and a storage that fails it must not stop the exit (the
    trial is recognised as interrupted without it)."""
    if isinstance(exc, KeyboardInterrupt):
        name = exc.signal_name if isinstance(exc, SearchInterrupted) else "SIGINT"
        with contextlib.suppress(Exception):
            trial.set_user_attr(INTERRUPTED_BY_ATTR, name)


def this_process(placement: Placement | None = None) -> dict[str, Any]:
    """Who runs a trial (`OWNER_ATTR`): host, pid and its start, and what it trains on (the
    cores and GPUs of its `placement`, within this process's), for another process of the
    study to compare with."""
    me = psutil.Process()
    placement = placement or Placement()
    cpus = placement.cpus if placement.cpus is not None else os.sched_getaffinity(0)
    cuda = ",".join(placement.cuda_devices) or os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        "host": socket.gethostname(),
        "pid": me.pid,
        "pid_started": me.create_time(),
        "cpus": sorted(cpus),
        "cuda": cuda,
    }


def shares_with(owner: dict[str, Any], me: dict[str, Any], *, cuda: bool) -> str | None:
    """What two processes of one host (`this_process` records) both train on, in words (`cores
    0-3`, `every GPU`); None when nothing (or, for a record without it, unknown)."""
    if cuda:
        theirs, mine = owner.get("cuda", ""), me.get("cuda")
        if theirs == "":  # an older record: unknown
            return None
        if theirs is None or mine is None:
            return "every GPU" if theirs is None and mine is None else "GPUs"
        both = set(theirs.split(",")) & set(mine.split(","))
        return f"GPU {','.join(sorted(both))}" if both else None
    both = sorted(set(owner.get("cpus") or ()) & set(me.get("cpus") or ()))
    if not both:
        return None
    return f"core{'s' * (len(both) > 1)} {','.join(map(str, both))}"


def _owner_is_gone(trial: FrozenTrial) -> bool:
    """Whether the search that ran a trial has ended. Only a process on this host can be
    checked; a trial run from another host is left to its heartbeats."""
    owner = trial.user_attrs.get(OWNER_ATTR)
    if owner is None:
        # A search names itself right after asking; a trial still unnamed long after was left
        # by a search of a version that named none.
        started = trial.datetime_start or datetime.datetime.now()
        return (datetime.datetime.now() - started).total_seconds() > UNOWNED_GRACE_S
    if owner["host"] != socket.gethostname():
        return False
    try:
        # The same pid with another start time is a new process that reused the number.
        return psutil.Process(owner["pid"]).create_time() != owner["pid_started"]
    except psutil.NoSuchProcess:
        return True


def recover(
    study: optuna.Study,
    study_dir: Path,
    baseline: dict[str, tuple[optuna.distributions.BaseDistribution, Any]],
) -> tuple[list[FrozenTrial], list[int]]:
    """Fail the trials whose search has died, and queue each interrupted trial's settings to
    run once more; returns the study's trials, read once (again only when this changed
    them), and the numbers of the trials queued again.

    A trial's search has died when it ran on this host and its process is gone, or, from any
    host, when it has sent no heartbeat for `stale_after` (Optuna's `fail_stale_trials`; the
    storage's clock). A live search's trial is left alone. Several processes may recover at
    once: a trial is failed by one of them, and of two retries queued for the same trial only
    the first runs (`not_run.not_to_run`). An interrupted baseline is queued with the baseline's
    Optuna parameters (`SearchSpace.optuna_params`; older studies stored none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    gone = [t for t in trials if t.state is TrialState.RUNNING and _owner_is_gone(t)]
    for trial in gone:
        # Another process may fail it at the same moment: one of the two does.
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    if gone:
        trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
    queued = []
    for trial in trials:
        first_run = trial.number not in retried and RETRY_OF_ATTR not in trial.user_attrs
        if is_interrupted(trial) and first_run:
            set_aside_result(trial_dir(study_dir, trial.number))
            queue_again(study, trial, baseline)
            queued.append(trial.number)
    if queued:
        trials = study.get_trials(deepcopy=False)
    return trials, queued


def queue_again(
    study: optuna.Study,
    trial: FrozenTrial | optuna.Trial,
    baseline: dict[str, tuple[Any, Any]],
) -> None:
    """Queue `trial`'s settings to run again, as what it was queued for (`RETRY_OF_ATTR`)."""
    params, attrs = trial.params, {RETRY_OF_ATTR: trial.number}
    if trial.user_attrs.get(BASELINE_ATTR):
        params = {name: value for name, (_, value) in baseline.items()}
        attrs[BASELINE_ATTR] = True
    if trial.user_attrs.get(REFERENCE_ATTR):  # its settings are the plan's
        attrs[REFERENCE_ATTR] = True
    if SECOND_LOOK_ATTR in trial.user_attrs:  # runs to its end again
        attrs[SECOND_LOOK_ATTR] = trial.user_attrs[SECOND_LOOK_ATTR]
    study.enqueue_trial(params, user_attrs=attrs)
