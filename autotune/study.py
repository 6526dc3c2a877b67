"""The ask -> run -> tell loop over an Optuna multi-objective study (max samples/s, min memory).

Storage is SQLite in the study folder by default, so re-running the same study resumes it:
finished trials are kept and count toward `n_trials`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from autotune import runner
from autotune.errors import ConfigError, StudyError
from autotune.plan import SearchPlan
from autotune.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    RESULT_ATTR,
    RUN_ATTR,
    RunInfo,
    TrialRecord,
    record_of,
    store_run_info,
)
from autotune.study_lock import StudyLock
from autotune.trial import Status, TrialResult, TrialSpec
from autotune.units import GIB, format_bytes

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
# What makes a study what it is: a resumed study must have been made for the same.
IDENTITY = ("model", "task", "seq_len", "device", "space", "effective_batch_size")
RETRY_OF_ATTR = "retry_of"
REPEAT_OF_ATTR = "repeat_of"
OWNER_ATTR = "owner"
"""The search process running a trial: {host, pid, pid_started}."""
MAX_REPEATS = 50
CONSTRAINT = "peak_over_budget_gib"
MEMORY_STATUSES = (Status.OOM, Status.HOST_OOM, Status.SKIPPED)
INTERRUPTED_RESULT = "result.interrupted.json"
"""What a worker wrote for a trial whose search died before recording it: set aside, not used."""


@contextlib.contextmanager
def locked_study(plan: SearchPlan) -> Iterator[tuple[optuna.Study, SearchPlan]]:
    """The study, opened under the study folder's lock, and the plan with the stored budget.

    Refuses a study another search holds. A failure before the study opens leaves no trace: a
    study folder made by this call is removed again.
    """
    created = _make_study_dir(plan.study_dir)
    opened = False
    try:
        with StudyLock.acquire(plan.study_dir, plan.study_name):
            study, plan = open_study(plan)
            opened = True
            yield study, plan
    finally:
        if created and not opened:
            shutil.rmtree(plan.study_dir, ignore_errors=True)


def _make_study_dir(study_dir: Path) -> bool:
    """Create the study folder; True when it did not exist before."""
    if study_dir.is_dir():
        return False
    try:
        study_dir.mkdir(parents=True)
    except OSError as exc:
        raise StudyError(
            f"cannot create the study folder {study_dir}: {exc.strerror}; "
            "check out= (it must be a folder this user can write)"
        ) from exc
    return True


def open_storage(url: str, *, shown: str | None = None) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage, or a StudyError that says why it cannot be opened."""
    shown = shown or f"storage={_safe_url(url)}"
    try:
        return optuna.storages.RDBStorage(url)
    except sqlalchemy.exc.OperationalError as exc:
        if "readonly database" in str(exc):
            # Opened read-only, Optuna found none of its tables and tried to create them.
            raise StudyError(
                f"{shown}: not an Optuna study storage (it has no study tables)"
            ) from exc
        raise StudyError(f"{shown}: cannot open it: {_first_line(exc.orig or exc)}") from exc
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        cause = exc.__cause__ or exc  # Optuna wraps a missing driver's ModuleNotFoundError
        raise StudyError(f"{shown}: cannot open it: {_first_line(cause)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _safe_url(url: str) -> str:
    """The URL with any password masked, for messages."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def open_study(plan: SearchPlan) -> tuple[optuna.Study, SearchPlan]:
    """Create the study, or load it when it exists and was made for the same run.

    The memory budget is part of a study: resolved once and stored, so that every trial's
    feasibility is judged against the same figure. A resumed study keeps its stored budget; an
    explicit `memory_budget=` that differs is refused.
    """
    storage = open_storage(plan.storage_url)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        load_if_exists=True,
    )
    if RUN_ATTR in study.user_attrs:  # an existing study: it must have been made for this run
        stored = RunInfo.of(study)
        made_for = {k: getattr(stored, k) for k in IDENTITY}
        wanted = {k: getattr(plan.run_info(), k) for k in IDENTITY}
        if made_for != wanted:
            raise StudyError(
                f"study={plan.study_name} in {_safe_url(plan.storage_url)} was made for "
                f"{made_for}, not {wanted}; pick another study= name or out= folder"
            )
        explicit = plan.config.memory_budget
        if explicit is not None and int(explicit) != stored.memory_budget_bytes:
            raise StudyError(
                f"memory_budget={format_bytes(int(explicit))}: study={plan.study_name} was "
                f"searched with a budget of {format_bytes(stored.memory_budget_bytes)}, and its "
                "trials were judged against it. Leave memory_budget out to resume with the "
                "stored one, or use another study= name for another budget"
            )
        plan = dataclasses.replace(plan, memory_budget_bytes=stored.memory_budget_bytes)
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time.
    study.sampler = make_sampler(plan, seed=plan.config.seed + len(_finished(study)))
    with warnings.catch_warnings():
        # Stable in practice since Optuna 3.2; it names the objectives in Optuna's own tools.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    store_run_info(study, plan.run_info())
    return study, plan


def load_study_dir(study_dir: Path, storage_url: str | None, name: str | None) -> optuna.Study:
    """A finished or running study, from its folder's study.db or another storage.

    SQLite files are opened read-only: reading a study never writes to it (Optuna would
    otherwise create its tables in any file it is pointed at)."""
    if storage_url is None:
        db = study_dir / "study.db"
        if not db.is_file():
            raise StudyError(f"{db}: no such file; give the study folder of a search, or storage=")
        storage_url = f"sqlite:///{db.resolve()}"
    shown = _safe_url(storage_url)
    storage = open_storage(_read_only(storage_url), shown=shown)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name is None:
        if len(names) != 1:
            raise StudyError(f"{shown} holds {len(names)} studies ({', '.join(names)}): "
                             "pick one with study=NAME")  # fmt: skip
        name = names[0]
    elif name not in names:
        raise StudyError(f"study={name} is not in {shown} (it has: {', '.join(names)})")
    return optuna.load_study(study_name=name, storage=storage)


def _read_only(url: str) -> str:
    """`sqlite:///path` -> SQLite's read-only URI form; other URLs unchanged."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return url  # open_storage names the problem
    if parsed.get_backend_name() != "sqlite" or parsed.query or not parsed.database:
        return url
    path = Path(parsed.database)
    if not path.is_file():
        raise StudyError(f"{path}: no such file")
    return f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"


def make_sampler(plan: SearchPlan, *, seed: int) -> optuna.samplers.BaseSampler:
    """The configured sampler. TPE, NSGA-II and GP read each trial's constraint, so trials that
    ran out of memory steer them away; random and grid ignore constraints."""
    name = plan.config.sampler
    if name in ("auto", "tpe"):
        # Multivariate TPE models the knobs jointly (batch size and checkpointing interact);
        # `group` splits the conditional space (compile_mode, 64-multiple batches) into parts
        # that always appear together, instead of falling back to independent sampling.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if name == "gp":
        # Optuna's GP runs on torch (CPU tensors, never CUDA) and needs scipy.
        if importlib.util.find_spec("scipy") is None:
            raise ConfigError("sampler=gp needs scipy: pip install scipy, or use sampler=tpe")
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "nsga2":
        population = max(4, min(50, plan.config.n_trials // 4))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return AskTellGridSampler(plan.space.grid(plan.rules), seed=seed)


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, for an ask-and-tell loop: `run_search` checks `is_exhausted` itself.

    GridSampler ends a study by calling `study.stop()` after the last grid point, which only
    works inside `study.optimize`; told through `study.tell` it raises."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: list[float] | None,
    ) -> None:
        pass


def run_search(
    plan: SearchPlan,
    study: optuna.Study,
    *,
    on_trial_end: Callable[[TrialRecord], None] = lambda record: None,
    launcher: runner.Launcher | None = None,
) -> str:
    """Run trials until `n_trials` are finished or `timeout` has passed; says why it stopped.

    The first trial of a study is the baseline (HF defaults). Trials interrupted earlier
    (Ctrl-C, or the search process killed) are retried once. Settings already run are not run
    again, and settings at least as memory-hungry as a known OOM are skipped.
    """
    config = plan.config
    launcher = launcher or runner.ForkserverLauncher()
    deadline = time.monotonic() + config.timeout if config.timeout else float("inf")
    retry_interrupted(study, plan.study_dir)
    done = {_key(t.user_attrs[PARAMS_ATTR]): t for t in _finished(study)}
    repeats = 0
    while len(done) < config.n_trials:
        if time.monotonic() > deadline:
            return f"timeout: {len(done)} of {config.n_trials} trials finished"
        sampler = study.sampler
        if isinstance(sampler, AskTellGridSampler) and sampler.is_exhausted(study):
            return f"every grid point has run: {len(done)} trials finished"
        if not done and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            # Enqueued, the baseline takes no grid point (it suggests nothing). A baseline
            # interrupted earlier is queued already, by retry_interrupted.
            study.enqueue_trial({})
        trial = study.ask()
        trial.set_user_attr(OWNER_ATTR, _this_process())
        if not done:
            # The baseline comes first and is run as it is, outside the sampler's space.
            params = dict(plan.baseline)
            trial.set_user_attr(BASELINE_ATTR, True)
        else:
            params = plan.space.sample(trial, plan.rules)
        trial.set_user_attr(PARAMS_ATTR, params)
        earlier = done.get(_key(params))
        if earlier is not None:
            _tell_repeat(study, trial, earlier)
            repeats += 1
            if repeats >= MAX_REPEATS:
                return (
                    f"the last {MAX_REPEATS} proposals repeated settings already run: "
                    f"the space looks exhausted after {len(done)} trials"
                )
            continue
        repeats = 0
        oom = doomed_by(params, done.values())
        if oom is not None:
            result = TrialResult(
                status=Status.SKIPPED,
                reason=f"at least as memory-hungry as trial {oom.number}, which ran out of memory",
            )
        else:
            try:
                result = _run(plan, trial.number, params, launcher)
            except BaseException:
                # Ctrl-C or a bug in the parent: the trial ends FAIL without a result, which
                # is how a later run of the same study recognises it as interrupted.
                study.tell(trial, state=TrialState.FAIL)
                _set_aside_result(_trial_dir(plan.study_dir, trial.number))
                raise
        _tell(study, trial, result, plan.memory_budget_bytes / GIB)
        finished = study.get_trials(deepcopy=False)[trial.number]
        done[_key(params)] = finished
        on_trial_end(record_of(finished))
    return f"{len(done)} of {config.n_trials} trials finished"


def _tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, budget_gib: float) -> None:
    """Tell Optuna the outcome. Out-of-memory is information, so OOM and skipped trials are
    COMPLETE but infeasible (samplers ignore FAIL trials and would keep proposing the region);
    failures that say nothing about memory are FAIL."""
    trial.set_user_attr(RESULT_ATTR, result.to_dict())
    if result.status is Status.OK:
        # Feasible when <= 0: the peak fits the budget.
        trial.set_constraint(CONSTRAINT, result.peak_memory_gib - budget_gib)
        study.tell(trial, [result.samples_per_s, result.peak_memory_gib])
    elif result.status in MEMORY_STATUSES:
        peak_gib = max(result.peak_memory_gib or budget_gib, budget_gib)
        # How far over is unknown (the allocator refused); any positive value is infeasible.
        trial.set_constraint(CONSTRAINT, max(peak_gib - budget_gib, 1.0))
        study.tell(trial, [0.0, peak_gib])
    else:
        study.tell(trial, state=TrialState.FAIL)


def doomed_by(params: dict[str, Any], trials: Iterable[FrozenTrial]) -> FrozenTrial | None:
    """A trial that ran out of memory with settings no hungrier than `params`, if any."""
    for trial in trials:
        status = trial.user_attrs[RESULT_ATTR]["status"]
        if status in (Status.OOM, Status.HOST_OOM) and at_least_as_hungry(
            params, trial.user_attrs[PARAMS_ATTR]
        ):
            return trial
    return None


def at_least_as_hungry(candidate: dict[str, Any], oom: dict[str, Any]) -> bool:
    """Same settings except a batch at least as large, or checkpointing off where the OOM had
    it on. Other knobs have no safe memory order (mixed precision keeps fp32 master weights),
    so they must match."""
    if set(candidate) != set(oom):
        return False
    for knob, value in candidate.items():
        if knob == "batch_size":
            if value < oom[knob]:
                return False
        elif knob == "gradient_checkpointing":
            if value and not oom[knob]:
                return False
        elif value != oom[knob]:
            return False
    return True


def _run(
    plan: SearchPlan, number: int, params: dict[str, Any], launcher: runner.Launcher
) -> TrialResult:
    config = plan.config
    spec = TrialSpec(
        trial_number=number,
        model_name=plan.model.name,
        model_config=plan.model.config,
        task=plan.task,
        seq_len=config.seq_len,
        device=plan.device,
        params=params,
        warmup_steps=config.warmup_steps,
        measure_steps=config.measure_steps,
        seed=config.seed,
        memory_budget_bytes=plan.memory_budget_bytes,
        compile_cache_dir=str(plan.study_dir / "inductor-cache"),
        peak_tflops=config.peak_tflops,
    )
    compiling = params.get("torch_compile", "off") != "off"
    return runner.run_trial(
        spec,
        _trial_dir(plan.study_dir, number),
        # Compiling gets its own allowance on top of the training time.
        timeout_s=config.trial_timeout + (config.compile_timeout if compiling else 0),
        launcher=launcher,
        # On CUDA the worker caps its allocator at the budget; on CPU the parent watches RSS.
        rss_limit_bytes=plan.memory_budget_bytes if plan.device == "cpu" else None,
    )


def _trial_dir(study_dir: Path, number: int) -> Path:
    return study_dir / "trials" / f"{number:04d}"


def _set_aside_result(trial_dir: Path) -> None:
    """A result the search never recorded (it was interrupted) must not pass for a measurement:
    the study, not this file, says what a trial measured."""
    result = trial_dir / "result.json"
    if result.exists():
        result.replace(trial_dir / INTERRUPTED_RESULT)


def _this_process() -> dict[str, Any]:
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "pid_started": me.create_time()}


def _owner_is_gone(owner: dict[str, Any] | None) -> bool:
    """Whether the search that ran a trial has ended. Only a process on this host can be
    checked; a trial run from another host is never touched here."""
    if owner is None:
        return True  # written before trials named their owner, by a single search
    if owner["host"] != socket.gethostname():
        return False
    try:
        # The same pid with another start time is a new process that reused the number.
        return psutil.Process(owner["pid"]).create_time() != owner["pid_started"]
    except psutil.NoSuchProcess:
        return True


def retry_interrupted(study: optuna.Study, study_dir: Path) -> list[int]:
    """Close trials a dead search left RUNNING, and queue each interrupted config once.

    A RUNNING trial whose search still lives (another process on this host, or any on another
    host) is left alone: it is not ours to end."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _owner_is_gone(trial.user_attrs.get(OWNER_ATTR)):
            study.tell(trial.number, state=TrialState.FAIL)
            _set_aside_result(_trial_dir(study_dir, trial.number))
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
    queued = []
    for trial in trials:
        interrupted = (
            trial.state is TrialState.FAIL
            and RESULT_ATTR not in trial.user_attrs
            and REPEAT_OF_ATTR not in trial.user_attrs
        )
        if interrupted and trial.number not in retried and RETRY_OF_ATTR not in trial.user_attrs:
            study.enqueue_trial(trial.params, user_attrs={RETRY_OF_ATTR: trial.number})
            queued.append(trial.number)
    return queued


def _tell_repeat(study: optuna.Study, trial: optuna.Trial, earlier: FrozenTrial) -> None:
    """Tell the sampler what the earlier run of these settings measured, without running."""
    trial.set_user_attr(REPEAT_OF_ATTR, earlier.number)
    if earlier.state is TrialState.COMPLETE:
        for key, value in earlier.constraints.items():
            trial.set_constraint(key, value)
        study.tell(trial, earlier.values)
    else:
        study.tell(trial, state=TrialState.FAIL)


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if RESULT_ATTR in t.user_attrs]


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)
