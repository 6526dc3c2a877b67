"""Parent side of a trial: start the worker in a session of its own, enforce the timeout, read
the result. The trial's fate comes from the exit code and the result file, never from stderr;
the stderr tail is kept only to show the user.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.trial import Status, TrialResult, TrialSpec, spec_to_dict, write_json_atomic

WORKER_COMMAND = (sys.executable, "-m", "autotune.worker")
STDERR_TAIL_CHARS = 4000


def run_trial(
    spec: TrialSpec,
    trial_dir: Path,
    *,
    timeout_s: float,
    command: tuple[str, ...] = WORKER_COMMAND,
) -> TrialResult:
    """Run one trial as `command SPEC RESULT` and return what happened to it."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (
        trial_dir / "spec.json",
        trial_dir / "result.json",
        trial_dir / "worker.log",
    )
    result_path.unlink(missing_ok=True)
    write_json_atomic(spec_path, spec_to_dict(spec))

    started = time.perf_counter()
    with open(log_path, "wb") as log:
        # A new session makes the worker the leader of its own process group, so a timeout
        # can kill it together with its DataLoader workers and compile subprocesses, by id.
        proc = subprocess.Popen(
            [*command, str(spec_path), str(result_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
    wall_s = time.perf_counter() - started
    tail = _tail(log_path)

    if timed_out:
        result = TrialResult(status=Status.TIMEOUT, reason=f"no result after {timeout_s:.0f} s")
    else:
        result = _read_result(result_path, returncode)
    return _with(result, wall_s=wall_s, stderr_tail=result.stderr_tail or tail)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill whatever is left of the worker's process group and reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already gone: the normal case after a clean exit
    proc.wait()


def _read_result(path: Path, returncode: int) -> TrialResult:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        status = Status.HOST_OOM if name == "SIGKILL" else Status.CRASHED
        why = " (the kernel's OOM killer sends SIGKILL)" if status is Status.HOST_OOM else ""
        return TrialResult(status=status, reason=f"worker killed by {name}{why}")
    try:
        result = TrialResult.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return TrialResult(
            status=Status.CRASHED, reason=f"worker exited with code {returncode} and no result"
        )
    except (json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        return TrialResult(status=Status.CRASHED, reason=f"unreadable result file: {exc}"[:300])
    if returncode != 0 and result.status is Status.OK:
        return _with(result, status=Status.CRASHED, reason=f"worker exited with code {returncode}")
    return result


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - STDERR_TAIL_CHARS))
        return f.read().decode(errors="replace")


def _with(result: TrialResult, **changes: object) -> TrialResult:
    return dataclasses.replace(result, **changes)
