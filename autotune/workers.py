"""Several workers on one study: `workers=N` on `autotune search`, and `autotune worker`.

A worker is a search process of its own: the search loop (`study.loop.run_search`) whose
trials run on its own CUDA device (their processes' `CUDA_VISIBLE_DEVICES`, so they see only
that one) or its own share of the CPU cores (affinity, and as many torch threads), each from
a fork server started there (`execute.fork_servers`). Workers
know nothing of each other: they share the study's storage, which every loop reads afresh
before each trial, and Optuna's own mechanisms (queued trials handed out once, constant-liar
TPE, heartbeats) keep them from measuring the same settings twice.

The process that starts them runs no trial: it watches the study (and this host's trial
folders for progress), shows one progress view, forwards Ctrl-C, and writes the outputs once
when every worker has ended. `python -m autotune.workers FOLDER INDEX` is one worker: it joins
the study with the finished plan, which reaches it through its stdin, pickled (from the process
that started it, through a pipe no one else can write; never through a file), so no worker
plans again: `data=` is read and the hub asked once per search.

With an executor that starts no process (the simulated one) the workers are threads of the
search's process instead (`_run_threads`): the same loop on each slot, in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
from optuna.trial import TrialState

from autotune.common.errors import AutotuneError, ConfigError
from autotune.common.layout import PROGRESS_FILE, SPEC_FILE, WORKERS, trial_dir
from autotune.common.output_files import make_folder, open_log
from autotune.common.processes import die_with_parent
from autotune.common.trial import Progress, read_progress, write_json_atomic
from autotune.execute.base import TrialExecutor
from autotune.execute.launchers import CommandLauncher, ForkserverLauncher
from autotune.execute.local import LocalExecutor
from autotune.outputs.view import TerminalView
from autotune.plan.plan import SearchPlan
from autotune.store.outcomes import Ending, Stop
from autotune.store.records import (
    PARAMS_ATTR,
    REFUSED_ATTR,
    RETRY_OF_ATTR,
    counts_toward_n_trials,
    is_recorded,
    record_of,
)
from autotune.store.storage_file import FileWatch
from autotune.study.interrupts import SearchInterrupted, stop_signals
from autotune.study.loop import run_search
from autotune.study.observer import SearchObserver
from autotune.study.opening import open_study
from autotune.study.sampling.sampler import quiet_optuna
from autotune.worker_threads import run_threads, worker_plan

WATCH_S = 0.5
"""Between two looks at the study while workers run."""
STOP_WAIT_S = 30.0
"""How long workers get to end their trial's record after Ctrl-C before they are killed."""
LOG_TAIL_LINES = 15


def run_workers(
    plan: SearchPlan,
    study: optuna.Study,
    observer: SearchObserver,
    executor: TrialExecutor,
) -> Stop:
    """Start one worker per slot of `plan`, show them as one search through `observer`, and
    return why they stopped when every one has ended.

    Each worker joins the study with the finished plan (`plan.settle`d when the study was
    opened): none plans again, so `data=` is read and the hub asked once per search."""
    if not isinstance(executor, LocalExecutor):
        # An executor that runs trials elsewhere (simulated, or on a cluster): N threads of this
        # process, each the loop on its slot, keep N trials in flight through it.
        return run_threads(plan, study, observer, executor)
    trial_command = _trial_command(plan, executor)
    folder = plan.study_dir / WORKERS / f"{socket.gethostname()}-{os.getpid()}"
    make_folder(folder, plan.study_dir)
    # What the workers were given, for people: without the storage URL, which may hold a
    # password, and the study folder is no place for one (it is kept, shared, copied).
    record = {
        "settings": plan.config.model_dump(mode="json", exclude={"storage"}),
        "slots": [dataclasses.asdict(s) for s in plan.slots],
        "trial_command": trial_command,
    }
    write_json_atomic(folder / SPEC_FILE, record)
    # The plan itself, storage URL included, goes through each worker's stdin (see above).
    handoff = pickle.dumps(_Handoff(plan=plan, trial_command=trial_command))
    study_file = FileWatch.of(plan.storage_url)  # each worker stops when it is gone
    workers = [_start(folder, k, handoff) for k in range(len(plan.slots))]
    watcher = _Watcher(plan, study, observer)
    try:
        _watch(workers, watcher, folder, study, plan.config.n_trials, observer)
    except BaseException:
        _stop(workers)
        raise
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
    if study_file is not None and study_file.lost():  # the workers said so, and stopped
        raise study_file.error(sum(is_recorded(t) for t in study.get_trials(deepcopy=False)))
    return _stopped(folder, workers)


def _trial_command(plan: SearchPlan, executor: LocalExecutor) -> list[str] | None:
    """How each worker process starts its trials: a command, or None for the fork servers
    of its slot; a ConfigError for a launcher that cannot be handed to a process."""
    launcher = executor.launcher
    if isinstance(launcher, CommandLauncher):
        return list(launcher.command)
    if isinstance(launcher, ForkserverLauncher):
        return None  # each worker forks its trials from a fork server of its slot
    # Each worker process runs trials of its own: what it is told is how to start them.
    raise ConfigError(
        f"workers={len(plan.slots)}: a {type(launcher).__name__} cannot be handed to worker "
        "processes; use workers=1"
    )


def _watch(
    workers: list[subprocess.Popen],
    watcher: _Watcher,
    folder: Path,
    study: optuna.Study,
    n_trials: int,
    observer: SearchObserver,
) -> None:
    """Show the workers as one search until every one has ended; a worker that failed is
    said once, one stopped while the study got its trials is ended."""
    while True:
        done = [w.poll() is not None for w in workers]
        watcher.look()
        for k, worker in enumerate(workers):
            if worker.returncode not in (None, 0) and k not in watcher.failed:
                watcher.failed.add(k)
                observer.worker_failed(k, _exit(worker.returncode), _tail(_log(folder, k)))
        for k in _stopped_after_the_study_ended(workers, study, n_trials):
            # Stopped (SIGSTOP, a debugger) it would be waited for forever; the study has
            # its trials without it (its trial, stale, was run again elsewhere).
            workers[k].kill()
            watcher.failed.add(k)
            observer.worker_failed(
                k,
                "stopped (SIGSTOP) while the study got all its trials: ended it",
                _tail(_log(folder, k)),
            )
        if all(done):
            watcher.look()  # what the last worker recorded just before it ended
            return
        time.sleep(WATCH_S)


def _stopped_after_the_study_ended(
    workers: list[subprocess.Popen], study: optuna.Study, n_trials: int
) -> list[int]:
    """The workers that are stopped (not running, not ended) once the study has `n_trials`."""
    stopped = []
    for k, worker in enumerate(workers):
        with contextlib.suppress(psutil.NoSuchProcess):
            if worker.poll() is None and psutil.Process(worker.pid).status() == "stopped":
                stopped.append(k)
    trials = study.get_trials(deepcopy=False) if stopped else []
    return stopped if sum(counts_toward_n_trials(t) for t in trials) >= n_trials else []


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Handoff:
    """What a worker process is given: the finished plan and how to start its trials."""

    plan: SearchPlan
    trial_command: list[str] | None
    """`CommandLauncher`'s command; None: a fork server of the worker's own."""


def _start(folder: Path, index: int, handoff: bytes) -> subprocess.Popen:
    with open(open_log(_log(folder, index), append=True), "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "autotune.workers", str(folder), str(index)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A session of its own: Ctrl-C reaches this process alone, which forwards it, so
            # every worker records its trial as interrupted before this one writes the outputs.
            start_new_session=True,
            preexec_fn=die_with_parent,  # and none outlives this process (kill -9 included)
        )
    assert worker.stdin is not None
    # A worker that died before reading it (its exit code and log say why) must not stop the
    # search from starting and watching the others.
    with contextlib.suppress(BrokenPipeError), worker.stdin:
        worker.stdin.write(handoff)
    return worker


def _stop(workers: list[subprocess.Popen]) -> None:
    """Ctrl-C for every worker; those still running after STOP_WAIT_S are killed."""
    for worker in workers:
        if worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_WAIT_S
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))


def _log(folder: Path, index: int) -> Path:
    return folder / f"worker-{index}.log"


def _stopped_path(folder: Path, index: int) -> Path:
    return folder / f"worker-{index}.json"


def _exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _stopped(folder: Path, workers: list[subprocess.Popen]) -> Stop:
    """Why the workers stopped, in one line: their own words when they all agree."""
    stops, failed = [], []
    for k, worker in enumerate(workers):
        if worker.returncode == 0:
            with contextlib.suppress(OSError, ValueError, KeyError):
                said = json.loads(_stopped_path(folder, k).read_text())
                stops.append(Stop(said["stopped"], Ending(said["ending"])))
        else:
            failed.append(f"worker {k} ({_exit(worker.returncode)}, {_log(folder, k)})")
    if not stops:
        raise WorkerError(f"every worker failed: {'; '.join(failed)}")
    stop = Stop.of_all(stops)
    if not failed:
        return stop
    return Stop(f"{stop.reason}; failed: {'; '.join(failed)}", stop.ending)


class WorkerError(AutotuneError):
    """Every worker of a search ended in an error."""


class _Watcher:
    """Turns what the study's storage and this host's trial folders say into observer calls:
    trials started (their spec written here), progress, trials recorded, retries queued."""

    def __init__(self, plan: SearchPlan, study: optuna.Study, observer: SearchObserver) -> None:
        self.study, self.observer = study, observer
        self.trial_dir = lambda number: trial_dir(plan.study_dir, number)
        trials = study.get_trials(deepcopy=False)
        self.ended = {t.number for t in trials if is_recorded(t)}
        self.retries = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
        self.started: set[int] = set()
        self.progress: dict[int, Progress] = {}
        self.failed: set[int] = set()

    def look(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        for trial in trials:
            number = trial.number
            retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
            if retry_of is not None and retry_of not in self.retries:
                self.retries.add(retry_of)
                self.observer.retried(retry_of, trials[retry_of].user_attrs.get(REFUSED_ATTR))
            if trial.state is TrialState.RUNNING and PARAMS_ATTR in trial.user_attrs:
                folder = self.trial_dir(number)
                if number not in self.started and (folder / SPEC_FILE).exists():
                    self.started.add(number)
                    self.observer.trial_started(number, trial.user_attrs[PARAMS_ATTR])
                if number in self.started:
                    progress = read_progress(folder / PROGRESS_FILE)
                    if progress is not None and progress != self.progress.get(number):
                        self.progress[number] = progress
                        self.observer.progress(number, progress)
            elif is_recorded(trial) and number not in self.ended:
                self.ended.add(number)
                self.observer.trial_ended(record_of(trial))


def _worker_main(folder: Path, index: int) -> int:
    """One worker: the study's loop on its slot, with a log of plain lines on stdout."""
    quiet_optuna()
    handoff: _Handoff = pickle.load(sys.stdin.buffer)  # from the parent, through a pipe
    # The slots were assigned by the process that started the workers: this one is slot INDEX.
    plan = worker_plan(handoff.plan, index)
    slot = plan.slots[0]
    print(f"worker {index} (pid {os.getpid()}): {slot.describe()}", flush=True)
    command = handoff.trial_command
    # Its trials run on its slot: each submission carries it, and the executor places them.
    # The worker itself keeps to its slot's cores too (a process of its own: nothing to put
    # back), so that its loop and the sampler's numpy never run on another worker's cores
    # while that one times its steps.
    slot.pin()
    executor = LocalExecutor(CommandLauncher(tuple(command)) if command else None)
    study, plan = open_study(plan, joining=True)
    view = TerminalView(quiet=False, log_name=None)
    view.planned(plan, done_before=0)
    stopped = run_search(plan, study, observer=view, executor=executor)
    view.ended(stopped.reason)
    write_json_atomic(
        _stopped_path(folder, index), {"stopped": stopped.reason, "ending": stopped.ending}
    )
    return 0


def main(argv: list[str]) -> int:
    try:
        # SIGTERM sent to a worker itself (a scheduler ending every process of the job) ends
        # its trial as the forwarded Ctrl-C does: recorded as interrupted.
        with stop_signals():
            return _worker_main(Path(argv[0]), int(argv[1]))
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr, flush=True)
        return exc.exit_code if isinstance(exc, SearchInterrupted) else 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
