"""Which embedded Optuna storage lets several worker processes on one machine share a study?

Candidates: SQLite through RDBStorage in WAL mode with a 30 s busy timeout (`sqlite-wal`); the
same plus a write lock taken when each transaction begins (`sqlite-wal-immediate`); SQLite as
autotune opens it today (`sqlite-default`: rollback journal, pysqlite's 5 s timeout); and
`JournalStorage(JournalFileBackend(path))` (`journal`). N processes each loop as a search worker
does: read every trial, ask a multivariate, grouped TPE sampler (constant_liar=True) over an
8-knob categorical space, store five user attrs (one ~2 KB), "run" 0-20 ms, store a ~3 KB result,
flat attrs and a constraint, tell two values; until the study holds T COMPLETE trials. Eight
queued trials per run (the baseline and retries are queued the same way) check that a queued
trial goes to one worker. Each run is checked against what the workers say they told, and every
storage error is counted. Then a worker is SIGKILLed mid-trial and the time until another
worker's `fail_stale_trials` marks its trial FAIL is measured.

    python benchmarks/storages.py [--workers 1 3 8] [--trials 200] [--repeats 3]

Writes benchmarks/results/storages.json and prints a table.

RECOMMENDATION (measured 2026-11-23, 2 CPU cores, Optuna 5.0.0, SQLAlchemy 2.1.9, SQLite 3.40.1,
T=200, 3 runs per cell; the "x of 24" counts are summed over the 3 runs of 8 queued trials):
use SQLite in WAL mode with a busy timeout, with each transaction starting as BEGIN IMMEDIATE:

    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")  # stored in the file; later connections use it
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {
        "timeout": 30, "isolation_level": None}})  # no BEGIN of pysqlite's own
    sqlalchemy.event.listen(storage.engine, "begin",
                            lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))

- SQLite opened as Optuna opens it, WAL or not, is not safe for several workers. pysqlite starts
  a transaction only at the first write and SQLite has no SELECT ... FOR UPDATE, so Optuna's
  read-then-write steps (pop a queued trial, check that a trial still runs before writing to it)
  are not atomic. At 8 workers, 15 of 24 queued trials were handed to two workers (sqlite-wal;
  8 of 24 for sqlite-default), 5 trials were told COMPLETE twice (the later tell silently
  overwrote the earlier), and 4 COMPLETE trials held values from one worker and result attrs
  from another; the errors (median 6 a run) were all UpdateFinishedTrialError or "Cannot tell a
  COMPLETE trial", from the same race. Already at 3 workers: 2 of 24 handed twice. With
  BEGIN IMMEDIATE: 0 errors, 0 handed twice, 0 lost, at every N. The journal: also all 0.
- "database is locked" never happened in the loop (transactions last milliseconds). It does when
  another connection keeps a read open (a viewer, a `sqlite3` shell): in rollback mode the write
  failed after the 5 s timeout; in WAL it went through at once.
- Heartbeats exist only on RDBStorage, and DESIGN.md relies on them. Killed mid-trial
  (heartbeat 1 s, grace 2 s), the trial was FAIL 1.8-2.9 s later on sqlite-wal-immediate, with
  no healthy trial failed (37 checked). The journal left the trial RUNNING.
- The journal is the fastest (get_trials at ~200 trials 0.05 ms vs 9 ms p50 at 8 workers; ask
  16 vs 132 ms p50), but: no heartbeat; a writer killed while holding the lock file stalls every
  writer for 30 s; a torn last line (power cut, full disk) makes every later write and read fail
  with JSONDecodeError until someone edits the file. SQLite commits are atomic.
- What BEGIN IMMEDIATE costs: reads take the write lock too, so at 8 workers on 2 cores the
  ask p95 is 1.2 s (0.3 s without) and 200 trials take 16 s (10 s without). With trials lasting
  seconds to minutes, that is noise; a lost or doubled trial is not.

Notes for whoever applies it. In Optuna 5.0 `engine_kwargs={"connect_args": {"timeout": S}}`
does set the busy timeout (read back as S*1000 ms). WAL has to be set on the file before
RDBStorage() opens it (as above), or per connection through `connect_args={"factory": ...}`. A
"connect" listener added after RDBStorage() comes too late: __init__ already opened the pooled
connection, and journal_mode reads back "delete". A `journal_mode=WAL` URI parameter is ignored.
The "begin" listener is lost when a storage is pickled (__setstate__ builds a new engine), so
open the storage in each process. A WAL study can still be opened read-only
(`?mode=ro&uri=true`), both while a writer is connected and after they have all closed (checked
as root). While a search runs, committed trials may still be in study.db-wal, so back the study
up with SQLite's backup API, not a copy of study.db alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import sqlite3
import statistics
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.trial import TrialState

CANDIDATES = ("sqlite-wal", "sqlite-wal-immediate", "sqlite-default", "journal")
STUDY = "bench"
SPACE = {
    "batch_size": [1, 2, 4, 8, 16, 32, 64, 128],
    "grad_accum": [1, 2, 4, 8],
    "precision": ["fp32", "tf32", "fp16", "bf16", "bf16+tf32"],
    "optim": ["adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit",
              "paged_adamw_8bit", "sgd"],
    "attn_implementation": ["sdpa", "eager"],
    "gradient_checkpointing": [False, True],
    "torch_compile": ["off", "default", "max-autotune"],
    "dataloader_num_workers": [0, 2, 4],
}  # fmt: skip
# What a storage call can raise under contention; anything else is a bug in this script.
STORAGE_ERRORS = (
    optuna.exceptions.OptunaError,
    sqlalchemy.exc.SQLAlchemyError,
    sqlite3.Error,
    OSError,
    ValueError,
    RuntimeError,
    KeyError,
)


# -- opening each candidate -----------------------------------------------------------------


def storage_file(kind: str, folder: Path) -> Path:
    return folder / ("study.log" if kind == "journal" else "study.db")


def open_storage(
    kind: str, path: Path, *, busy_timeout_s: float, heartbeat: tuple[int, int] | None = None
) -> optuna.storages.BaseStorage:
    """The candidate storage on `path`; `heartbeat` = (interval, grace) seconds, RDB only."""
    if kind == "journal":
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    beat = (
        {}
        if heartbeat is None
        else {"heartbeat_interval": heartbeat[0], "grace_period": heartbeat[1]}
    )
    if kind == "sqlite-default":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(f"sqlite:///{path}", **beat)
    assert kind in ("sqlite-wal", "sqlite-wal-immediate"), kind
    # WAL is a property of the database file: set once, every later connection uses it.
    with contextlib.closing(sqlite3.connect(path, timeout=busy_timeout_s)) as conn:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    connect_args: dict[str, Any] = {"timeout": busy_timeout_s}
    if kind == "sqlite-wal-immediate":
        # pysqlite's own transaction handling issues BEGIN only before a write, so Optuna's
        # read-then-write (e.g. popping a queued trial: SELECT state, UPDATE to RUNNING) runs as
        # two transactions and two workers can pop the same trial; SQLite has no SELECT ... FOR
        # UPDATE. Taking the write lock when a session begins makes each one atomic.
        connect_args["isolation_level"] = None  # pysqlite issues no BEGIN of its own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            f"sqlite:///{path}", engine_kwargs={"connect_args": connect_args}, **beat
        )
    if kind == "sqlite-wal-immediate":
        sqlalchemy.event.listen(storage.engine, "begin", begin_immediate)
    return storage


def begin_immediate(conn: sqlalchemy.engine.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def pragma(storage: optuna.storages.RDBStorage, name: str) -> Any:
    """A PRAGMA read back through the storage's own engine (what Optuna's sessions see)."""
    with storage.engine.connect() as conn:
        return conn.exec_driver_sql(f"PRAGMA {name}").scalar()


class WalConnection(sqlite3.Connection):
    """A pysqlite connection that switches its database to WAL when it opens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")


def wal_setup_checks(folder: Path, busy_timeout_s: float) -> dict[str, dict[str, Any]]:
    """What each way of asking for WAL and a busy timeout through Optuna 5 actually sets."""

    def fresh(name: str) -> str:
        return f"sqlite:///{folder / name}"

    def listener(conn: sqlite3.Connection, _record: object) -> None:
        conn.execute("PRAGMA journal_mode=WAL")

    def after_init_listener() -> optuna.storages.RDBStorage:
        storage = optuna.storages.RDBStorage(fresh("listener.db"))
        # create_all in __init__ already made the pooled connection: the listener is too late
        sqlalchemy.event.listen(storage.engine, "connect", listener)
        return storage

    ways: dict[str, Callable[[], optuna.storages.RDBStorage]] = {
        "default": lambda: optuna.storages.RDBStorage(fresh("default.db")),
        "connect_args_timeout": lambda: optuna.storages.RDBStorage(
            fresh("timeout.db"), engine_kwargs={"connect_args": {"timeout": busy_timeout_s}}
        ),
        "pragma_once_on_file": lambda: open_storage(
            "sqlite-wal", folder / "once.db", busy_timeout_s=busy_timeout_s
        ),
        "event_listener_after_init": after_init_listener,
        "connect_args_factory": lambda: optuna.storages.RDBStorage(
            fresh("factory.db"),
            engine_kwargs={"connect_args": {"timeout": busy_timeout_s, "factory": WalConnection}},
        ),
        "uri_query_journal_mode": lambda: optuna.storages.RDBStorage(
            f"sqlite:///file:{folder / 'uri.db'}?mode=rwc&journal_mode=WAL&uri=true"
        ),
    }
    checks = {}
    for name, make in ways.items():
        storage = make()
        checks[name] = {
            "journal_mode_via_storage": pragma(storage, "journal_mode"),
            "busy_timeout_ms_via_storage": pragma(storage, "busy_timeout"),
        }
        storage.engine.dispose()
        db = str(storage.engine.url.database).removeprefix("file:").split("?")[0]
        with contextlib.closing(sqlite3.connect(db)) as conn:
            checks[name]["journal_mode_in_file"] = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return checks


def read_only_checks(folder: Path, busy_timeout_s: float) -> dict[str, Any]:
    """Does a WAL study open through autotune's read-only URL (`mode=ro`), with a writer
    still connected and after every writer has gone (no -wal/-shm files left)?"""
    path = folder / "ro.db"
    writer = open_storage("sqlite-wal", path, busy_timeout_s=busy_timeout_s)
    study = optuna.create_study(study_name=STUDY, storage=writer, directions=["maximize"])
    study.tell(study.ask(), 1.0)
    url = f"sqlite:///file:{path}?mode=ro&uri=true"

    def read() -> str:
        try:
            reader = optuna.storages.RDBStorage(url)
            n = len(optuna.load_study(study_name=STUDY, storage=reader).get_trials())
            reader.engine.dispose()
            return f"ok, {n} trial(s)"
        except STORAGE_ERRORS as exc:
            return error_kind(exc)

    with writer.engine.connect():  # a live writer connection, as during a search
        while_writing = read()
    writer.engine.dispose()
    left = sorted(p.name for p in folder.glob("ro.db-*"))
    return {
        "while_a_writer_is_connected": while_writing,
        "after_writers_closed": read(),
        "files_left_after_close": left,
    }


def long_reader_check(kind: str, hold_s: float, busy_timeout_s: float) -> str:
    """A write while another connection holds a read transaction open for `hold_s` (a viewer,
    a `sqlite3` shell, a slow report): does it wait, fail, or go through?"""
    with tempfile.TemporaryDirectory(prefix="storages-reader-") as tmp:
        path = Path(tmp) / "study.db"
        study = optuna.create_study(
            study_name=STUDY, storage=open_storage(kind, path, busy_timeout_s=busy_timeout_s)
        )
        reading = threading.Event()

        def reader() -> None:
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("BEGIN")
                conn.execute("SELECT count(*) FROM trials").fetchall()
                reading.set()
                time.sleep(hold_s)
                conn.execute("COMMIT")

        thread = threading.Thread(target=reader)
        thread.start()
        reading.wait()
        start = time.perf_counter()
        try:
            study.set_user_attr("written", True)
            outcome = "ok"
        except STORAGE_ERRORS as exc:
            outcome = error_kind(exc)
        waited_s = time.perf_counter() - start
        thread.join()
        return f"{outcome} after {waited_s:.2f} s"


# -- one worker process ---------------------------------------------------------------------


def error_kind(exc: BaseException) -> str:
    """`Type <- CauseType: first line`, without the SQL statement SQLAlchemy appends."""
    cause = exc.__cause__ or exc.__context__
    name = type(exc).__name__ + (f" <- {type(cause).__name__}" if cause is not None else "")
    text = str(cause if cause is not None else exc).strip().splitlines()
    return f"{name}: {text[0][:120]}" if text else name


def trial_attrs(index: int, seq: int, params: dict[str, Any]) -> dict[str, Any]:
    """The five user attrs a search stores when it starts a trial (sizes as autotune's)."""
    return {
        "owner": {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_started": time.time(),
            "worker": index,
            "seq": seq,
        },
        "params": params,
        "spec": {"training_args": {f"field_{i}": [i, i * 0.5, f"value-{i}"] for i in range(60)}},
        "device": {
            "name": "NVIDIA H100 80GB HBM3",
            "total_memory_bytes": 80 * 10**9,
            "compute_capability": "9.0",
            "bf16_supported": True,
            "torch": "2.11.0",
            "transformers": "5.17.0",
            "cuda": "12.8",
            "driver": "570.86.15",
        },
        "space": {"name": "default", "version": 3, "notes": ["tensor-core multiples of 64"]},
    }


def result_attr(rng: random.Random) -> dict[str, Any]:
    """A ~3 KB result dict, as `TrialResult.to_dict()` stores."""
    return {
        "schema": 2,
        "status": "ok",
        "samples_per_s": rng.uniform(10, 500),
        "peak_memory_gib": rng.uniform(5, 90),
        "step_times_ms": [rng.uniform(90, 110) for _ in range(100)],
        "losses": [rng.uniform(1, 9) for _ in range(40)],
        "stderr_tail": "x" * 300,
    }


class Clock:
    """Per-operation latencies (seconds) and errors, collected in a worker."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()

    @contextlib.contextmanager
    def time(self, op: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.latency.setdefault(op, []).append(time.perf_counter() - start)


def worker_main(
    kind: str, path: str, index: int, cfg: dict[str, Any], barrier: Any, out: str
) -> None:
    """Loop as a search worker does until the study holds `cfg["trials"]` COMPLETE trials."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    # A trial handed to two workers: the second set_constraint warns; counted as asked_twice
    warnings.filterwarnings("ignore", "The constraint value is ignored", UserWarning)
    rng = random.Random(cfg["seed"] * 1000 + index)
    storage = open_storage(kind, Path(path), busy_timeout_s=cfg["busy_timeout_s"])
    sampler = optuna.samplers.TPESampler(
        seed=cfg["seed"] * 1000 + index, multivariate=True, group=True, constant_liar=True
    )
    study = optuna.load_study(study_name=STUDY, storage=storage, sampler=sampler)
    clock, told, reads, asked = Clock(), [], [], []
    barrier.wait()
    deadline = time.monotonic() + cfg["deadline_s"]
    seq = 0
    while time.monotonic() < deadline:
        try:
            start = time.perf_counter()
            trials = study.get_trials(deepcopy=False)
            reads.append((len(trials), time.perf_counter() - start))
        except STORAGE_ERRORS as exc:
            clock.errors[f"get_trials: {error_kind(exc)}"] += 1
            time.sleep(0.05)
            continue
        if sum(t.state == TrialState.COMPLETE for t in trials) >= cfg["trials"]:
            break
        seq += 1
        trial, op = None, "ask"
        try:
            with clock.time("ask"):
                trial = study.ask()
                asked.append(trial._trial_id)
                params = {k: trial.suggest_categorical(k, v) for k, v in SPACE.items()}
            op = "attrs"
            with clock.time("attrs"):
                for key, value in trial_attrs(index, seq, params).items():
                    trial.set_user_attr(key, value)
            time.sleep(rng.uniform(0, cfg["trial_ms"]) / 1000)
            values = [round(rng.uniform(10, 500), 6), round(rng.uniform(5, 90), 6)]
            op = "record"
            with clock.time("record"):
                trial.set_user_attr("result", result_attr(rng))
                trial.set_user_attr("samples_per_s", values[0])
                trial.set_user_attr("peak_memory_gib", values[1])
                trial.set_user_attr("status", "ok")
                trial.set_user_attr("noisy", False)
                trial.set_constraint("peak_over_budget_gib", values[1] - 80.0)
            op = "tell"
            with clock.time("tell"):
                study.tell(trial, values)
            told.append([trial.number, values])
        except STORAGE_ERRORS as exc:
            clock.errors[f"{op}: {error_kind(exc)}"] += 1
            if trial is not None:
                try:
                    study.tell(trial, state=TrialState.FAIL)
                except STORAGE_ERRORS as again:
                    clock.errors[f"tell FAIL: {error_kind(again)}"] += 1
    Path(out).write_text(
        json.dumps(
            {
                "finished_at": time.time(),
                "timed_out": time.monotonic() >= deadline,
                "latency": clock.latency,
                "errors": clock.errors,
                "told": told,
                "reads": reads,
                "asked": asked,
            }
        )
    )


# -- one cell: a storage, N workers ---------------------------------------------------------


def run_cell(kind: str, workers: int, repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # no SQLAlchemy pool or file handle shared with the parent
    with tempfile.TemporaryDirectory(prefix="storages-") as tmp:
        folder = Path(tmp)
        path = storage_file(kind, folder)
        storage = open_storage(kind, path, busy_timeout_s=args.busy_timeout)
        study = optuna.create_study(
            study_name=STUDY, storage=storage, directions=["maximize", "minimize"]
        )
        queued = []
        for i in range(args.enqueue):  # as autotune queues the baseline and retries
            study.enqueue_trial({k: v[i % len(v)] for k, v in SPACE.items()})
            queued.append(study.get_trials(deepcopy=False)[-1]._trial_id)
        if isinstance(storage, optuna.storages.RDBStorage):
            storage.engine.dispose()
        del study, storage
        cfg = {
            "trials": args.trials,
            "trial_ms": args.trial_ms,
            "deadline_s": args.deadline,
            "busy_timeout_s": args.busy_timeout,
            "seed": repeat,
        }
        barrier = ctx.Barrier(workers + 1)
        procs = [
            ctx.Process(
                target=worker_main,
                args=(kind, str(path), i, cfg, barrier, str(folder / f"worker-{i}.json")),
            )
            for i in range(workers)
        ]
        for proc in procs:
            proc.start()
        barrier.wait()
        started = time.time()
        for proc in procs:
            proc.join(args.deadline + 60)
        outs = []
        for i, proc in enumerate(procs):
            out = folder / f"worker-{i}.json"
            outs.append(json.loads(out.read_text()) if out.is_file() else None)
            if proc.exitcode != 0:
                proc.kill()
        exitcodes = [proc.exitcode for proc in procs]
        return summarise(kind, path, args, outs, exitcodes, started, queued)


def summarise(
    kind: str,
    path: Path,
    args: argparse.Namespace,
    outs: list[dict[str, Any] | None],
    exitcodes: list[int | None],
    started: float,
    queued: list[int],
) -> dict[str, Any]:
    """Check the stored study against what the workers told, and the latencies."""
    done = [o for o in outs if o is not None]
    errors: Counter[str] = Counter()
    for o in done:
        errors.update(o["errors"])
    # Cleaning up after an error (telling the trial FAIL) often fails the same way: not counted
    primary = sum(n for kind, n in errors.items() if not kind.startswith("tell FAIL"))
    for code in exitcodes:
        if code != 0:
            errors[f"worker exited {code}"] += 1
    # A fresh process's first read (a new worker, the report), then a warm one.
    start = time.perf_counter()
    storage = open_storage(kind, path, busy_timeout_s=args.busy_timeout)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    trials = study.get_trials(deepcopy=False)
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    study.get_trials(deepcopy=False)
    warm_s = time.perf_counter() - start
    numbers = [t.number for t in trials]
    complete = {t.number: t for t in trials if t.state == TrialState.COMPLETE}
    told = [n for o in done for n, _ in o["told"]]
    wrong = sum(n not in complete or complete[n].values != v for o in done for n, v in o["told"])
    by_id = {t._trial_id: t for t in trials}
    asked = Counter(i for o in done for i in o["asked"])
    latency: dict[str, list[float]] = {}
    for o in done:
        for op, values in o["latency"].items():
            latency.setdefault(op, []).extend(values)
    late = [s for o in done for n, s in o["reads"] if n >= 0.75 * args.trials]
    latency["get_trials_late"] = late
    if isinstance(storage, optuna.storages.RDBStorage):
        storage.engine.dispose()
    return {
        "wall_s": max((o["finished_at"] for o in done), default=started) - started,
        "errors": primary,
        "error_kinds": dict(errors),
        "complete": len(complete),
        "overshoot": len(complete) - args.trials,
        "told_complete": len(told),
        "lost_or_wrong": wrong,
        "untold_complete": len(set(complete) - set(told)),
        "duplicated_numbers": len(numbers) - len(set(numbers)),
        "numbers_contiguous": sorted(numbers) == list(range(len(numbers))),
        "fail": sum(t.state == TrialState.FAIL for t in trials),
        "running_left": sum(t.state == TrialState.RUNNING for t in trials),
        "queued_finished": all(i in by_id and by_id[i].state.is_finished() for i in queued),
        "asked_twice": sum(n > 1 for n in asked.values()),
        "told_twice": sum(n > 1 for n in Counter(told).values()),
        # values told by one worker, result attrs written by another: a record that lies
        "values_not_attrs": sum(
            t.user_attrs.get("samples_per_s") != t.values[0] for t in complete.values()
        ),
        "timed_out": any(o["timed_out"] for o in done),
        "ms": {
            op: {"p50": 1000 * pct(v, 50), "p95": 1000 * pct(v, 95), "n": len(v)}
            for op, v in latency.items()
            if v
        },
        "cold_read_ms": 1000 * cold_s,
        "warm_read_ms": 1000 * warm_s,
        "file_kib": sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1024,
    }


def pct(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- a worker killed mid-trial --------------------------------------------------------------


def quiet_heartbeat_warnings() -> None:
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    # "Heartbeat of storage is supposed to be used with Study.optimize": ask/tell works (below)
    warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)


def beat(storage: Any, trial_id: int, interval_s: float, stop: threading.Event) -> None:
    """What a search's heartbeat thread does while its trial runs."""
    storage.record_heartbeat(trial_id)
    while not stop.wait(interval_s):
        storage.record_heartbeat(trial_id)


def victim_main(kind: str, path: str, cfg: dict[str, Any], started: Any) -> None:
    """Start a trial (with heartbeats where the storage has them), say which, then hang."""
    quiet_heartbeat_warnings()
    heartbeat = cfg["heartbeat"] if kind != "journal" else None
    storage = open_storage(
        kind, Path(path), busy_timeout_s=cfg["busy_timeout_s"], heartbeat=heartbeat
    )
    study = optuna.load_study(study_name=STUDY, storage=storage)
    trial = study.ask()
    for key, value in trial_attrs(-1, 0, {}).items():
        trial.set_user_attr(key, value)
    if heartbeat is not None:
        threading.Thread(
            target=beat,
            args=(study._storage, trial._trial_id, heartbeat[0], threading.Event()),
            daemon=True,
        ).start()
    started.put(trial._trial_id)
    time.sleep(3600)


def watcher_main(
    kind: str, path: str, index: int, cfg: dict[str, Any], stop: Any, out: str
) -> None:
    """A healthy worker: fail_stale_trials before each ask, heartbeats while a trial runs."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    quiet_heartbeat_warnings()
    rng = random.Random(index)
    storage = open_storage(
        kind, Path(path), busy_timeout_s=cfg["busy_timeout_s"], heartbeat=cfg["heartbeat"]
    )
    sampler = optuna.samplers.TPESampler(
        seed=index, multivariate=True, group=True, constant_liar=True
    )
    study = optuna.load_study(study_name=STUDY, storage=storage, sampler=sampler)
    clock, mine = Clock(), []
    while not stop.is_set():
        try:
            with clock.time("fail_stale_trials"):
                optuna.storages.fail_stale_trials(study)
            trial = study.ask()
            mine.append(trial._trial_id)
            for name, choices in SPACE.items():
                trial.suggest_categorical(name, choices)
            done = threading.Event()
            thread = threading.Thread(
                target=beat, args=(study._storage, trial._trial_id, cfg["heartbeat"][0], done)
            )
            thread.start()
            time.sleep(rng.uniform(*cfg["watcher_trial_s"]))
            done.set()
            thread.join()
            study.tell(trial, [1.0, 1.0])
        except STORAGE_ERRORS as exc:
            clock.errors[error_kind(exc)] += 1
    Path(out).write_text(
        json.dumps({"errors": clock.errors, "mine": mine, "latency": clock.latency})
    )


def kill_test(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL a worker mid-trial; how long until its trial is FAIL, and who else suffers?"""
    ctx = mp.get_context("spawn")
    heartbeat = (args.heartbeat_interval, args.grace_period)
    cfg = {
        "busy_timeout_s": args.busy_timeout,
        "heartbeat": heartbeat,
        "watcher_trial_s": (0.1, 1.5),
    }
    with tempfile.TemporaryDirectory(prefix="storages-kill-") as tmp:
        folder = Path(tmp)
        path = storage_file(kind, folder)
        storage = open_storage(kind, path, busy_timeout_s=args.busy_timeout)
        optuna.create_study(study_name=STUDY, storage=storage, directions=["maximize"] * 2)
        stop, started = ctx.Event(), ctx.Queue()
        victim = ctx.Process(target=victim_main, args=(kind, str(path), cfg, started))
        watchers = [
            ctx.Process(
                target=watcher_main,
                args=(kind, str(path), i, cfg, stop, str(folder / f"w{i}.json")),
            )
            for i in range(0 if kind == "journal" else args.watchers)  # no heartbeat to watch
        ]
        try:
            for proc in [*watchers, victim]:
                proc.start()
            trial_id = started.get(timeout=120)
            time.sleep(args.kill_after)  # mid-trial, after a few heartbeats
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            reader = open_storage(kind, path, busy_timeout_s=args.busy_timeout)
            state, waited = reader.get_trial(trial_id).state, 0.0
            while state == TrialState.RUNNING and waited < args.kill_wait:
                time.sleep(0.05)
                state, waited = reader.get_trial(trial_id).state, time.monotonic() - killed
        finally:
            stop.set()
            for proc in [victim, *watchers]:
                proc.join(60)
                if proc.exitcode is None:
                    proc.kill()
        outs = [json.loads((folder / f"w{i}.json").read_text()) for i in range(len(watchers))]
        healthy = [reader.get_trial(t) for o in outs for t in o["mine"]]
        errors: Counter[str] = Counter()
        for o in outs:
            errors.update(o["errors"])
        checks = [s for o in outs for s in o["latency"].get("fail_stale_trials", [])]
        return {
            "victim_state": state.name,
            "kill_to_fail_s": waited if state == TrialState.FAIL else None,
            "watched_s": waited,
            "healthy_trials": len(healthy),
            "healthy_failed": sum(t.state == TrialState.FAIL for t in healthy),
            "errors": dict(errors),
            "fail_stale_trials_ms_p50": 1000 * pct(checks, 50) if checks else None,
        }


def stale_journal_lock(args: argparse.Namespace) -> dict[str, Any]:
    """A journal writer killed while holding the lock leaves `<file>.lock` behind: how long does
    the next write wait? (Made by hand: the window inside append_logs is too short to hit.)"""
    with tempfile.TemporaryDirectory(prefix="storages-lock-") as tmp:
        path = Path(tmp) / "study.log"
        storage = open_storage("journal", path, busy_timeout_s=args.busy_timeout)
        study = optuna.create_study(study_name=STUDY, storage=storage)
        os.symlink(path, str(path) + ".lock")  # what JournalFileSymlinkLock.acquire makes
        start = time.perf_counter()
        study.set_user_attr("after_a_stale_lock", True)
        return {"write_waited_s": time.perf_counter() - start}


def torn_journal_line() -> dict[str, Any]:
    """A journal whose last line was cut short (power loss or a full disk inside a write), then
    written on by later workers: what do they and a new reader get?"""
    with tempfile.TemporaryDirectory(prefix="storages-torn-") as tmp:
        path = Path(tmp) / "study.log"
        study = optuna.create_study(
            study_name=STUDY, storage=open_storage("journal", path, busy_timeout_s=1)
        )
        study.tell(study.ask(), 1.0)
        with path.open("ab") as f:
            f.write(b'{"op_code":4,"worker_id":"cut-')
        outcome = {}
        for step in ("first_write_after", "second_write_after", "fresh_read"):
            try:
                again = optuna.load_study(
                    study_name=STUDY, storage=open_storage("journal", path, busy_timeout_s=1)
                )
                if step != "fresh_read":
                    again.tell(again.ask(), 2.0)
                outcome[step] = f"ok, {len(again.get_trials())} trial(s)"
            except (*STORAGE_ERRORS, AttributeError) as exc:  # AttributeError: raised by ask
                outcome[step] = error_kind(exc)
        return outcome


# -- the whole run --------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over repeats of every number; error kinds and checks summed."""
    kinds: Counter[str] = Counter()
    for run in runs:
        kinds.update(run["error_kinds"])
    ops = sorted({op for run in runs for op in run["ms"]})
    return {
        **{
            k: spread([run[k] for run in runs])
            for k in (
                "wall_s",
                "errors",
                "complete",
                "overshoot",
                "fail",
                "cold_read_ms",
                "warm_read_ms",
                "file_kib",
            )
        },
        "lost_or_wrong": sum(run["lost_or_wrong"] for run in runs),
        "asked_twice": sum(run["asked_twice"] for run in runs),
        "told_twice": sum(run["told_twice"] for run in runs),
        "values_not_attrs": sum(run["values_not_attrs"] for run in runs),
        "untold_complete": sum(run["untold_complete"] for run in runs),
        "duplicated_numbers": sum(run["duplicated_numbers"] for run in runs),
        "running_left": sum(run["running_left"] for run in runs),
        "numbers_contiguous": all(run["numbers_contiguous"] for run in runs),
        "queued_finished": all(run["queued_finished"] for run in runs),
        "timed_out": any(run["timed_out"] for run in runs),
        "error_kinds": dict(kinds),
        "ms": {
            op: {
                q: spread([run["ms"][op][q] for run in runs if op in run["ms"]])
                for q in ("p50", "p95")
            }
            for op in ops
        },
    }


def print_row(kind: str, workers: int, cell: dict[str, Any]) -> None:
    """One line: medians over repeats, (min-max) after the wall time and errors."""

    def ms(op: str) -> str:
        q = cell["ms"].get(op)
        return f"{q['p50']['median']:.0f}/{q['p95']['median']:.0f}" if q else "-"

    wall, errors = cell["wall_s"], cell["errors"]
    lost = cell["lost_or_wrong"] + cell["duplicated_numbers"] + cell["running_left"]
    print(
        f"{kind:20s} N={workers} wall {wall['median']:5.1f}s ({wall['min']:.1f}-{wall['max']:.1f})"
        f" errors {errors['median']:.0f} ({errors['min']:.0f}-{errors['max']:.0f})"
        f" lost {lost} asked/told twice {cell['asked_twice']}/{cell['told_twice']}"
        f" mixed {cell['values_not_attrs']}"
        f"  ms p50/p95: get_trials@~T {ms('get_trials_late')} ask {ms('ask')}"
        f" attrs {ms('attrs')} record {ms('record')} tell {ms('tell')}"
        f"  cold read {cell['cold_read_ms']['median']:.0f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storages", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--trials", type=int, default=200, help="COMPLETE trials per cell")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trial-ms", type=float, default=20.0, help="a trial sleeps 0 to this")
    parser.add_argument("--enqueue", type=int, default=8, help="queued trials per cell")
    parser.add_argument("--busy-timeout", type=float, default=30.0, help="sqlite-wal, seconds")
    parser.add_argument("--deadline", type=float, default=600.0, help="per cell, seconds")
    parser.add_argument("--reader-hold", type=float, default=8.0, help="long-reader check, s")
    parser.add_argument("--heartbeat-interval", type=int, default=1)
    parser.add_argument("--grace-period", type=int, default=2)
    parser.add_argument("--watchers", type=int, default=2, help="healthy workers in kill tests")
    parser.add_argument("--kill-after", type=float, default=2.5, help="seconds into the trial")
    parser.add_argument("--kill-wait", type=float, default=15.0)
    parser.add_argument("--kill-repeats", type=int, default=3)
    parser.add_argument("--skip-stale-lock", action="store_true", help="saves ~30 s")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "storages.json"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    results: dict[str, Any] = {
        "versions": {
            "optuna": optuna.__version__,
            "sqlalchemy": sqlalchemy.__version__,
            "sqlite": sqlite3.sqlite_version,
        },
        "cpus": os.cpu_count(),
        # Paths are machine-specific: the results keep settings that describe the run only.
        "settings": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
    }
    with tempfile.TemporaryDirectory(prefix="storages-setup-") as tmp:
        results["wal_setup"] = wal_setup_checks(Path(tmp), args.busy_timeout)
        results["read_only_open_wal"] = read_only_checks(Path(tmp), args.busy_timeout)
    print(json.dumps(results["wal_setup"], indent=1), json.dumps(results["read_only_open_wal"]))
    results["write_under_long_reader"] = {
        kind: long_reader_check(kind, args.reader_hold, args.busy_timeout)
        for kind in args.storages
        if kind != "journal"
    }
    print("write under a long reader:", results["write_under_long_reader"], flush=True)
    cells: dict[str, dict[str, Any]] = {}
    for workers in args.workers:
        for kind in args.storages:
            runs = [run_cell(kind, workers, r, args) for r in range(args.repeats)]
            cell = aggregate(runs)
            cells.setdefault(kind, {})[str(workers)] = {**cell, "runs": runs}
            print_row(kind, workers, cell)
    results["cells"] = cells
    kills: dict[str, Any] = {}
    for kind in args.storages:
        kills[kind] = [kill_test(kind, args) for _ in range(args.kill_repeats)]
        print(kind, "kill:", json.dumps(kills[kind]), flush=True)
    results["kill_mid_trial"] = kills
    if "journal" in args.storages:
        results["torn_journal_line"] = torn_journal_line()
        print("torn journal line:", results["torn_journal_line"])
    if "journal" in args.storages and not args.skip_stale_lock:
        results["stale_journal_lock"] = stale_journal_lock(args)
        print("stale journal lock:", results["stale_journal_lock"])
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
