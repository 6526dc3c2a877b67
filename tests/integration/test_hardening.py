"""The sandbox and the study under attack, with real processes: kill -9 of the search, a second
search on a live study, the first trial's timeout, the kernel's OOM killer."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.common.trial import Status, TrialSpec
from autotune.execute.launchers import CommandLauncher
from autotune.execute.local import launch_trial
from autotune.execute.oom_killer import OomWitness
from autotune.store.study_lock import StudyLock
from tests.conftest import FAKE_WORKER as FAKE
from tests.conftest import TINY_MODEL
from tests.processes import alive, command_of, tree

pytestmark = pytest.mark.slow
LOADER_SPACE = """
description: one config whose trial reads batches through two DataLoader worker processes
device: any
knobs:
  batch_size: {choices: [8]}
  precision: fp32
  optim: sgd
  dataloader_num_workers: 2
"""
LONG = "measure_steps=20000"  # hours of training: only a kill or a timeout ends such a trial


def search_command(out: Path, *extra: str) -> list[str]:
    steps = [] if LONG in extra else ["measure_steps=2"]
    return [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "warmup_steps=1",
        *steps,
        f"out={out}",
        "study=s",
        "confirm_rounds=0",
        *extra,
    ]


@pytest.fixture
def start():
    """Starts searches in sessions of their own; whatever a failed test leaves is killed."""
    started: list[subprocess.Popen] = []

    def popen(command: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    yield popen
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def wait_for(condition, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not _holds(condition):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _holds(condition) -> bool:
    try:
        return condition()
    except psutil.NoSuchProcess:  # a process listed a moment ago has ended since (the probe)
        return False


def test_kill_9_of_the_search_ends_every_process_it_started_within_two_seconds(tmp_path, start):
    space = tmp_path / "loader.yaml"
    space.write_text(LOADER_SPACE)
    # The baseline (no loader workers) first, so trial 1 is the one: under the same measurement
    # conditions as the search below (a study keeps them), cut short by trial_timeout.
    first = subprocess.run(
        search_command(
            tmp_path, f"space={space}", "n_trials=1", LONG, "trial_timeout=3s", "force=true"
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert first.returncode == 3, first.stderr  # nothing to recommend: the baseline timed out
    search = start(search_command(tmp_path, f"space={space}", "n_trials=2", LONG))
    # Running trial 1: the fork server's child (the worker) has its two DataLoader workers.
    wait_for(lambda: any(len(p.children()) >= 2 for p in tree(search.pid)), search)
    processes = {p.pid for p in tree(search.pid)}
    assert len(processes) >= 4, "fork server, worker and two loader workers at least"

    search.kill()
    search.wait(timeout=10)
    killed_at = time.monotonic()
    while alive(processes) and time.monotonic() < killed_at + 2:
        time.sleep(0.05)
    survivors = [command_of(p) for p in alive(processes)]
    assert not survivors, f"still running 2 s after the search died: {survivors}"
    with StudyLock.acquire(tmp_path / "s", "s"):  # and the study's lock went with it
        pass


def test_a_second_search_on_a_live_study_is_refused_and_the_first_goes_on(tmp_path, start):
    first = start(search_command(tmp_path, "n_trials=1", LONG))
    wait_for(lambda: (tmp_path / "s" / "trials" / "0000" / "progress.json").exists(), first)

    second = subprocess.run(
        search_command(tmp_path, "n_trials=1", LONG),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid} on host" in second.stderr
    assert "being searched right now" in second.stderr

    storage = f"sqlite:///file:{tmp_path / 's' / 'study.db'}?mode=ro&uri=true"
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state.name for t in study.trials] == ["RUNNING"], "the live trial was touched"
    assert first.poll() is None, "the first search died"
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=600)  # a safety net on a loaded machine, not a bound
    assert first.returncode == 130
    assert "Traceback" not in stderr
    assert (tmp_path / "s" / "report.html").is_file()


def test_two_searches_started_together_one_runs_and_one_is_refused(tmp_path, start):
    command = search_command(tmp_path, "n_trials=1")
    searches = [start(command) for _ in range(2)]
    errors = [p.communicate(timeout=300)[1] for p in searches]
    outcomes = sorted((p.returncode, err) for p, err in zip(searches, errors, strict=True))
    assert [code for code, _ in outcomes] == [0, 2], outcomes
    assert "being searched right now" in outcomes[1][1]
    assert "Traceback" not in outcomes[0][1] + outcomes[1][1]


def test_the_first_trial_ends_within_trial_timeout_although_the_fork_server_starts_first(
    tmp_path,
):
    proc = subprocess.run(
        search_command(tmp_path, "n_trials=1", LONG, "trial_timeout=3s", "force=true"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr  # nothing to recommend: the only trial timed out
    storage = f"sqlite:///file:{tmp_path / 's' / 'study.db'}?mode=ro&uri=true"
    (trial,) = optuna.load_study(study_name="s", storage=storage).trials
    result = trial.user_attrs["result"]
    assert result["status"] == "timeout"
    assert result["wall_s"] < 3 + 2, "the fork server's start was charged to the first trial"


def memory_cgroup(limit_bytes: int) -> Path:
    """A new memory cgroup below this process's own, capped at `limit_bytes`."""
    own = Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines()
    for line in own:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            parent = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            parent = parent if parent.is_dir() else Path("/sys/fs/cgroup/memory")
            files = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            parent = Path("/sys/fs/cgroup") / path.lstrip("/")
            files = ("memory.max", "memory.swap.max")
        else:
            continue
        group = parent / f"autotune-test-{os.getpid()}"
        try:
            group.mkdir()
            for name in files:
                if (group / name).exists():
                    (group / name).write_text("0" if "swap.max" in name else str(limit_bytes))
        except OSError as exc:
            problem = str(exc)
            break
        return group
    else:
        problem = "no memory controller found"
    reason = f"needs a memory cgroup this user can create (root; cgroup v1 or v2): {problem}"
    if os.environ.get("CI"):
        pytest.fail(reason)  # CI runs as root on Linux: it must not skip this
    pytest.skip(reason)


class InCgroup(CommandLauncher):
    """Starts the worker, then moves it into a small memory cgroup before it allocates."""

    def __init__(self, command, cgroup: Path):
        super().__init__(command)
        object.__setattr__(self, "cgroup", cgroup)

    def start(self, *paths):
        worker = super().start(*paths)
        (self.cgroup / "cgroup.procs").write_text(str(worker.pid))
        return worker


def test_a_worker_the_kernel_oom_killer_ends_is_host_oom_with_the_evidence(tmp_path):
    group = memory_cgroup(200 * 2**20)
    spec = TrialSpec(
        trial_number=0,
        model_name="tiny",
        model_config={"model_type": "bert"},
        task="sequence-classification",
        seq_len=16,
        device="cpu",
        params={"batch_size": 8},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
    )
    try:
        result = launch_trial(
            spec,
            tmp_path,
            timeout_s=60,
            launcher=InCgroup((sys.executable, FAKE, "hog"), group),
            oom_witness=OomWitness.watch,
        )
    finally:
        group.rmdir()
    assert result.status is Status.HOST_OOM, result.reason
    assert "the kernel's OOM killer" in result.reason
    assert "oom_kill in" in result.reason or "kernel log:" in result.reason
