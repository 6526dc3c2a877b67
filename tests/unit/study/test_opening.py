import os
import socket

import optuna
import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import StudyError
from autotune.plan.config import WorkerConfig
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import RUN_ATTR, SETTINGS_ATTR, run_info
from autotune.store.study_lock import StudyLock
from autotune.study.opening import join_config, locked_study, open_study
from tests.conftest import TINY_MODEL
from tests.unit.stand_ins import CPU, plan_for


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


def test_a_study_a_verify_holds_says_so_and_offers_no_worker(tmp_path):
    with StudyLock.acquire(tmp_path, "s", "verify"):
        with pytest.raises(StudyError) as refused:
            StudyLock.acquire(tmp_path, "s")
    message = str(refused.value)
    assert message.startswith("study s is busy: `autotune verify` runs on it right now (pid ")
    assert "worker" not in message and "searched" not in message


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
    """The plan refuses such an out= (`out_problems`); one replaced by a file after it was
    planned is refused when the study folder is made."""
    blocker = tmp_path / "a-file"
    blocker.mkdir()
    plan = plan_for(blocker, "study=s")
    blocker.rmdir()
    blocker.write_text("")
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


def test_a_worker_joins_with_the_study_settings_and_its_own(tmp_path):
    settings = [
        f"model={TINY_MODEL}",
        f"out={tmp_path}",
        "study=j",
        "seq_len=48",
        "n_trials=7",
        "workers=1",
        "quiet=true",
    ]
    plan = make_plan(load_config(settings), CPU)
    plan.study_dir.mkdir()
    study, _ = open_study(plan)
    assert study.user_attrs[SETTINGS_ATTR]["device"] == "cpu"  # as resolved
    assert "out" not in study.user_attrs[SETTINGS_ATTR]
    joined = join_config(WorkerConfig(study="j", out=tmp_path, timeout="1h"))
    assert (joined.model, joined.seq_len, joined.n_trials) == (TINY_MODEL, 48, 7)
    assert (joined.timeout, joined.quiet, joined.workers) == (3600.0, False, "auto")
    assert joined.storage == f"sqlite:///{(tmp_path / 'j' / 'study.db').resolve()}"


def test_joining_a_study_that_is_not_there_says_how_to_start_it(tmp_path):
    with pytest.raises(StudyError, match=r"no such file; start the study with autotune search"):
        join_config(WorkerConfig(study="nope", out=tmp_path))
    url = f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(study_name="plain", storage=url)
    with pytest.raises(StudyError, match=r"study=nope is not in .* \(it has: plain\)"):
        join_config(WorkerConfig(study="nope", storage=url))
    with pytest.raises(StudyError, match="study=plain stores no search settings"):
        join_config(WorkerConfig(storage=url))


def test_a_bad_storage_url_leaves_no_empty_out_folder_behind(tmp_path):
    from autotune.plan.overrides import load_config
    from autotune.plan.plan import make_plan
    from autotune.study.opening import locked_study
    from tests.conftest import TINY_MODEL

    cpu = DeviceInfo(
        cuda_available=False,
        name="cpu",
        total_memory_bytes=2**34,
        free_memory_bytes=2**34,
        cpu_name="cpu",
        host_available_memory_bytes=2**34,
    )
    out = tmp_path / "new" / "reports"
    settings = [f"model={TINY_MODEL}", f"out={out}", "study=s", "storage=nosuchdb://x/y"]
    with (
        pytest.raises(StudyError, match="cannot open it"),
        locked_study(make_plan(load_config(settings), cpu)),
    ):
        pass
    assert list(tmp_path.iterdir()) == []
