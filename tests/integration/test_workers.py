"""Several workers on one study, with real processes: worker processes started by `workers=N`
and workers joining with `autotune worker`, on the embedded SQLite storage and on a real
PostgreSQL server; heartbeats; kill -9 of a worker mid-trial. (Real trials on one core each:
the CPU command of docs/scaling-out.md, run by test_readme_examples.py.)

Fake trials (tests/fakes/worker.py, `sleep:S`) take a fixed time and give known results, so
what these tests check is the coordination: each trial counted once, the baseline run once, no
settings measured twice, nothing lost, and the wall time.
"""

import contextlib
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest
import sqlalchemy

from autotune import api, cli
from autotune.common.placement import Placement
from autotune.common.trial import Status, TrialResult
from autotune.outputs.view import TerminalView
from autotune.plan import hardware
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import (
    BASELINE_ATTR,
    NOT_RUN_ATTR,
    OWNER_ATTR,
    PARAMS_ATTR,
    RETRY_OF_ATTR,
    TrialRecord,
    is_interrupted,
    is_recorded,
    load_records,
    tell_result,
)
from autotune.store.storage import open_storage
from autotune.study import checks
from autotune.study.observer import SearchObserver
from autotune.study.opening import open_study
from tests.benchmarking import up_to_three_attempts
from tests.conftest import TINY_MODEL, fake_executor, postgres_database
from tests.docs_text import page

pytestmark = pytest.mark.slow
TRIAL_S = 4.0
N_TRIALS = 12
OUTPUTS = ("trials.csv", "pareto.csv", "recommended.json", "recommended.py", "report.html")
FAST = ["seq_len=32", "warmup_steps=1", "measure_steps=2", "confirm_rounds=0"]


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
    2-core CI machine has fewer than 3; a fake trial uses none. (The CPU command
    of docs/scaling-out.md, run by test_readme_examples.py, runs real trials on one core each.)"""
    monkeypatch.setattr(
        "autotune.plan.plan.assign", lambda workers, *_: ([Placement()] * workers, [])
    )


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

    def retried(self, number, refused=None):
        self.retries.append(number)

    def worker_failed(self, index, how, log_tail):
        self.failed.append((index, how))

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


def run_search(out: Path, study: str, workers: int, storage: str | None, mode: str, **extra):
    watch = Watch()
    settings = {
        "model": TINY_MODEL,
        "seq_len": 32,
        "n_trials": N_TRIALS,
        "out": out,
        "study": study,
        "workers": workers,
        "storage": storage,
        "confirm_rounds": 0,
        **extra,
    }
    config = load_config([f"{k}={v}" for k, v in settings.items() if v is not None])
    result = api.run(config, observer=watch, executor=fake_executor(mode))
    return result, watch


def study_of(result, url: str | None) -> optuna.Study:
    url = url or f"sqlite:///{result.study_dir / 'study.db'}"
    return optuna.load_study(study_name=result.info.study, storage=url)


def assert_counted_once(study: optuna.Study, n_trials: int) -> list[TrialRecord]:
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


@pytest.mark.benchmark
@up_to_three_attempts
def test_three_workers_finish_a_study_in_less_than_half_the_time_of_one(tmp_path, any_cores):
    """12 trials of 4 s: one worker, then three (`workers=3`), each on a study of its own.
    Random proposals: what is timed is the workers, not the sampler's time to propose. On
    the embedded storage, the default (the tests that share a study run on both storages;
    this one measured the same ratio on PostgreSQL, 0.42 at 9 trials, and takes a minute)."""
    url = None
    one, one_watch = run_search(tmp_path, "one", 1, url, f"sleep:{TRIAL_S}", sampler="random")
    three, three_watch = run_search(tmp_path, "three", 3, url, f"sleep:{TRIAL_S}", sampler="random")

    for result in (one, three):
        assert_counted_once(study_of(result, url), N_TRIALS)
        assert result.stopped == f"{N_TRIALS} of {N_TRIALS} trials finished"
        assert [p.name for p in result.paths] == list(OUTPUTS)
    study = study_of(three, url)
    pids = {t.user_attrs[OWNER_ATTR]["pid"] for t in study.trials if is_recorded(t)}
    assert len(pids) == 3, "every worker ran trials"
    assert sorted(three_watch.started) == sorted(r.number for r in three.snapshot.records)
    ratio = three_watch.seconds / one_watch.seconds
    print(
        f"\nsqlite: workers=1 {one_watch.seconds:.1f} s, "
        f"workers=3 {three_watch.seconds:.1f} s, ratio {ratio:.2f}"
    )
    assert ratio <= 0.45, (one_watch.seconds, three_watch.seconds)


def children_running(module: str) -> list[tuple[psutil.Process, list[str]]]:
    """(process, command line) of this process's descendants whose command line runs `module`.
    The command line is read once: a process that has just ended reads as an empty one."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmdline = child.cmdline()
            if module in " ".join(cmdline):
                found.append((child, cmdline))
    return found


def in_a_trial(study: optuna.Study, index: int):
    """(worker `index`'s process, its trial's process, the trial) while it runs a trial."""
    for worker, cmdline in children_running("autotune.workers"):
        with contextlib.suppress(psutil.NoSuchProcess):
            if cmdline[-1] != str(index):
                continue
            trials = [p for p in worker.children() if "fakes" in " ".join(p.cmdline())]
            running = [
                t
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                if t.user_attrs.get(OWNER_ATTR, {}).get("pid") == worker.pid
            ]
            if len(trials) == 1 and len(running) == 1:
                return worker, trials[0], running[0]
    return None


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
        found = None
        while found is None:  # worker 1, training
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.1)
            with contextlib.suppress(KeyError):  # the study is not made yet
                found = in_a_trial(optuna.load_study(study_name="k", storage=url), index=1)
        victim, its_trial, killed = found
        for process in (victim, its_trial):
            process.kill()
        killed_at = time.time()
        thread.join(timeout=300)
        assert "error" not in outcome, outcome.get("error")
        result, watch = outcome["result"], outcome["watch"]

        study = optuna.load_study(study_name="k", storage=url)
        records = assert_counted_once(study, n_trials)
        dead = study.trials[killed.number]
        assert is_interrupted(dead)
        failed_after_s = dead.datetime_complete.timestamp() - killed_at
        print(f"\nthe killed worker's trial was failed {failed_after_s:.1f} s after the kill")
        retries = [t for t in study.trials if t.user_attrs.get(RETRY_OF_ATTR) == killed.number]
        # Two workers may each queue a retry at the same moment: the first runs, no other.
        ran = [t for t in retries if is_recorded(t)]
        assert len(ran) == 1, "its settings ran once more"
        assert all(NOT_RUN_ATTR in t.user_attrs for t in retries if t is not ran[0])
        assert checks.settings_key(ran[0].user_attrs[PARAMS_ATTR]) == checks.settings_key(
            killed.user_attrs[PARAMS_ATTR]
        )
        assert [t.number for t in study.trials if is_interrupted(t)] == [killed.number]
        assert watch.failed == [(1, "killed by SIGKILL")]
        assert watch.retries == [killed.number]
        assert result.stopped.startswith(
            f"{n_trials} of {n_trials} trials finished; failed: worker 1"
        )
        assert len(records) == n_trials

        rebuilt = tmp_path / "rebuilt"
        assert cli.main(["report", str(rebuilt), f"storage={url}", "study=k"]) == 0
        for name in OUTPUTS:
            assert (rebuilt / name).read_bytes() == (result.study_dir / name).read_bytes(), name


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
def test_a_trial_from_a_lost_host_is_failed_after_stale_after_and_a_live_one_never(tmp_path):
    """Two trials run "on other hosts" (owned by a host name that is not this one, so only
    their heartbeats tell whether they live). A worker joins; then one host is lost (its
    heartbeats stop), while the other beats until it tells its result, long after. The worker
    fails the lost host's trial stale_after after its last heartbeat and runs its settings
    again; the live one is never touched."""
    stale_after, lost_after_s, live_s = 3, 8.0, 16.0
    config = load_config(
        [
            f"model={TINY_MODEL}",
            *FAST,
            "n_trials=8",
            f"out={tmp_path}",
            "study=h",
            f"stale_after={stale_after}",
        ]
    )
    plan = make_plan(config, hardware.probe())
    plan.study_dir.mkdir()
    study, plan = open_study(plan)  # as `autotune search` makes it: settings stored
    last_beat: dict[int, float] = {}

    def remote_trial(host: str) -> optuna.Trial:
        trial = study.ask()
        trial.set_user_attr(OWNER_ATTR, {"host": host, "pid": 1, "pid_started": 0.0})
        # The first is the queued baseline, which runs the HF defaults as they are.
        baseline = trial.user_attrs.get(BASELINE_ATTR)
        params = dict(plan.baseline) if baseline else plan.space.sample(trial, plan.rules)
        trial.set_user_attr(PARAMS_ATTR, params)
        return trial

    lost, live = remote_trial("lost-host"), remote_trial("live-host")
    told: dict = {}

    def hosts() -> None:
        """Both hosts beat once a second; the lost one stops, the live one tells a result."""
        try:
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < live_s:
                for trial in (lost, live) if elapsed < lost_after_s else (live,):
                    study._storage.record_heartbeat(trial._trial_id)
                    last_beat[trial.number] = time.time()
                time.sleep(1)
            result = TrialResult(
                status=Status.OK,
                samples_per_s=50.0,
                tokens_per_s=1600.0,
                peak_memory_gib=0.1,
                step_time_cv=0.01,
            )
            tell_result(study, live, result, plan.info.memory_budget_gib, noise_cv=0.1)
            told["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            told["error"] = exc

    thread = threading.Thread(target=hosts)
    thread.start()
    try:
        worker = ["worker", f"out={tmp_path}", "study=h"]
        assert cli.main(worker, executor=fake_executor("sleep:1")) == 0
    finally:
        thread.join()
    assert told == {"ok": True}, "the live host's trial was failed while it ran"

    study = optuna.load_study(study_name="h", storage=f"sqlite:///{tmp_path / 'h' / 'study.db'}")
    assert_counted_once(study, 8)
    dead = study.trials[lost.number]
    assert is_interrupted(dead)
    blocked_s = dead.datetime_complete.timestamp() - last_beat[lost.number]
    print(
        f"\nstale_after={stale_after}s: the lost host's trial was failed {blocked_s:.1f} s "
        "after its last heartbeat"
    )
    # The database clock has whole seconds (SQLite), and the worker looks between its trials.
    assert stale_after <= blocked_s <= stale_after + 3
    retries = [t for t in study.trials if t.user_attrs.get(RETRY_OF_ATTR) == lost.number]
    assert [is_recorded(t) for t in retries] == [True]
    assert retries[0].user_attrs[PARAMS_ATTR] == dead.user_attrs[PARAMS_ATTR]
    assert study.trials[live.number].state is optuna.trial.TrialState.COMPLETE


def scaling_out_commands(ray: bool = False) -> list[list[str]]:
    """The commands of docs/scaling-out.md, split as a shell would: the workers' (ray=False),
    or the Ray cluster's, which test_ray.py runs on a real one."""
    blocks = re.findall(r"```bash\n(.*?)```", page("scaling-out.md"), flags=re.S)
    commands = [shlex.split(line) for block in blocks for line in block.splitlines() if line]
    return [c for c in commands if ("executor=ray" in c) == ray]


def test_the_docs_show_the_commands_these_tests_run():
    assert [" ".join(c[:2]) for c in scaling_out_commands(ray=True)] == ["autotune search"] * 2
    commands = [" ".join(c[:2]) for c in scaling_out_commands()]
    dashboard = "optuna-dashboard postgresql+psycopg://autotune@db-host/autotune"
    assert commands == ["autotune search"] * 4 + ["autotune worker", dashboard]


def test_the_documented_commands_for_several_hosts(tmp_path, postgres_server_url, monkeypatch):
    """The search and a worker joining it on PostgreSQL (fake trials), then the dashboard's
    URL read by Optuna; and the GPU commands on this CPU-only machine."""
    commands = scaling_out_commands()
    gpu_all, gpu_two = commands[0], commands[1]
    search, worker, dashboard = commands[3], commands[4], commands[5]
    test_settings = [f"model={TINY_MODEL}", *FAST, "n_trials=6", f"out={tmp_path}"]
    # One worker per GPU: on a machine without one, the one worker of a CPU search.
    assert cli.main([gpu_all[1], *test_settings, "study=gpu"], executor=fake_executor("ok")) == 0
    assert cli.main([gpu_two[1], *test_settings, "study=gpu2", gpu_two[-1]]) == 2  # devices=0,1

    with postgres_database(postgres_server_url) as url:
        plain = sqlalchemy.engine.make_url(url).set(drivername="postgresql")
        swap = {
            "postgresql://autotune@db-host/autotune": plain.render_as_string(False),
            "postgresql+psycopg://autotune@db-host/autotune": url,
        }

        def here(command: list[str]) -> list[str]:
            """The command with the test server in place of db-host."""
            args = []
            for arg in command:
                key, sep, value = arg.rpartition("=")
                args.append(f"{key}{sep}{swap.get(value, value)}")
            return args

        searched: dict = {}

        def search_host() -> None:
            args = [a for a in here(search)[1:] if not a.startswith("model=")]
            searched["code"] = cli.main([*args, *test_settings], executor=fake_executor("sleep:3"))

        thread = threading.Thread(target=search_host)
        thread.start()
        try:
            storage = open_storage(url)
            while not [s for s in optuna.get_all_study_summaries(storage) if s.user_attrs]:
                time.sleep(0.2)  # the search has made the study and stored its settings
            args = [*here(worker)[1:], f"out={tmp_path}"]
            joined = cli.main(args, executor=fake_executor("sleep:3"))
        finally:
            thread.join()
        assert joined == 0 and searched == {"code": 0}
        logs = [
            tmp_path / "bert-large" / "search.log",
            *(tmp_path / "bert-large" / "workers").glob("*.log"),
        ]
        for log in logs:
            assert "started:" in log.read_text(), f"{log.name}: ran no trial"
        study = optuna.load_study(study_name="bert-large", storage=here(dashboard)[1])
        records = assert_counted_once(study, 6)
        # The search shows every trial of its study, the joined worker's too. Not trials 0-5:
        # a proposal that was not to run (the settings the other process was running) holds a
        # number too.
        shown = logs[0].read_text()
        for record in records:
            assert re.search(rf"\] trial +{record.number} ", shown), f"{record.number}:\n{shown}"


def test_ctrl_c_stops_every_worker_and_the_outputs_are_written(tmp_path):
    """Two workers in trials that would train for hours; Ctrl-C to the search (as a terminal
    sends it): each worker records its trial as interrupted, the outputs are written, exit
    130, and no process the search started is left."""
    search = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            f"model={TINY_MODEL}",
            "seq_len=32",
            "warmup_steps=1",
            "measure_steps=20000",
            "workers=2",
            f"out={tmp_path}",
            "study=c",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        progress = list((tmp_path / "c" / "trials").glob("*/progress.json"))
        while len(progress) < 2:  # both workers are training
            assert search.poll() is None and time.monotonic() < deadline, search.communicate()
            time.sleep(0.2)
            progress = list((tmp_path / "c" / "trials").glob("*/progress.json"))
        started = psutil.Process(search.pid).children(recursive=True)
        search.send_signal(signal.SIGINT)
        stdout, stderr = search.communicate(timeout=600)  # a safety net, not a bound
    finally:
        if search.poll() is None:
            search.kill()
    assert search.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c' / 'study.db'}")
    assert sorted(t.state.name for t in study.trials) == ["FAIL", "FAIL"]
    assert all(is_interrupted(t) for t in study.trials)
    assert (tmp_path / "c" / "report.html").is_file()
    gone = psutil.wait_procs(started, timeout=5)[1]
    assert not gone, [p.cmdline() for p in gone]


def test_one_view_shows_every_worker_s_running_trial(tmp_path, any_cores):
    """On a terminal the search shows a live line per running trial, whichever worker runs
    it, from the progress its trials write."""

    class Live(Watch):
        def __init__(self) -> None:
            super().__init__()
            self.view = TerminalView(quiet=True)
            self.view.live = True
            self.most_at_once = 0

        def planned(self, plan, done_before):
            super().planned(plan, done_before)
            self.view.planned(plan, done_before)

        def trial_started(self, number, params):
            super().trial_started(number, params)
            self.view.trial_started(number, params)

        def progress(self, number, progress):
            self.view.progress(number, progress)
            steps = [line for line in self.view.bar.running.values() if "step " in line]
            self.most_at_once = max(self.most_at_once, len(steps))

        def trial_ended(self, record):
            self.view.trial_ended(record)

    live = Live()
    # 2.5 s trials (0.1 s a step): the search looks at the study twice a second.
    config = load_config(
        [
            f"model={TINY_MODEL}",
            "seq_len=32",
            "warmup_steps=5",
            "measure_steps=18",
            "n_trials=4",
            f"out={tmp_path}",
            "study=v",
            "workers=2",
        ]
    )
    api.run(config, observer=live, executor=fake_executor("progress"))
    assert live.most_at_once == 2
    # Four trials, each started once. Their numbers may skip one: under load a number can go
    # to a trial that is told, not run (seen in CI: started [0, 1, 3, 4]).
    assert len(live.started) == len(set(live.started)) == 4, live.started
    assert live.view.bar.running == {}


def sqlite_write_lock_is_free(db: Path) -> bool:
    """Whether a write transaction can begin on `db` within 5 s (another worker's last a few
    milliseconds; a stopped process's never ends)."""
    with contextlib.closing(sqlite3.connect(db, timeout=5, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # database is locked
            return False
        conn.execute("ROLLBACK")
        return True


def test_a_sigstopped_worker_is_ended_once_its_trial_ran_elsewhere(tmp_path, any_cores):
    """Two workers on the default SQLite study; worker 1 is SIGSTOPped while its trial trains
    (its progress file written: the loop is waiting for the trial, not in the storage). Its
    heartbeats stop: worker 0 fails the trial as stale after stale_after, runs its settings
    again and the rest of the study; the search then ends the stopped worker with a message
    instead of waiting for it forever. (Before, without the test: waited forever.)

    SQLite, not PostgreSQL, as it is the default and the harder case: a process stopped inside
    a transaction keeps the file's write lock, and the other workers then fail with "database
    is locked" (a file lock has no owner to time out). The stopped worker's heartbeat thread
    writes for a few milliseconds every second, so a stop can land in one: the test makes sure
    it did not (a write transaction can begin), and otherwise lets the worker end it and stops
    it again. A stop outside a transaction is what the search handles; PostgreSQL runs the
    same code, with row locks no other worker waits for."""
    n_trials, stale_after = 3, 3
    study_dir = tmp_path / "z"
    outcome: dict = {}

    def search() -> None:
        try:
            outcome["result"], outcome["watch"] = run_search(
                tmp_path,
                "z",
                2,
                None,
                "progress",
                n_trials=n_trials,
                stale_after=stale_after,
                warmup_steps=2,
                measure_steps=10,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=search)
    thread.start()
    url = f"sqlite:///{study_dir / 'study.db'}"
    try:
        deadline = time.monotonic() + 300  # a safety net, not a bound
        while not (study_dir / "workers").exists():  # made once the study is open
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.05)
        study = optuna.load_study(study_name="z", storage=url)
        found = None
        while found is None:  # worker 1, training: its trial's progress file is written
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.05)
            found = in_a_trial(study, index=1)
            progress = found and study_dir / "trials" / f"{found[2].number:04d}" / "progress.json"
            if found and not progress.exists():
                found = None
        victim, _, stopped = found
        victim.suspend()
        while not sqlite_write_lock_is_free(study_dir / "study.db"):
            victim.resume()  # stopped inside a heartbeat's transaction: let it end it
            time.sleep(0.05)
            victim.suspend()
        stopped_at = time.monotonic()
        thread.join(timeout=300)
        ended_after_s = time.monotonic() - stopped_at
        assert not thread.is_alive(), "the search still waits for the stopped worker"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            if found:
                found[0].resume()  # never leave a stopped process behind a failed test
        thread.join()
    assert "error" not in outcome, outcome.get("error")
    result, watch = outcome["result"], outcome["watch"]
    print(f"\nthe search ended {ended_after_s:.1f} s after SIGSTOP (stale_after={stale_after}s)")
    study = optuna.load_study(study_name="z", storage=url)
    assert_counted_once(study, n_trials)
    assert is_interrupted(study.trials[stopped.number])
    retries = [t for t in study.trials if t.user_attrs.get(RETRY_OF_ATTR) == stopped.number]
    assert [is_recorded(t) for t in retries].count(True) == 1, "its settings ran once more"
    assert watch.failed == [(1, "stopped (SIGSTOP) while the study got all its trials: ended it")]
    assert result.stopped.startswith(f"{n_trials} of {n_trials} trials finished; failed: worker 1")
    assert not victim.is_running(), "the stopped worker was ended"
