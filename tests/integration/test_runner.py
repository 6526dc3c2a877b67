import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.common.trial import Progress, Stage, Status, TrialSpec, write_progress
from autotune.execute.launchers import CommandLauncher
from autotune.execute.local import launch_trial, supervise
from autotune.execute.oom_killer import OomWitness, read_oom_kills
from tests.conftest import FAKE_WORKER as FAKE


def spec(**params) -> TrialSpec:
    return TrialSpec(
        trial_number=0,
        model_name="tiny",
        model_config={"model_type": "bert"},
        task="sequence-classification",
        seq_len=16,
        device="cpu",
        params={"batch_size": 8, **params},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
    )


def run(mode: str, tmp_path: Path, timeout_s: float = 30, rss_limit_bytes=None, **params):
    return launch_trial(
        spec(**params),
        tmp_path,
        timeout_s=timeout_s,
        launcher=CommandLauncher((sys.executable, FAKE, mode)),
        rss_limit_bytes=rss_limit_bytes,
    )


def test_ok_result_is_read_and_timed(tmp_path):
    result = run("ok", tmp_path)
    assert result.status is Status.OK
    assert result.samples_per_s == 108.0
    assert result.worker_pid not in (None, os.getpid())
    assert result.wall_s > 0
    assert result.overhead_s == pytest.approx(result.wall_s - 0.3)


def test_exception_without_result_is_crashed_with_exit_code_and_log_tail(tmp_path):
    result = run("raise", tmp_path)
    assert result.status is Status.CRASHED
    assert "exited with code 1" in result.reason
    assert "boom in the worker" in result.stderr_tail


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("exit3", "code 3"), ("segfault", "SIGSEGV"), ("garbage", "unreadable result")],
)
def test_a_worker_that_exits_badly_is_crashed_with_the_cause_named(tmp_path, mode, reason):
    result = run(mode, tmp_path)
    assert result.status is Status.CRASHED
    assert reason in result.reason


def test_timeout_kills_the_worker_and_its_children(tmp_path):
    started = time.monotonic()
    result = run("spawn_sleep", tmp_path, timeout_s=3)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started < 15
    grandchild = int((tmp_path / "pid.txt").read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        # A killed child of a killed parent is reaped by init; give it a moment.
        if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    assert not psutil.pid_exists(grandchild) or (
        psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    )


def test_a_stale_result_from_an_earlier_run_is_not_reused(tmp_path):
    assert run("ok", tmp_path).status is Status.OK
    assert run("exit3", tmp_path).status is Status.CRASHED


@pytest.mark.parametrize("mode", ["raise", "segfault", "garbage"])
def test_spec_is_written_for_the_worker(tmp_path, mode):
    run(mode, tmp_path)
    assert (tmp_path / "spec.json").is_file()
    assert (tmp_path / "worker.log").read_text().startswith("fake worker")


def test_growing_past_the_memory_budget_is_oom_and_the_worker_is_killed(tmp_path):
    started = time.monotonic()
    result = run("alloc", tmp_path, rss_limit_bytes=200 * 2**20)
    assert result.status is Status.OOM
    # 200 MiB is 0.1953 GiB: "0.20", or "0.195" or "0.1953" when the growth rounds alike.
    assert re.search(r"exceeded memory_budget 0\.(20|19\d+) GiB", result.reason), result.reason
    assert result.peak_memory_gib > 200 / 1024  # GiB: past the 200 MiB limit
    assert time.monotonic() - started < 20  # killed, not waited for


def test_the_watchdog_is_off_without_a_limit(tmp_path):
    result = run("alloc", tmp_path, timeout_s=3)
    assert result.status is Status.TIMEOUT


@pytest.mark.parametrize(("mode", "status"), [("nan", Status.NAN_LOSS), ("zero", Status.ERROR)])
def test_worker_verdicts_are_kept(tmp_path, mode, status):
    assert run(mode, tmp_path).status is status


def witness_of(counter_file: Path):
    def watch(pid: int) -> OomWitness:
        # A counter file of the test's own, and no kernel log: only what the test arranges.
        return OomWitness(
            pid=pid,
            counter_file=counter_file,
            kills_before=read_oom_kills(counter_file),
            started_s=time.clock_gettime(time.CLOCK_MONOTONIC),
            kmsg=counter_file.parent / "no-kmsg",
        )

    return watch


@pytest.mark.parametrize(
    ("mode", "status", "reason"),
    [
        ("sigkill", Status.CRASHED, "SIGKILL from outside the search (no sign of the kernel's"),
        ("oomkill", Status.HOST_OOM, "the kernel's OOM killer (oom_kill in {events} rose from 0"),
    ],
)
def test_sigkill_is_host_oom_only_when_the_cgroup_oom_kill_counter_rose(
    tmp_path, mode, status, reason
):
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    result = launch_trial(
        spec(),
        tmp_path,
        timeout_s=30,
        oom_witness=witness_of(events),
        launcher=CommandLauncher((sys.executable, FAKE, mode)),
    )
    assert result.status is status
    assert reason.format(events=events) in result.reason


def test_the_launcher_is_made_ready_before_the_trial_clock_starts(tmp_path):
    class SlowToStart(CommandLauncher):
        """Like the fork server: the first start waits for imports unless made ready first."""

        def __init__(self, command):
            super().__init__(command)
            self.warm = False

        def ready(self, placement) -> None:
            if not self.warm:
                time.sleep(2)
                self.warm = True

        def start(self, *paths_and_placement):
            self.ready(paths_and_placement[-1])
            return super().start(*paths_and_placement)

    result = launch_trial(
        spec(), tmp_path, timeout_s=1, launcher=SlowToStart((sys.executable, FAKE, "sleep"))
    )
    assert result.status is Status.TIMEOUT
    assert result.wall_s < 1 + 2


def test_a_budget_below_ten_mib_is_not_written_as_zero_gib(tmp_path):
    result = run("alloc", tmp_path, rss_limit_bytes=5 * 2**20)
    assert result.status is Status.OOM
    assert "exceeded memory_budget 5.0 MiB" in result.reason


def test_each_new_progress_record_reaches_on_progress_the_last_one_included(tmp_path):
    seen: list[Progress] = []
    result = launch_trial(
        spec(),
        tmp_path,
        timeout_s=30,
        on_progress=seen.append,
        launcher=CommandLauncher((sys.executable, FAKE, "progress")),
    )
    assert result.status is Status.OK
    steps = [p.step for p in seen]
    assert steps == sorted(steps) and len(set(seen)) == len(seen), "an old record came twice"
    assert seen[-1].step == seen[-1].total_steps == 3  # written just before the worker exited
    assert seen[0].stage is Stage.BUILDING and seen[0].eta_s is None
    assert seen[-1].stage is Stage.MEASURING and seen[-1].eta_s == 0
    assert "step 3/3 (measuring)" in (tmp_path / "worker.log").read_text()


def test_an_exception_in_on_progress_ends_the_trial_and_propagates(tmp_path):
    class Remembering(CommandLauncher):
        def start(self, *paths):
            self.worker = super().start(*paths)
            return self.worker

    def interrupt(progress: Progress) -> None:
        raise KeyboardInterrupt  # as Ctrl-C in the middle of the display

    launcher = Remembering((sys.executable, FAKE, "alloc"))  # lingers 60 s unless killed
    with pytest.raises(KeyboardInterrupt):
        launch_trial(spec(), tmp_path, timeout_s=30, launcher=launcher, on_progress=interrupt)
    assert launcher.worker.poll() == -signal.SIGKILL


class Exited:
    pid = 0

    def poll(self) -> int | None:
        return 0

    def reap(self) -> None:
        pass


@pytest.mark.parametrize("text", ["", "{not json", '{"baseline_rss_bytes": 1, "sta'])
def test_an_unreadable_progress_file_is_no_record_and_supervision_goes_on(tmp_path, text):
    (tmp_path / "progress.json").write_text(text)
    seen: list[Progress] = []
    deadline = time.perf_counter() + 5
    verdict = supervise(Exited(), deadline, 2**20, tmp_path / "progress.json", seen.append)
    assert verdict is None  # the worker's exit decides, as without a progress file
    assert seen == []


class Running(Exited):
    pid = os.getpid()

    def poll(self) -> int | None:
        return None


def test_a_timeout_says_how_far_the_trial_got(tmp_path):
    """The last progress record read, or none: the deadline has passed at the first poll."""
    progress_path = tmp_path / "progress.json"
    starting = supervise(Running(), 0.0, None, progress_path)
    assert starting.status is Status.TIMEOUT
    assert starting.reason == "no result before trial_timeout; it had not begun building the model"
    record = Progress(
        baseline_rss_bytes=1, stage=Stage.BUILDING, step=0, total_steps=13, elapsed_s=41.23
    )
    write_progress(progress_path, record)
    building = supervise(Running(), 0.0, None, progress_path)
    assert building.reason == (
        "no result before trial_timeout; last heard at step 0/13 (building) 41.2 s elapsed"
    )


def test_a_timeout_names_a_build_lock_older_than_the_trial(tmp_path, monkeypatch):
    """DeepSpeed's kernels build under torch's lock: one left by a killed process makes every
    later build wait, silently, until the trial's timeout."""
    extensions = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    stale = extensions / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fresh = extensions / "cpu_adam" / "lock"  # a build that began during the trial
    fresh.parent.mkdir()
    fresh.touch()
    os.utime(fresh, (time.time() + 3600, time.time() + 3600))
    result = run("sleep", tmp_path / "trial", timeout_s=2, strategy="zero2")
    assert result.status is Status.TIMEOUT
    assert f"older than this trial is still there ({stale})" in result.reason
    assert "remove it if no build is running" in result.reason
    assert "cpu_adam" not in result.reason
    # A trial that builds no extension (no DeepSpeed) is not told of the lock.
    assert "lock" not in run("sleep", tmp_path / "plain", timeout_s=2).reason
    stale.unlink()
    assert "lock" not in run("sleep", tmp_path / "again", timeout_s=2, strategy="zero2").reason
