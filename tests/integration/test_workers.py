"""Several workers on one study, with real processes: worker processes started by `workers=N`
and workers joining with `autotune worker`, on the embedded SQLite storage and on a real
PostgreSQL server; heartbeats; kill -9 of a worker mid-trial; real trials on one core each.

Fake trials (tests/fakes/worker.py, `sleep:S`) take a fixed time and give known results, so
what these tests check is the coordination: each trial counted once, the baseline run once, no
settings measured twice, nothing lost, and the wall time.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest

from autotune import api, checks, cli
from autotune.config import load_config
from autotune.parallel import Slot
from autotune.plan import make_plan
from autotune.records import (
    OWNER_ATTR,
    PARAMS_ATTR,
    RETRY_OF_ATTR,
    is_interrupted,
    is_recorded,
    load_records,
    tell_result,
)
from autotune.storage import open_storage, open_study
from autotune.study import SearchObserver
from autotune.trial import Status, TrialResult
from tests.conftest import TINY_MODEL, fake_launcher, postgres_database

pytestmark = pytest.mark.slow
README = Path(__file__).parents[2] / "README.md"
TRIAL_S = 4.0
N_TRIALS = 12
OUTPUTS = ("trials.csv", "pareto.csv", "recommended.json", "recommended.py", "report.html")
FAST = ["seq_len=32", "warmup_steps=1", "measure_steps=2"]


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request):
    """None (the embedded default: study.db in the study folder) or a fresh PostgreSQL
    database's URL."""
    if request.param == "sqlite":
        yield None
        return
    with postgres_database(request.getfixturevalue("postgres_server_url")) as url:
        yield url


@pytest.fixture
def any_cores(monkeypatch):
    """N workers without core sets of their own. On CPU each worker owns some cores, and the
    2-core CI machine has fewer than 3; a fake trial uses none. (The real-trial test below
    runs on one core each.)"""
    monkeypatch.setattr("autotune.plan.assign", lambda workers, *_: ([Slot()] * workers, []))


class Watch(SearchObserver):
    """Times the search from the study opened to the last worker ended; keeps what it saw."""

    def __init__(self) -> None:
        self.started_at = self.ended_at = 0.0
        self.started: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.retries: list[int] = []

    def planned(self, plan, done_before):
        self.started_at = time.monotonic()

    def ended(self, stopped):
        self.ended_at = time.monotonic()

    def trial_started(self, number, params):
        self.started.append(number)

    def retried(self, number):
        self.retries.append(number)

    def worker_failed(self, index, how, log_tail):
        self.failed.append((index, how))

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


def run_search(out: Path, study: str, workers: int, storage: str | None, mode: str, **extra):
    watch = Watch()
    settings = {"model": TINY_MODEL, "seq_len": 32, "n_trials": N_TRIALS, "out": out,
                "study": study, "workers": workers, "storage": storage, **extra}  # fmt: skip
    config = load_config([f"{k}={v}" for k, v in settings.items() if v is not None])
    result = api.run(config, observer=watch, launcher=fake_launcher(mode))
    return result, watch


def study_of(result, url: str | None) -> optuna.Study:
    url = url or f"sqlite:///{result.study_dir / 'study.db'}"
    return optuna.load_study(study_name=result.info.study, storage=url)


def assert_counted_once(study: optuna.Study, n_trials: int) -> None:
    """n_trials recorded, the baseline among them once, no settings measured twice, no trial
    lost (every unrecorded trial is a proposal that was not to run, or a repeat)."""
    trials = study.get_trials(deepcopy=False)
    records = load_records(study)
    assert len(records) == n_trials
    assert [r.baseline for r in records].count(True) == 1
    keys = [checks.settings_key(r.params) for r in records]
    assert len(set(keys)) == len(keys), "settings measured twice"
    assert not [t.number for t in trials if t.state is optuna.trial.TrialState.RUNNING]
    return records


def test_three_workers_finish_a_study_in_less_than_half_the_time_of_one(
    tmp_path, storage, any_cores
):
    """12 trials of 4 s: one worker, then three (`workers=3`), each on a study of its own."""
    url = storage
    one, one_watch = run_search(tmp_path, "one", 1, url, f"sleep:{TRIAL_S}")
    three, three_watch = run_search(tmp_path, "three", 3, url, f"sleep:{TRIAL_S}")

    for result in (one, three):
        assert_counted_once(study_of(result, url), N_TRIALS)
        assert result.stopped == f"{N_TRIALS} of {N_TRIALS} trials finished"
        assert [p.name for p in result.paths] == list(OUTPUTS)
    study = study_of(three, url)
    pids = {t.user_attrs[OWNER_ATTR]["pid"] for t in study.trials if is_recorded(t)}
    assert len(pids) == 3, "every worker ran trials"
    assert sorted(three_watch.started) == sorted(r.number for r in three.snapshot.records)
    ratio = three_watch.seconds / one_watch.seconds
    print(f"\n{storage and 'postgresql' or 'sqlite'}: workers=1 {one_watch.seconds:.1f} s, "
          f"workers=3 {three_watch.seconds:.1f} s, ratio {ratio:.2f}")  # fmt: skip
    assert ratio <= 0.45, (one_watch.seconds, three_watch.seconds)


def children_running(module: str) -> list[psutil.Process]:
    """This process's descendants whose command line runs `module`."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if module in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_kill_9_of_a_worker_mid_trial_loses_nothing(tmp_path, postgres_server_url, any_cores):
    """Three workers on PostgreSQL; one is SIGKILLed with its trial. The others finish the
    study, the dead worker's trial is failed and its settings run once more, and `autotune
    report` from the server alone builds the outputs the search wrote."""
    n_trials = 9
    with postgres_database(postgres_server_url) as url:
        outcome: dict = {}

        def search() -> None:
            try:
                outcome["result"], outcome["watch"] = run_search(
                    tmp_path, "k", 3, url, "sleep:4", n_trials=n_trials
                )
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = exc

        thread = threading.Thread(target=search)
        thread.start()
        deadline = time.monotonic() + 120
        while len(children_running("tests/fakes/worker.py")) < 3:  # every worker in a trial
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.1)
        victim = children_running("autotune.parallel")[1]
        its_trial = [p for p in victim.children(recursive=True) if "fakes" in " ".join(p.cmdline())]
        study = optuna.load_study(study_name="k", storage=url)
        running = [t for t in study.get_trials(deepcopy=False)
                   if t.state.name == "RUNNING" and t.user_attrs[OWNER_ATTR]["pid"] == victim.pid]  # fmt: skip
        assert len(running) == 1 and len(its_trial) == 1
        killed = running[0]
        for process in (victim, *its_trial):
            process.kill()
        killed_at = time.time()
        thread.join(timeout=300)
        assert "error" not in outcome, outcome.get("error")
        result, watch = outcome["result"], outcome["watch"]

        study = optuna.load_study(study_name="k", storage=url)
        records = assert_counted_once(study, n_trials)
        dead = study.trials[killed.number]
        assert is_interrupted(dead)
        print(f"\nthe killed worker's trial was failed {dead.datetime_complete.timestamp() - killed_at:.1f} s "
              "after the kill")  # fmt: skip
        retries = [t for t in study.trials if t.user_attrs.get(RETRY_OF_ATTR) == killed.number]
        assert [is_recorded(t) for t in retries] == [True], "its settings ran once more"
        assert checks.settings_key(retries[0].user_attrs[PARAMS_ATTR]) == checks.settings_key(
            killed.user_attrs[PARAMS_ATTR]
        )
        assert [t.number for t in study.trials if is_interrupted(t)] == [killed.number]
        assert watch.failed == [(1, "killed by SIGKILL")]
        assert watch.retries == [killed.number]
        assert result.stopped.startswith(f"{n_trials} of {n_trials} trials finished; failed: worker 1")
        assert len(records) == n_trials

        rebuilt = tmp_path / "rebuilt"
        assert cli.main(["report", str(rebuilt), f"storage={url}", "study=k"]) == 0
        for name in OUTPUTS:
            assert (rebuilt / name).read_bytes() == (result.study_dir / name).read_bytes(), name
