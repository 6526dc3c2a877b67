"""The parent's defences, in process: the study lock, other searches' trials, study names and
model types checked before any trial, stored budgets, stale results set aside."""

import json
import os
import socket

import optuna
import psutil
import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError, StudyError
from autotune.common.layout import INTERRUPTED_RESULT
from autotune.common.units import format_bytes, format_gib
from autotune.plan.config import load_config
from autotune.plan.plan import default_study_name, make_plan
from autotune.search.opening import locked_study
from autotune.search.recovery import recover
from autotune.store.records import OWNER_ATTR, RUN_ATTR, run_info
from autotune.store.study_lock import StudyLock
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False, name="cpu", total_memory_bytes=2**34, free_memory_bytes=2**34,
    cpu_name="cpu", host_available_memory_bytes=2**34, transformers_version="5.x",
    model_types=("bert", "gpt2", "t5"),
    task_model_types={"seq2seq": ("t5",), "sequence-classification": ("bert", "gpt2", "t5")},
)  # fmt: skip


def plan_for(tmp_path, *overrides):
    return make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}", *overrides]), CPU)


def test_a_second_lock_on_a_study_is_refused_naming_the_holder(tmp_path):
    with StudyLock.acquire(tmp_path, "s"):
        with pytest.raises(StudyError) as refused:
            StudyLock.acquire(tmp_path, "s")  # another open file: flock refuses it too
        message = str(refused.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
        assert "study s is being searched right now" in message
        assert f"To add a worker to it: autotune worker study=s out={tmp_path.parent}" in message
    with StudyLock.acquire(tmp_path, "s"):  # released on exit: free again
        pass


def test_a_locked_study_refuses_a_second_search_and_leaves_its_folder(tmp_path):
    plan = plan_for(tmp_path, "study=s")
    with locked_study(plan) as (study, _):
        with pytest.raises(StudyError, match="being searched right now"), locked_study(plan):
            pass
        assert study.study_name == "s"
    assert (tmp_path / "s" / "study.db").is_file()


@pytest.mark.parametrize(
    ("storage", "says"),
    [
        ("not-a-url", "cannot open it: ArgumentError"),
        ("nosuchdb://x/y", "cannot open it: NoSuchModuleError"),
        ("mysql://u:secret@127.0.0.1:1/db", "No module named 'MySQLdb'"),
    ],
)
def test_a_bad_storage_is_one_error_and_leaves_no_study_folder(tmp_path, storage, says):
    plan = plan_for(tmp_path, "study=s", f"storage={storage}")
    with pytest.raises(StudyError, match=says) as error, locked_study(plan):
        pass
    assert "secret" not in str(error.value)  # passwords are masked
    assert not (tmp_path / "s").exists()


def test_an_out_folder_that_cannot_hold_a_study_is_one_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    plan = plan_for(blocker, "study=s")
    with pytest.raises(StudyError, match="cannot create the study folder"), locked_study(plan):
        pass


def test_a_resumed_study_keeps_its_budget_and_refuses_another(tmp_path):
    with locked_study(plan_for(tmp_path, "study=s", "memory_budget=256MiB")) as (_, plan):
        assert plan.info.memory_budget_bytes == 256 * 2**20
    # Without memory_budget= the free memory would decide; the stored budget wins.
    with locked_study(plan_for(tmp_path, "study=s")) as (study, plan):
        assert plan.info.memory_budget_bytes == 256 * 2**20
        assert run_info(study).memory_budget_bytes == 256 * 2**20
    with (
        pytest.raises(StudyError, match=r"memory_budget=0.50 GiB: .* budget of 0.25 GiB"),
        locked_study(plan_for(tmp_path, "study=s", "memory_budget=512MiB")),
    ):
        pass


def test_the_effective_batch_setting_is_part_of_the_study(tmp_path):
    with locked_study(plan_for(tmp_path, "study=s", "effective_batch_size=32")) as (study, _):
        assert study.user_attrs[RUN_ATTR]["effective_batch_size"] == 32
    with (
        pytest.raises(StudyError, match="was made for"),
        locked_study(plan_for(tmp_path, "study=s", "effective_batch_size=64")),
    ):
        pass


def test_run_info_of_a_study_that_stored_the_batch_mode_sentence():
    study = optuna.create_study(directions=["maximize", "minimize"])
    info = {
        "study": "s", "model": "m", "model_config": {}, "task": "t", "seq_len": 8,
        "device": "cpu", "device_name": "cpu", "space": "cpu", "space_notes": [],
        "batch_mode": "effective batch 32 (grad_accum derived)", "memory_budget_bytes": 1,
        "headroom": 0.1, "noise_cv": 0.1,
    }  # fmt: skip
    study.set_user_attr(RUN_ATTR, info)
    assert run_info(study).effective_batch_size == 32


def running_trial(study, owner):
    trial = study.ask()
    if owner is not None:
        trial.set_user_attr(OWNER_ATTR, owner)
    return trial.number


def test_only_trials_of_searches_that_are_gone_count_as_interrupted(tmp_path, monkeypatch):
    study = optuna.create_study(directions=["maximize", "minimize"])
    me = psutil.Process()
    here = socket.gethostname()
    alive = running_trial(study, {"host": here, "pid": me.pid, "pid_started": me.create_time()})
    elsewhere = running_trial(study, {"host": here + "-other", "pid": 1, "pid_started": 0.0})
    dead_pid = running_trial(study, {"host": here, "pid": 2**22 + 1, "pid_started": 0.0})
    reused = running_trial(study, {"host": here, "pid": me.pid, "pid_started": 1.0})
    legacy = running_trial(study, None)
    (tmp_path / "trials" / f"{dead_pid:04d}").mkdir(parents=True)
    (tmp_path / "trials" / f"{dead_pid:04d}" / "result.json").write_text('{"status": "ok"}')

    _, queued = recover(study, tmp_path, baseline={})

    states = {t.number: t.state for t in study.trials}
    running = optuna.trial.TrialState.RUNNING
    # Another host's trial is left to its heartbeats; one that names no owner yet was asked for
    # a moment ago by a search that is about to name itself.
    assert states[alive] is running and states[elsewhere] is running
    assert states[legacy] is running
    assert queued == [dead_pid, reused]
    # Long after it started, an unowned running trial is an old search's.
    monkeypatch.setattr("autotune.search.recovery.UNOWNED_GRACE_S", 0.0)
    assert recover(study, tmp_path, baseline={})[1] == [legacy]
    dead_dir = tmp_path / "trials" / f"{dead_pid:04d}"
    assert not (dead_dir / "result.json").exists(), "an unrecorded result passes for a real one"
    assert json.loads((dead_dir / INTERRUPTED_RESULT).read_text()) == {"status": "ok"}


def test_a_config_of_an_unknown_model_type_is_refused_before_any_trial(tmp_path):
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bertt", "vocab_size": 8}))
    with pytest.raises(ConfigError, match=r"model_type 'bertt' is not one transformers 5.x knows"):
        make_plan(load_config([f"model={folder}", f"out={tmp_path}"]), CPU)
    with pytest.raises(ConfigError, match="transformers has no seq2seq head for bert models"):
        plan_for(tmp_path, "task=seq2seq")


def test_a_default_study_name_stays_a_folder_inside_out(tmp_path, monkeypatch):
    nested = tmp_path / "models" / "inner"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    assert default_study_name("..", "cpu", 64) == "models-cpu-s64"
    assert default_study_name(".", "cpu", 64) == "inner-cpu-s64"
    long = default_study_name("org/" + "m" * 200, "cpu", 64)
    assert len(long) == 100 and long.endswith("-cpu-s64")


def test_small_memory_figures_are_written_in_mib():
    assert format_gib(5 / 1024) == "5.0 MiB"
    assert format_bytes(20 * 2**20) == "0.02 GiB"
    assert format_gib(0.0) == "0.0 MiB"
    assert format_gib(1.5) == "1.50 GiB"
    assert format_gib(0.1234, 3) == "0.123 GiB"
