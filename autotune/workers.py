"""Several workers on one study: `workers=N` on `autotune search`, and `autotune worker`.

A worker is a search process of its own: the ask -> run -> tell loop (`study.run_search`) with
its own fork server, on its own CUDA device (`CUDA_VISIBLE_DEVICES`, so its trials see only
that one) or its own share of the CPU cores (affinity, and as many torch threads). Workers
know nothing of each other: they share the study's storage, which every loop reads afresh
before each trial, and Optuna's own mechanisms (queued trials handed out once, constant-liar
TPE, heartbeats) keep them from measuring the same settings twice.

The process that starts them runs no trial: it watches the study (and this host's trial
folders for progress), shows one progress view, forwards Ctrl-C, and writes the outputs once
when every worker has ended. `python -m autotune.workers SPEC INDEX` is one worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.trial import TrialState

from autotune.common.device import DeviceInfo
from autotune.common.errors import AutotuneError, ConfigError
from autotune.common.layout import PROGRESS_FILE, SPEC_FILE, WORKERS, trial_dir
from autotune.common.processes import die_with_parent
from autotune.common.trial import Progress, read_progress, write_json_atomic
from autotune.plan.slots import Slot
from autotune.store.records import (
    PARAMS_ATTR,
    RETRY_OF_ATTR,
    counts_toward_n_trials,
    is_recorded,
    record_of,
)
from autotune.store.storage_file import FileWatch

WATCH_S = 0.5
"""Between two looks at the study while workers run."""
STOP_WAIT_S = 30.0
"""How long workers get to end their trial's record after Ctrl-C before they are killed."""
LOG_TAIL_LINES = 15
STORAGE_ENV = "AUTOTUNE_STORAGE_URL"
"""How a worker process gets the study's storage URL: in its environment (readable by its
user alone), not in spec.json, as the URL may hold a password."""


def run_workers(plan: Any, study: optuna.Study, observer: Any, launcher: Any) -> str:
    """Start one worker per slot of `plan`, show them as one search through `observer`, and
    return why they stopped when every one has ended."""
    from autotune.search.runner import CommandLauncher, ForkserverLauncher

    if isinstance(launcher, CommandLauncher):
        trial_command: list[str] | None = list(launcher.command)
    elif launcher is None or isinstance(launcher, ForkserverLauncher):
        trial_command = None  # each worker starts a fork server of its own
    else:
        raise ConfigError(f"workers={len(plan.slots)}: a {type(launcher).__name__} cannot be "
                          "handed to worker processes; use workers=1")  # fmt: skip
    folder = plan.study_dir / WORKERS / f"{socket.gethostname()}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        # Without the storage URL: it may hold a password, and the study folder is no place
        # for one (it is kept, shared, copied); the workers get it in their environment.
        "settings": plan.config.model_dump(mode="json", exclude={"storage"}),
        "device_info": dataclasses.asdict(plan.device_info),
        "slots": [dataclasses.asdict(s) for s in plan.slots],
        # A measurement condition the search checked for the study: each worker's is it.
        "cores_per_trial": plan.info.cores_per_trial,
        "trial_command": trial_command,
    }
    write_json_atomic(folder / SPEC_FILE, spec)
    env = os.environ | {STORAGE_ENV: plan.storage_url}
    study_file = FileWatch.of(plan.storage_url)  # each worker stops when it is gone
    workers = [_start(folder, k, env) for k in range(len(plan.slots))]
    watcher = _Watcher(plan, study, observer)
    try:
        while True:
            done = [w.poll() is not None for w in workers]
            watcher.look()
            for k, worker in enumerate(workers):
                if worker.returncode not in (None, 0) and k not in watcher.failed:
                    watcher.failed.add(k)
                    observer.worker_failed(k, _exit(worker.returncode), _tail(_log(folder, k)))
            for k in _stopped_after_the_study_ended(workers, study, plan.config.n_trials):
                # Stopped (SIGSTOP, a debugger) it would be waited for forever; the study has
                # its trials without it (its trial, stale, was run again elsewhere).
                workers[k].kill()
                watcher.failed.add(k)
                observer.worker_failed(k, "stopped (SIGSTOP) while the study got all its "
                                       "trials: ended it", _tail(_log(folder, k)))  # fmt: skip
            if all(done):
                watcher.look()  # what the last worker recorded just before it ended
                break
            time.sleep(WATCH_S)
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


def _start(folder: Path, index: int, env: dict[str, str]) -> subprocess.Popen:
    with open(_log(folder, index), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "autotune.workers", str(folder / SPEC_FILE), str(index)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A session of its own: Ctrl-C reaches this process alone, which forwards it, so
            # every worker records its trial as interrupted before this one writes the outputs.
            start_new_session=True,
            preexec_fn=die_with_parent,  # and none outlives this process (kill -9 included)
        )


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


def _stopped(folder: Path, workers: list[subprocess.Popen]) -> str:
    """Why the workers stopped, in one line: their own words when they all agree."""
    reasons, failed = [], []
    for k, worker in enumerate(workers):
        if worker.returncode == 0:
            with contextlib.suppress(OSError, ValueError, KeyError):
                reasons.append(json.loads(_stopped_path(folder, k).read_text())["stopped"])
        else:
            failed.append(f"worker {k} ({_exit(worker.returncode)}, {_log(folder, k)})")
    if not reasons:
        raise WorkerError(f"every worker failed: {'; '.join(failed)}")
    said = "; ".join(dict.fromkeys(reasons))
    return said if not failed else f"{said}; failed: {'; '.join(failed)}"


class WorkerError(AutotuneError):
    """Every worker of a search ended in an error."""


class _Watcher:
    """Turns what the study's storage and this host's trial folders say into observer calls:
    trials started (their spec written here), progress, trials recorded, retries queued."""

    def __init__(self, plan: Any, study: optuna.Study, observer: Any) -> None:
        self.study, self.observer = study, observer
        self.trial_dir = lambda number: trial_dir(plan.study_dir, number)
        trials = study.get_trials(deepcopy=False)
        self.ended = {t.number for t in trials if is_recorded(t)}
        self.retries = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
        self.started: set[int] = set()
        self.progress: dict[int, Progress] = {}
        self.failed: set[int] = set()

    def look(self) -> None:
        for trial in self.study.get_trials(deepcopy=False):
            number = trial.number
            retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
            if retry_of is not None and retry_of not in self.retries:
                self.retries.add(retry_of)
                self.observer.retried(retry_of)
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


def _worker_main(spec_path: Path, index: int) -> int:
    """One worker: the study's loop on its slot, with a log of plain lines on stdout."""
    from autotune.outputs.view import TerminalView
    from autotune.plan.config import make_config
    from autotune.plan.plan import make_plan
    from autotune.search.loop import run_search
    from autotune.search.opening import open_study
    from autotune.search.runner import CommandLauncher, ForkserverLauncher
    from autotune.search.sampler import quiet_optuna

    quiet_optuna()
    spec = json.loads(spec_path.read_text())
    owned = spec["slots"][index]
    slot = Slot(**{k: tuple(v) if isinstance(v, list) else v for k, v in owned.items()})
    print(f"worker {index} (pid {os.getpid()}): {slot.describe()}", flush=True)
    # The slots were assigned by the process that started the workers: this one is slot INDEX.
    # Taken out of the environment: the trials, and the user's code in them, need no password.
    storage = os.environ.pop(STORAGE_ENV)
    settings = spec["settings"] | {"workers": 1, "devices": "auto", "storage": storage}
    plan = make_plan(make_config(settings), DeviceInfo.from_facts(spec["device_info"]))
    # Planned as one worker, it would count every core: its trials have its slot's share.
    cores = dataclasses.replace(plan.info, cores_per_trial=spec["cores_per_trial"])
    plan = dataclasses.replace(plan, info=cores)
    command = spec["trial_command"]
    with slot.applied():  # before the fork server starts: it and every trial inherit it
        launcher = CommandLauncher(tuple(command)) if command else ForkserverLauncher()
        study, plan = open_study(plan, joining=True)
        view = TerminalView(quiet=False, log_name=None)
        view.planned(plan, done_before=0)
        stopped = run_search(plan, study, observer=view, launcher=launcher)
        view.ended(stopped)
    write_json_atomic(_stopped_path(spec_path.parent, index), {"stopped": stopped})
    return 0


def main(argv: list[str]) -> int:
    from autotune.search.interrupts import SearchInterrupted, stop_signals

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
