"""What a trial leaves outside its folder and prints beside its work: no temporary folder in
$TMPDIR however it ends, and no import-time lines about nothing a trial does (torchao's kernel
libraries, torch's pytree notices) in its log or on the search's terminal. Real CPU trials."""

import contextlib
import enum
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from autotune.child import quiet_imports
from autotune.common.models import resolve_model
from autotune.common.trial import Progress, Stage, Status, TrialSpec
from autotune.execute.launchers import CommandLauncher
from autotune.execute.local import launch_trial
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow
LEFTOVER = re.compile(r"autotune-trainer-|pymp-|autotune-mp-")
IMPORT_NOISE = re.compile(r"_pytree|Failed to load")


class EndedByTheSearch(Exception):
    """What `on_progress` raises to end a trial mid-measurement."""


def spec(measure_steps: int) -> TrialSpec:
    model = resolve_model(TINY_MODEL)
    return TrialSpec(
        trial_number=0,
        model_name=model.name,
        model_config=model.config,
        task="sequence-classification",
        seq_len=16,
        device="cpu",
        # DataLoader workers: the processes that open multiprocessing's socket folders.
        params={"batch_size": 8, "precision": "fp32", "optim": "sgd", "dataloader_num_workers": 2},
        warmup_steps=1,
        measure_steps=measure_steps,
        seed=0,
    )


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if LEFTOVER.match(p.name))


@pytest.fixture
def tmpdir_of_trials(tmp_path, monkeypatch):
    """An empty $TMPDIR, which a worker started as a fresh process inherits."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def end_when_measuring(progress: Progress) -> None:
    if progress.stage is Stage.MEASURING:
        raise EndedByTheSearch


def test_a_finished_trial_leaves_no_temporary_folder_in_tmpdir_nor_import_noise_in_its_log(
    tmp_path, tmpdir_of_trials
):
    # Started as a fresh process, the worker imports the Trainer itself, its log open.
    result = launch_trial(
        spec(measure_steps=2), tmp_path / "trial", timeout_s=300, launcher=CommandLauncher()
    )
    assert result.status is Status.OK, result.reason + result.stderr_tail
    assert leftovers(tmpdir_of_trials) == []
    log = (tmp_path / "trial" / "worker.log").read_text()
    assert "step 3/3" in log  # the log is the trial's
    assert not IMPORT_NOISE.search(log), log


def test_a_trial_killed_mid_measurement_leaves_no_temporary_folder_in_tmpdir(
    tmp_path, tmpdir_of_trials
):
    with pytest.raises(EndedByTheSearch):  # the worker is SIGKILLed: none of its code runs
        launch_trial(
            spec(measure_steps=100_000),
            tmp_path / "trial",
            timeout_s=300,
            launcher=CommandLauncher(),
            on_progress=end_when_measuring,
        )
    assert leftovers(tmpdir_of_trials) == []


@pytest.fixture(scope="module")
def timed_out_search(tmp_path_factory):
    """A search (trials forked from its fork server) whose one trial is killed at its
    timeout, run with an empty $TMPDIR: (that folder, what the terminal showed)."""
    root = tmp_path_factory.mktemp("timed-out")
    system_tmp = root / "system-tmp"
    system_tmp.mkdir()
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={TINY_MODEL}",
        "seq_len=16",
        "n_trials=1",
        "warmup_steps=1",
        "measure_steps=100000",
        "trial_timeout=20s",
        "force=true",
        "confirm_rounds=0",
        f"out={root / 'out'}",
        "study=s",
    ]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(system_tmp)},
    )
    assert "timeout: no result before trial_timeout" in proc.stdout, proc.stdout + proc.stderr
    return system_tmp, proc.stdout + proc.stderr


def test_a_timed_out_trial_of_a_search_leaves_no_temporary_folder_in_tmpdir(timed_out_search):
    system_tmp, _ = timed_out_search
    assert leftovers(system_tmp) == []


def test_a_search_terminal_shows_no_import_noise(timed_out_search):
    _, terminal = timed_out_search
    assert not IMPORT_NOISE.search(terminal), terminal


class Precision(enum.Enum):
    FP8 = "fp8"


def test_only_the_import_noise_is_dropped(monkeypatch, caplog):
    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    for logger in (torchao, pytree, bnb):
        monkeypatch.setattr(logger, "filters", [])  # this process's loggers as they were
    quiet_imports.install()
    enum_notice = "%s is an Enum subclass and is now natively supported by torch.compile"
    kernel_enum = enum.Enum("KernelPreference", "AUTO", module="torchao.quantization")
    with caplog.at_level(logging.WARNING):
        torchao.warning("Failed to load /venv/torchao/_C_mxfp8.so: Could not load this library")
        pytree.warning(enum_notice, kernel_enum)
        torchao.warning("Skipping import of cpp extensions due to incompatible torch version")
        pytree.warning(enum_notice, Precision)  # the user's own Enum: still told
        bnb.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure "
            "you already `pip install kernels` and the kernels >= 0.11.1",
            ModuleNotFoundError("No module named 'kernels'"),
        )
    assert caplog.messages == [
        "Skipping import of cpp extensions due to incompatible torch version",
        enum_notice % Precision,
    ]


def test_the_device_probe_run_alone_prints_none_of_its_imports_noise():
    """`python -m autotune.child.probe` (what a search runs first, and what a GPU check runs
    by hand) prints its facts, without the lines torchao's import logs."""
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.child.probe"], capture_output=True, text=True, check=True
    )
    assert json.loads(proc.stdout)["cpu_name"]
    assert not IMPORT_NOISE.search(proc.stderr), proc.stderr


def test_the_socket_folder_of_a_search_killed_with_sigkill_is_removed_by_the_next_one(
    tmp_path, request
):
    """kill -9 of a search runs none of its exit code: its fork server's socket folder stays
    in $TMPDIR (once a `pymp-*` nothing removed), until the next search starts its own."""
    # A short $TMPDIR: room for the sockets' paths in it (a deep one would send them to /tmp).
    system_tmp = Path(tempfile.mkdtemp(prefix="tmpdir-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(system_tmp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(system_tmp)}
    command = [sys.executable, "-m", "autotune", "search", f"model={TINY_MODEL}", "seq_len=16",
               "n_trials=1", "warmup_steps=1", "measure_steps=100000", "force=true",
               "confirm_rounds=0", f"out={tmp_path / 'out'}", "study=s"]  # fmt: skip
    search = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        progress = tmp_path / "out" / "s" / "trials" / "0000" / "progress.json"
        while not progress.exists():  # its trial, forked from its fork server, trains
            assert search.poll() is None, search.stderr.read()
            time.sleep(0.2)
        started = psutil.Process(search.pid).children(recursive=True)  # its trial's too
    finally:
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()
    for process in started:  # as an OOM killer or a node's hard stop ends every one
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(started, timeout=60)
    # The search's and its trial's (whose trial folder is too deep for a socket's path).
    left = leftovers(system_tmp)
    assert left and all(name.startswith("autotune-mp-") for name in left), left
    # What the next search does as it starts its fork server:
    claim = "from autotune.common import socket_folders; print(socket_folders.claim())"
    mine = subprocess.run([sys.executable, "-c", claim], env=env, capture_output=True, text=True)
    assert mine.returncode == 0, mine.stderr
    assert leftovers(system_tmp) == []  # the dead one's removed, and the new one's at its exit
