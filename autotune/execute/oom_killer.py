"""Evidence that the kernel's OOM killer ended a worker (parent side).

A worker that dies of SIGKILL the search did not send was killed by someone: the kernel's OOM
killer, a cluster agent, a user with `kill -9`. Only the first says something about memory, and
telling Optuna "out of memory" without cause steers the search away from a good region. So a
trial is `host_oom` only with evidence from the kernel itself:

- the `oom_kill` counter of the worker's memory cgroup (cgroup v2 `memory.events`, v1
  `memory.oom_control`) rose while the trial ran; or
- the kernel log (`/dev/kmsg`, where readable) names the worker's pid as killed for memory.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = Path("/dev/kmsg")
_KMSG_RECORD_BYTES = 8192  # /dev/kmsg hands out one record per read; records are < 1 KiB
_CLOCK_SLACK_S = 1.0  # the kernel log's clock and CLOCK_MONOTONIC may differ by a little


def oom_kill_counter_file(pid: int, cgroup_root: Path = CGROUP_ROOT) -> Path | None:
    """The file holding the `oom_kill` counter of `pid`'s memory cgroup, if there is one."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None  # gone already, or not Linux
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2: one unified hierarchy
            candidates = [cgroup_root / relative / "memory.events", cgroup_root / "memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1: the memory controller's own
            v1 = cgroup_root / "memory"
            candidates = [v1 / relative / "memory.oom_control", v1 / "memory.oom_control"]
        else:
            continue
        # Inside a container the listed path may be the host's; the mount root is then the
        # container's own cgroup.
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    return None


def read_oom_kills(path: Path | None) -> int | None:
    """The `oom_kill N` line of a cgroup memory file; None when it cannot be read."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def kernel_log_oom_kill(pid: int, since_s: float, kmsg: Path = KMSG) -> str | None:
    """The kernel log line saying `pid` was killed for memory at or after `since_s`
    (CLOCK_MONOTONIC), or None when there is none or the log is not readable."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None  # not Linux, or not allowed (dmesg_restrict, no privileges)
    pattern = re.compile(rf"(Killed process {pid} |oom-kill:.*\bpid={pid}\b)")
    found = None
    try:
        while True:
            try:
                record = os.read(fd, _KMSG_RECORD_BYTES)
            except BlockingIOError:
                break  # read to the end of the log
            except BrokenPipeError:
                continue  # records were overwritten while reading: go on with the next
            if not record:
                break
            header, _, message = record.decode(errors="replace").partition(";")
            fields = header.split(",")
            if len(fields) < 3 or not pattern.search(message):
                continue
            if int(fields[2]) / 1e6 >= since_s - _CLOCK_SLACK_S:
                found = message.strip().splitlines()[0]
    finally:
        os.close(fd)
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class OomWitness:
    """Watches one worker from its start: was it killed by the kernel's OOM killer?"""

    pid: int
    counter_file: Path | None
    kills_before: int | None
    started_s: float
    kmsg: Path = KMSG

    @classmethod
    def watch(cls, pid: int, *, cgroup_root: Path = CGROUP_ROOT, kmsg: Path = KMSG) -> OomWitness:
        counter_file = oom_kill_counter_file(pid, cgroup_root)
        return cls(
            pid=pid,
            counter_file=counter_file,
            kills_before=read_oom_kills(counter_file),
            started_s=time.clock_gettime(time.CLOCK_MONOTONIC),
            kmsg=kmsg,
        )

    def evidence(self) -> str | None:
        """What shows the OOM killer struck during the trial, or None."""
        after = read_oom_kills(self.counter_file)
        if self.kills_before is not None and after is not None and after > self.kills_before:
            return f"oom_kill in {self.counter_file} rose from {self.kills_before} to {after}"
        line = kernel_log_oom_kill(self.pid, self.started_s, self.kmsg)
        return f"kernel log: {line}" if line else None
