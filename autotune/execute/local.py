"""The local executor: each trial in a worker process of this host, in a session of its own,
watched by this process, its result read from its folder.

The trial's fate comes from the exit code, the result file and what the parent saw (its own
timeout or memory watchdog), never from the worker's stderr; the log tail is kept for the user.

The worker process is started by a launcher (`launchers`: forked from a fork server, or a
command).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from autotune.common.layout import (
    LOG_PIPE,
    PROGRESS_FILE,
    RESULT_FILE,
    SPEC_FILE,
    TRIAL_TEMP_PREFIX,
    WORKER_LOG,
    set_aside_result,
    socket_folder_prefix,
)
from autotune.common.output_files import make_folder
from autotune.common.processes import descendants, end_processes
from autotune.common.trial import (
    STDERR_TAIL_CHARS,
    Progress,
    Status,
    TrialResult,
    TrialSpec,
    read_progress,
    spec_to_dict,
    write_json_atomic,
)
from autotune.common.units import GIB, format_bytes_apart
from autotune.execute import build_locks
from autotune.execute.base import Submission
from autotune.execute.launchers import ForkserverLauncher, Launcher, Worker
from autotune.execute.oom_killer import OomWitness
from autotune.execute.worker_log import CappedLog

POLL_S = 0.05
TREE_WALK_S = 0.5
"""Least time between two listings of the worker's descendants when the memory watchdog does
not list them at every poll: a listing reads every process's /proc entry (a few ms)."""


class LocalExecutor:
    """Runs each trial in a worker process of this host (`launcher`: the fork server, or a
    command), watched by this process: its timeout, its memory on CPU, the kernel's OOM killer
    (`oom_witness`, which tests point elsewhere), its whole process group ended with it. The
    trial's files (spec, result, progress, log) are in the folder its submission names."""

    def __init__(
        self,
        launcher: Launcher | None = None,
        oom_witness: Callable[[int], OomWitness] = OomWitness.watch,
    ) -> None:
        self.launcher = launcher or ForkserverLauncher()
        self.oom_witness = oom_witness

    def ready(self) -> None:
        """Nothing to do before a submission: each trial gets its placement's fork server
        ready before its clock starts (`LocalTrial`), the first of each placement started
        then."""

    def submit(self, submission: Submission) -> LocalTrial:
        return LocalTrial(submission, self.launcher, self.oom_witness)


class LocalTrial:
    """A trial in a worker process of this host: started when made, supervised while its
    result is awaited."""

    def __init__(
        self,
        submission: Submission,
        launcher: Launcher,
        oom_witness: Callable[[int], OomWitness],
    ) -> None:
        self.submission = submission
        folder = Path(submission.place)
        if submission.within is None:
            folder.mkdir(parents=True, exist_ok=True)
        else:  # the worker and this process then write in them: spec, log, result, cache
            make_folder(folder, Path(submission.within))
            cache = submission.spec.compile_cache_dir
            if cache and Path(cache).is_relative_to(submission.within):
                make_folder(Path(cache), Path(submission.within))
        spec_path, self.result_path, log_path = (
            folder / n for n in (SPEC_FILE, RESULT_FILE, WORKER_LOG)
        )
        self.log_path = log_path
        self.progress_path = folder / PROGRESS_FILE
        for stale in (self.result_path, self.progress_path):
            stale.unlink(missing_ok=True)
        write_json_atomic(spec_path, spec_to_dict(submission.spec))
        # Flush dirty pages (the study's SQLite commits, logs) now: the kernel writes them
        # back a few seconds later otherwise, and on a small CPU box that stalls the timed
        # steps (CV 11-21% in one trial of six on 2 cores, 2-3% with this).
        os.sync()
        # Outside the clock: a fork server's start is not the trial's time.
        launcher.ready(submission.placement)
        # The worker writes its output into a pipe, copied into worker.log up to a cap.
        self.log = CappedLog(log_path, folder / LOG_PIPE)
        self.started = time.perf_counter()
        self.started_epoch_s = time.time()  # for file times (`build_locks`)
        try:
            self.worker = launcher.start(
                spec_path, self.result_path, self.log.pipe_path, submission.placement
            )
        except BaseException:
            self.log.close()
            raise
        self.witness = oom_witness(self.worker.pid)
        # The worker and every descendant seen while it ran: one whose parent died early (a
        # crashed worker's orphans) is out of the worker's tree by the time the trial ends.
        self.seen = {self.worker.pid: _process(self.worker.pid)}
        self.ended = False

    def progress(self) -> Progress | None:
        return read_progress(self.progress_path)

    def result(self, on_progress: Callable[[Progress], None] | None = None) -> TrialResult:
        s = self.submission
        try:
            verdict = supervise(
                self.worker,
                self.started + s.timeout_s,
                s.memory_limit_bytes,
                self.progress_path,
                on_progress,
                self.seen,
            )
        finally:
            # Also on Ctrl-C: nothing of the trial may outlive it, in whatever session it runs.
            self._end()
        wall_s = time.perf_counter() - self.started
        if verdict is not None:
            result = verdict
            if result.status is Status.TIMEOUT and build_locks.builds_extensions(s.spec):
                stale = build_locks.locks_older_than(self.started_epoch_s)
                result = dataclasses.replace(
                    result, reason=result.reason + build_locks.describe(stale)
                )
        else:
            result = _read_result(self.result_path, self.worker.poll(), self.witness)
        overhead_s = process_s = None
        if result.build_s is not None and result.train_s is not None:
            overhead_s = wall_s - result.build_s - result.train_s
            worker_parts = (result.imports_s, result.cuda_init_s, result.finish_s)
            process_s = overhead_s - sum(s for s in worker_parts if s is not None)
        return dataclasses.replace(
            result,
            wall_s=wall_s,
            device_s=wall_s * s.spec.devices,
            overhead_s=overhead_s,
            process_s=process_s,
            stderr_tail=result.stderr_tail or _tail(self.log_path),
        )

    def cancel(self) -> None:
        """End the trial; a result it wrote is set aside (`result.interrupted.json`): the
        study, not this file, says what a trial measured."""
        self._end()
        set_aside_result(self.result_path.parent)

    def _end(self) -> None:
        if self.ended:
            return
        try:
            end_processes([p for p in self.seen.values() if p is not None])
            _kill_group(self.worker.pid)
            self.worker.reap()
        finally:
            self.ended = True
            self.log.close()
            _remove_temporary_files(self.result_path.parent, self.worker.pid)


def _remove_temporary_files(trial_dir: Path, worker_pid: int) -> None:
    """What a killed worker could not remove: its trial's temporary folder, and the one of the
    system's it kept its sockets in (`layout.socket_folder_prefix`)."""
    sockets = f"{socket_folder_prefix(worker_pid)}*"
    bases = dict.fromkeys((tempfile.gettempdir(), "/tmp", "/var/tmp"))  # the worker's choice
    folders = [
        *trial_dir.glob(f"{TRIAL_TEMP_PREFIX}*"),
        *(found for base in bases for found in Path(base).glob(sockets)),
    ]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def launch_trial(
    spec: TrialSpec,
    trial_dir: Path,
    *,
    timeout_s: float,
    launcher: Launcher,
    rss_limit_bytes: int | None = None,
    oom_witness: Callable[[int], OomWitness] = OomWitness.watch,
    on_progress: Callable[[Progress], None] | None = None,
) -> TrialResult:
    """Run one trial in `trial_dir` and return what happened to it (`LocalExecutor`, for a
    caller with a folder of its own: benchmarks, tests).

    `rss_limit_bytes` turns on the CPU memory watchdog: the worker's process tree may grow by
    that much over the worker's own baseline before it is killed and the trial is `oom`.
    `on_progress` is called in this process with each new progress record of the worker's;
    what it raises ends the trial (the worker is killed) and propagates.
    """
    executor = LocalExecutor(launcher, oom_witness)
    submission = Submission(
        spec=spec, place=str(trial_dir), timeout_s=timeout_s, memory_limit_bytes=rss_limit_bytes
    )
    handle = executor.submit(submission)
    return handle.result(on_progress)


def supervise(
    worker: Worker,
    deadline: float,
    rss_limit_bytes: int | None,
    progress_path: Path,
    on_progress: Callable[[Progress], None] | None = None,
    seen: dict[int, psutil.Process | None] | None = None,
) -> TrialResult | None:
    """Wait for the worker; a TrialResult when the parent ends the trial, None when it exits.

    Each poll reads the worker's progress record (the watchdog's baseline, and `on_progress`
    when the record changed), also once after the worker exited, so its last one is seen.
    The worker's descendants are added to `seen` as they appear."""
    last: Progress | None = None
    peak = 0
    walked_s = -float("inf")
    seen = {} if seen is None else seen
    seen.setdefault(worker.pid, _process(worker.pid))
    while True:
        exited = worker.poll() is not None  # before the read: no record written after it
        progress = read_progress(progress_path)
        if progress is not None and progress != last:
            last = progress
            if on_progress is not None:
                on_progress(progress)
        if exited:
            return None
        if time.perf_counter() > deadline:
            return TrialResult(status=Status.TIMEOUT, reason=timeout_reason(last))
        watching_memory = rss_limit_bytes is not None and last is not None
        if watching_memory or time.perf_counter() - walked_s >= TREE_WALK_S:
            walked_s = time.perf_counter()
            root = seen[worker.pid]
            tree = descendants(root) if root is not None else []
            seen.update((p.pid, p) for p in tree)
        if watching_memory:
            grown = _tree_rss([root, *tree]) - last.baseline_rss_bytes
            peak = max(peak, grown)
            if grown > rss_limit_bytes:
                grown_text, limit_text = format_bytes_apart(grown, rss_limit_bytes)
                return TrialResult(
                    status=Status.OOM,
                    reason=f"memory {grown_text} over the worker's start exceeded "
                    f"memory_budget {limit_text}",
                    peak_memory_gib=peak / GIB,
                )
        time.sleep(POLL_S)


def timeout_reason(last: Progress | None) -> str:
    """Why a trial timed out, with how far it got: its last progress record, or none (it was
    still starting: imports, the device, the data)."""
    if last is None:
        return "no result before trial_timeout; it had not begun building the model"
    return f"no result before trial_timeout; last heard at {last.summary()}"


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None  # exited already


def _tree_rss(processes: list[psutil.Process | None]) -> int:
    """Resident memory of a process and its descendants (DataLoader workers, compilers).

    RSS counts pages shared after fork in each process, so the sum can exceed what the tree
    really holds: the watchdog errs on the side of calling a trial too big.
    """
    total = 0
    for process in processes:
        if process is None:
            continue
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass  # exited between listing and reading
    return total


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone: the normal case after a clean exit


def _read_result(path: Path, returncode: int | None, witness: OomWitness) -> TrialResult:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        if name == "SIGKILL":
            # Not sent by the search. Out of memory only when the kernel says so: anyone may
            # kill -9 a process, and a false OOM steers the search away from a good region.
            evidence = witness.evidence()
            if evidence is not None:
                return TrialResult(
                    status=Status.HOST_OOM,
                    reason=f"worker killed by SIGKILL: the kernel's OOM killer ({evidence})",
                )
            return TrialResult(
                status=Status.CRASHED,
                reason="worker killed by SIGKILL from outside the search "
                "(no sign of the kernel's OOM killer)",
            )
        return TrialResult(status=Status.CRASHED, reason=f"worker killed by {name}")
    try:
        result = TrialResult.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return TrialResult(
            status=Status.CRASHED, reason=f"worker exited with code {returncode} and no result"
        )
    except (json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        return TrialResult(status=Status.CRASHED, reason=f"unreadable result file: {exc}"[:300])
    if returncode != 0 and result.status is Status.OK:
        return dataclasses.replace(
            result, status=Status.CRASHED, reason=f"worker exited with code {returncode}"
        )
    return result


def _tail(path: Path) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - STDERR_TAIL_CHARS))
        return f.read().decode(errors="replace")
