"""What each worker of `workers=N` owns (devices, cores), the storage several processes share
(SQLite WAL, BEGIN IMMEDIATE, heartbeats), and joining a study: no process is started."""

import dataclasses
import sqlite3

import optuna
import pytest

from autotune.common.errors import ConfigError, StudyError
from autotune.plan.config import WorkerConfig, load_config
from autotune.plan.plan import make_plan
from autotune.plan.slots import Slot, _ranges, _split, assign
from autotune.search.opening import join_config, open_study
from autotune.store.records import SETTINGS_ATTR
from autotune.store.storage import heartbeat_interval_s, open_storage
from tests.conftest import TINY_MODEL
from tests.unit.test_hardening import CPU

GPUS = dataclasses.replace(
    CPU, cuda_available=True, name="NVIDIA H100 80GB HBM3",
    cuda_device_names=("NVIDIA H100 80GB HBM3",) * 4,
    cuda_free_memory_bytes=(80 * 2**30, 70 * 2**30, 79 * 2**30, 80 * 2**30),
)  # fmt: skip


def test_cores_are_split_into_disjoint_runs_of_nearly_equal_size():
    assert _split([0, 1, 2, 3, 4, 5, 6], 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert _split([4, 5], 2) == [[4], [5]]
    assert _ranges((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_cpu_workers_each_own_a_share_of_this_process_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9})
    slots, problems = assign(2, "auto", "cpu", CPU)
    assert problems == []
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 8, 9)]
    assert [s.describe() for s in slots] == ["cores 0-2", "cores 3,8-9"]
    assert assign("auto", "auto", "cpu", CPU) == ([Slot()], [])  # one worker, every core
    _, problems = assign(7, "0,1", "cpu", CPU)
    assert problems == [
        "devices=0,1: names CUDA devices; this search runs on cpu",
        "workers=7: each worker needs a core of its own, and this process may use 6",
    ]


def test_cuda_workers_own_one_visible_device_each(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots, problems = assign("auto", "auto", "cuda", GPUS)
    assert problems == [] and [s.cuda_device for s in slots] == ["0", "1", "2", "3"]
    slots, _ = assign(2, "3,1,2", "cuda", GPUS)  # workers=N: the first N of devices=
    assert [(s.cuda_device, s.cuda_index) for s in slots] == [("3", 3), ("1", 1)]
    # Indices are among the visible devices: mapped to what CUDA_VISIBLE_DEVICES names.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc,GPU-dd")
    slots, _ = assign("auto", "1,3", "cuda", GPUS)
    assert [s.cuda_device for s in slots] == ["GPU-bb", "GPU-dd"]
    assert [problems for _, problems in (assign(3, "0,1", "cuda", GPUS),
                                         assign("auto", "0,4", "cuda", GPUS))] == [
        ["workers=3: each worker owns one GPU, and devices=0,1 gives 2"],
        ["devices=0,4: no device 4 here (4 visible: 0-3)"],
    ]  # fmt: skip
    mixed = dataclasses.replace(GPUS, cuda_device_names=("NVIDIA H100", "Tesla T4"))
    assert assign("auto", "auto", "cuda", mixed)[1] == [
        "devices=auto: the GPUs differ (NVIDIA H100, Tesla T4); one study measures one kind of "
        "GPU: name devices of one kind"
    ]


def test_the_memory_budget_is_what_every_worker_can_have(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    plan = make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "device=cuda",
                                  "devices=0,1"]), GPUS)  # fmt: skip
    assert plan.info.memory_budget_bytes == 70 * 2**30  # the least free of their devices
    plan = make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "workers=4"]), CPU)
    # Their trials run at the same time; the search and 4 fork servers keep 3.5 GiB, and the
    # machine 10% of the 16 GiB of RAM the fake machine has available (its total unknown).
    assert plan.info.memory_budget_bytes == (2**34 - int(3.5 * 2**30) - int(0.1 * 2**34)) // 4


def test_workers_settings_are_checked_with_the_others():
    with pytest.raises(ConfigError) as error:
        load_config(["model=x", "workers=0", "devices=0,0", "stale_after=2s"])
    assert str(error.value).splitlines()[1:] == [
        "  - workers=0: expected auto or a number of processes, 1 or more",
        "  - devices=0,0: a device is named twice (each worker owns its own)",
        "  - stale_after=2s: at least 3s: heartbeats come once a second at most",
    ]
    assert heartbeat_interval_s(60) == 10 and heartbeat_interval_s(3) == 1


def test_the_embedded_storage_is_wal_with_begin_immediate_and_heartbeats(tmp_path):
    db = tmp_path / "study.db"
    storage = open_storage(f"sqlite:///{db}", stale_after_s=30)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert storage.get_heartbeat_interval() == 5 and storage.grace_period == 30
    statements = []
    with storage.engine.connect() as conn:
        conn.connection.driver_connection.set_trace_callback(statements.append)
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")
    assert statements[0] == "BEGIN IMMEDIATE"


def test_a_worker_joins_with_the_study_settings_and_its_own(tmp_path):
    settings = [f"model={TINY_MODEL}", f"out={tmp_path}", "study=j", "seq_len=48", "n_trials=7",
                "workers=1", "quiet=true"]  # fmt: skip
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
