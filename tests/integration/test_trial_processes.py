"""What a trial with the user's own Trainer factory (`trainer=file.py:fn`) may and may not do:
real trials of the tiny model, started as a search starts them."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.execute.worker_log import LOG_CAP_BYTES
from autotune.plan import factories
from tests.conftest import TINY_MODEL

FACTORY_HEAD = """
import transformers
from autotune.child.data import SyntheticDataset


def tiny_trainer(args, model_kwargs):
    config = transformers.BertConfig(
        vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=2,
    )
    model = transformers.AutoModelForSequenceClassification.from_config(config, **model_kwargs)
    data = SyntheticDataset(
        task="sequence-classification", vocab_size=500, seq_len=16, n_samples=256, seed=0
    )
    return transformers.Trainer(model=model, args=args, train_dataset=data)
"""


@pytest.fixture(scope="module")
def launcher():
    return ForkserverLauncher()


def factory_spec(factory: Path, function: str) -> TrialSpec:
    model = resolve_model(TINY_MODEL)
    return TrialSpec(
        trial_number=0,
        model_name=model.name,
        model_config=model.config,
        task="sequence-classification",
        seq_len=16,
        device="cpu",
        params={"batch_size": 8, "precision": "fp32", "optim": "sgd"},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
        trainer=f"{factory}:{function}",
        trainer_dir=str(factory.parent),
    )


def write_factory(folder: Path, body: str) -> Path:
    path = folder / "factory.py"
    path.write_text(FACTORY_HEAD + textwrap.dedent(body))
    return path


def run_factory(tmp_path: Path, launcher, body: str, function: str):
    factory = write_factory(tmp_path, body)
    return launch_trial(
        factory_spec(factory, function), tmp_path / "trial", timeout_s=300, launcher=launcher
    )


def test_a_factory_trial_that_keeps_its_args_is_ok(tmp_path, launcher):
    result = run_factory(tmp_path, launcher, "", "tiny_trainer")
    assert result.status is Status.OK, result.reason + result.stderr_tail


def test_a_factory_that_edits_its_args_in_place_is_an_error_naming_the_fields(tmp_path, launcher):
    body = """
    def halves_the_batch(args, model_kwargs):
        args.per_device_train_batch_size = 4  # the same object autotune handed over
        return tiny_trainer(args, model_kwargs)
    """
    result = run_factory(tmp_path, launcher, body, "halves_the_batch")
    assert result.status is Status.ERROR, result.reason
    assert "per_device_train_batch_size=4 (tuned: 8)" in result.reason


def test_a_factory_that_trains_with_other_args_is_an_error_naming_the_fields(tmp_path, launcher):
    body = """
    import dataclasses

    def other_args(args, model_kwargs):
        return tiny_trainer(dataclasses.replace(args, max_steps=50), model_kwargs)
    """
    result = run_factory(tmp_path, launcher, body, "other_args")
    assert result.status is Status.ERROR, result.reason
    assert "max_steps=50 (tuned: 3)" in result.reason


def test_a_factory_file_importing_a_sibling_module_passes_the_check_and_its_trials(
    tmp_path, launcher
):
    project = tmp_path / "project"  # neither the search's nor the check's working directory
    project.mkdir()
    (project / "sibling.py").write_text("BATCH_NOTE = 'from the sibling module'\n")
    body = """
    import sibling

    def with_sibling(args, model_kwargs):
        print(sibling.BATCH_NOTE, flush=True)
        return tiny_trainer(args, model_kwargs)
    """
    factory = write_factory(project, body)
    factories.check_in_subprocess(f"{factory}:with_sibling", tmp_path)
    result = launch_trial(
        factory_spec(factory, "with_sibling"),
        tmp_path / "trial",
        timeout_s=300,
        launcher=launcher,
    )
    assert result.status is Status.OK, result.reason + result.stderr_tail
    assert "from the sibling module" in (tmp_path / "trial" / "worker.log").read_text()


def test_a_factory_whose_import_hangs_stops_the_check_with_a_clear_message(tmp_path):
    factory = tmp_path / "hangs.py"
    factory.write_text("import time\n\ntime.sleep(3600)\n\ndef make(args, model_kwargs): ...\n")
    with pytest.raises(factories.FactoryError, match=re.escape("did not finish within 5 s")):
        factories.check_in_subprocess(f"{factory}:make", tmp_path, timeout_s=5)


STARTS_CHILDREN = """
import os
import subprocess
import time

PIDS = os.path.join(os.path.dirname(__file__), "pids")


def _note(pid):
    with open(PIDS, "a") as f:
        f.write(f"{pid}\\n")


def _start_children():
    _note(subprocess.Popen(["sleep", "1000"]).pid)
    _note(subprocess.Popen(["sleep", "1000"], start_new_session=True).pid)
    middle = os.fork()
    if middle == 0:  # a double fork: the middle process exits, its child lives on
        grandchild = os.fork()
        if grandchild == 0:
            os.setsid()
            os.execvp("sleep", ["sleep", "1000"])
        _note(grandchild)
        os._exit(0)
    os.waitpid(middle, 0)


def with_children(args, model_kwargs):
    _start_children()
    return tiny_trainer(args, model_kwargs)


def with_children_then_hangs(args, model_kwargs):
    _start_children()
    time.sleep(3600)
"""

SAFETY_LIMIT_S = 120  # a safety net against a hung test, not the thing tested


def started_pids(path: Path, count: int = 3) -> list[int]:
    deadline = time.monotonic() + SAFETY_LIMIT_S
    while time.monotonic() < deadline:
        pids = [int(p) for p in path.read_text().split()] if path.exists() else []
        if len(pids) >= count:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"the factory started {pids}, not {count} children")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: list[int]) -> list[int]:
    """The pids still running once everything had the safety limit to end."""
    deadline = time.monotonic() + SAFETY_LIMIT_S
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in pids if _alive(p)]
    for pid in alive:  # leave nothing behind on this machine
        os.kill(pid, signal.SIGKILL)
    return alive


def test_processes_a_factory_starts_in_any_session_end_with_its_trial(tmp_path, launcher):
    pids_file = tmp_path / "pids"  # where the factory notes them: next to itself
    factory = write_factory(tmp_path, STARTS_CHILDREN)
    result = launch_trial(
        factory_spec(factory, "with_children"),
        tmp_path / "trial",
        timeout_s=300,
        launcher=launcher,
    )
    assert result.status is Status.OK, result.reason + result.stderr_tail
    assert still_alive(started_pids(pids_file)) == []


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_processes_a_factory_starts_end_when_the_search_is_killed(tmp_path, signum):
    pids_file = tmp_path / "pids"
    factory = write_factory(tmp_path, STARTS_CHILDREN)
    search = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            f"model={TINY_MODEL}",
            "seq_len=16",
            "n_trials=2",
            f"trainer={factory}:with_children_then_hangs",
            f"out={tmp_path}",
            "confirm_rounds=0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pids = started_pids(pids_file)
    finally:
        search.send_signal(signum)
        search.wait(timeout=SAFETY_LIMIT_S)
    assert still_alive(pids) == []


def test_a_factory_printing_far_more_than_the_cap_leaves_a_capped_log_with_its_tail(
    tmp_path, launcher
):
    body = f"""
    import sys

    def floods_then_fails(args, model_kwargs):
        line = "x" * 1023 + "\\n"
        for _ in range({3 * LOG_CAP_BYTES // 1024}):
            sys.stdout.write(line)
        print("the last line printed", flush=True)
        raise ValueError("the end of the log")
    """
    result = run_factory(tmp_path, launcher, body, "floods_then_fails")
    assert result.status is Status.ERROR and "the end of the log" in result.reason
    log = tmp_path / "trial" / "worker.log"
    assert log.stat().st_size <= LOG_CAP_BYTES
    assert log.read_text().endswith("the last line printed\n")
    assert not (tmp_path / "trial" / "worker.pipe").exists()
