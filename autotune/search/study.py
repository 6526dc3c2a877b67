"""The ask -> checks -> run -> tell loop over an Optuna multi-objective study (max samples/s,
min memory), the sampler it asks, and retrying trials a stopped search left behind.

Re-running the same study resumes it: recorded trials are kept and count toward `n_trials`.
Other searches may write the same study: every iteration reads the records afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.util
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from autotune.common.errors import ConfigError
from autotune.common.knobs import is_compiled
from autotune.common.trial import Progress, Status, TrialResult, TrialSpec
from autotune.plan.plan import SearchPlan
from autotune.search import checks, runner
from autotune.search.interrupts import SearchInterrupted
from autotune.store import storage_file
from autotune.store.records import (
    BASELINE_ATTR,
    INTERRUPTED_BY_ATTR,
    NOT_RUN_ATTR,
    OWNER_ATTR,
    PARAMS_ATTR,
    RETRY_OF_ATTR,
    VERSIONS_ATTR,
    TrialRecord,
    counts_toward_n_trials,
    is_interrupted,
    is_recorded,
    record_of,
    tell_repeat,
    tell_result,
)

MAX_REPEATS = 50
RUNNING_BACKOFF_S = 0.5
"""Pause before asking again when a proposal is being run by another process."""
UNOWNED_GRACE_S = 60.0
"""A RUNNING trial that names no owner this long after it started was left by an old search."""
WAIT_FOR_OTHERS_S = 1.0
"""Pause between looks at the study while its last trials run in other processes."""
TIMED_OUT = "timeout: "
"""How `run_search` says that `timeout=` ended it (also in `parallel`'s joined words)."""
INTERRUPTED_RESULT = "result.interrupted.json"
"""What a worker wrote for a trial whose search died before recording it: set aside, not used."""


def make_sampler(plan: SearchPlan, *, seed: int) -> optuna.samplers.BaseSampler:
    """The configured sampler. TPE, NSGA-II and GP read each trial's constraint, so trials that
    ran out of memory steer them away; random and grid ignore constraints."""
    name = plan.config.sampler
    if name == "gp":
        # Optuna's GP models the knobs jointly and takes running trials into account (other
        # workers' proposals). It runs on torch in this process (CPU tensors, never CUDA), a
        # second or so per proposal, and needs scipy.
        if importlib.util.find_spec("scipy") is None:
            raise ConfigError(
                'sampler=gp needs scipy: pip install "autotune[gp]", or use sampler=tpe'
            )
        import torch

        # One thread: other workers' trials may be running on the cores while this one asks.
        torch.set_num_threads(1)
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name in ("auto", "tpe"):
        # Multivariate TPE (the `auto` pick, after benchmarks/replay.py) models the knobs
        # jointly (batch size and checkpointing interact);
        # `group` splits the conditional space (compile_mode, 64-multiple batches) into parts
        # that always appear together, instead of falling back to independent sampling.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # constant_liar: trials other processes are running count as bad results while
            # they run, so several workers do not all ask for the same point.
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True
            )
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


class SearchObserver:
    """What the loop tells whoever watches it (the terminal, a notebook); each does nothing
    here. Called in the search process, between trials or while one runs."""

    def busy(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Around work before the search (`probing the device`)."""
        return contextlib.nullcontext()

    def planned(self, plan: SearchPlan, done_before: int) -> None:
        """The study is open (under its lock); `done_before` trials were recorded earlier."""

    def watching(self) -> contextlib.AbstractContextManager[None]:
        """Around the loop (a live display)."""
        return contextlib.nullcontext()

    def ended(self, stopped: str) -> None:
        """The loop ended normally; `stopped` says why."""

    def retried(self, number: int) -> None:
        """Trial `number` was interrupted earlier: its settings run again first."""

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        """A worker is starting on these settings."""

    def progress(self, number: int, progress: Progress) -> None:
        """The running trial's worker wrote a new progress record."""

    def trial_ended(self, record: TrialRecord) -> None:
        """A trial was recorded (measured, failed or skipped)."""

    def worker_failed(self, index: int, how: str, log_tail: str) -> None:
        """Worker `index` of several (`workers=N`) ended in an error; the others go on."""

    def warned(self, message: str) -> None:
        """Something the user must hear now, while a trial runs (the study file deleted)."""

    def lost(self, number: int) -> None:
        """Trial `number` ran here, but another process had failed it as stale meanwhile (this
        one sent no heartbeat for `stale_after`): its result was dropped; a retry runs it."""

    def confirming(self, picks: int, rounds: int, expected_s: float) -> None:
        """The search ended; `picks` trials run again `rounds` times, interleaved, in about
        `expected_s` (what their trials took)."""

    def confirmed_run(self, round_number: int, record: TrialRecord, result: TrialResult) -> None:
        """One run of the confirmation ended."""


def run_search(
    plan: SearchPlan,
    study: optuna.Study,
    *,
    observer: SearchObserver | None = None,
    launcher: runner.Launcher | None = None,
) -> str:
    """Run trials until the study has `n_trials` run (skipped ones run nothing and do not
    count) or `timeout` has passed; says why it stopped. Other processes may run the same
    study at the same time (`workers=N`, `autotune worker`): `n_trials` counts the whole
    study's trials, not this loop's.

    The first trial of a study is the baseline (HF defaults; `enqueue_baseline`). Before each
    trial, every record is read afresh, trials whose search died are failed (a dead process on
    this host at once, any other after `stale_after` without a heartbeat) and their settings
    queued to run again once (`recover`), and the pre-trial checks run
    (`checks.PRE_TRIAL_CHECKS`): settings already run are told, not run again, and settings at
    least as memory-hungry as a known OOM, whichever process met it, or estimated over the
    budget by more than `estimate_margin`, are skipped.

    A SQLite study file deleted or replaced meanwhile stops the loop after the running trial
    (`StudyFileLost`): SQLite would go on writing to the deleted file, and a resume would find
    nothing.
    """
    config = plan.config
    watch = storage_file.FileWatch.of(plan.storage_url)  # None on a database server
    observer = observer or SearchObserver()
    launcher = launcher or runner.ForkserverLauncher()
    deadline = time.monotonic() + config.timeout if config.timeout else float("inf")
    budget_gib = plan.info.memory_budget_gib
    baseline = plan.space.optuna_params(plan.baseline, plan.rules)
    baseline_in_space = plan.space.holds(plan.baseline, plan.rules)
    pre_trial = checks.PRE_TRIAL_CHECKS
    if plan.estimate_limit_gib is not None:
        pre_trial += (
            checks.over_budget_by_estimate(
                plan.estimate_gib, plan.estimate_limit_gib, plan.estimate_limit_source
            ),
        )
    enqueue_baseline(study, baseline)
    repeats = 0
    while True:
        if watch is not None and watch.lost():
            raise watch.error(sum(is_recorded(t) for t in study.get_trials(deepcopy=False)))
        for number in recover(study, plan.study_dir, baseline):
            observer.retried(number)
        trials = study.get_trials(deepcopy=False)  # afresh: other processes record trials too
        records = [record_of(t) for t in trials if is_recorded(t)]
        done = sum(counts_toward_n_trials(t) for t in trials)
        if done >= config.n_trials:
            return f"{done} of {config.n_trials} trials finished"
        if time.monotonic() > deadline:
            return f"{TIMED_OUT}{done} of {config.n_trials} trials finished"
        sampler = study.sampler
        if isinstance(sampler, AskTellGridSampler) and sampler.is_exhausted(study):
            return f"every grid point has run: {done} trials finished"
        running = sum(t.state is TrialState.RUNNING for t in trials)
        if done + running >= config.n_trials:
            # The last trials run in other processes: wait for them; one whose process dies
            # is failed by `recover` and run again here.
            time.sleep(WAIT_FOR_OTHERS_S)
            continue
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for study.optimize: this loop beats itself.
            warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
            trial = study.ask()
        try:
            with _heartbeat(trial):
                trial.set_user_attr(OWNER_ATTR, _this_process())
                trial.set_user_attr(VERSIONS_ATTR, plan.versions)  # measured under (conditions)
                if trial.user_attrs.get(BASELINE_ATTR):  # queued by enqueue_baseline or a retry
                    for name, (distribution, _) in baseline.items():
                        suggest(trial, name, distribution)  # the queued values: Optuna sees them
                    params = dict(plan.baseline)
                else:
                    params = plan.space.sample(trial, plan.rules)
                # Published before looking at the others, so that of two processes proposing the
                # same settings at once, at least one sees the other's.
                trial.set_user_attr(PARAMS_ATTR, params)
                # Read again, after publishing: a trial another process recorded since the
                # read above (before `ask`) must count as measured here, or these settings
                # would run twice (seen on PostgreSQL, whose reads are not serialized with
                # the other processes' writes as SQLite's are).
                trials = study.get_trials(deepcopy=False)
                records = [record_of(t) for t in trials if is_recorded(t)]
                not_run = _not_to_run(study, trial, params, config.n_trials, trials)
                if not_run is not None:
                    trial.set_user_attr(NOT_RUN_ATTR, not_run.reason)
                    study.tell(trial, state=TrialState.FAIL)
                    if not_run.same_as_running:
                        # Their result will be in the records soon; ask again rather than measure
                        # the same settings twice.
                        repeats += 1
                        if repeats >= MAX_REPEATS:
                            return f"the last {MAX_REPEATS} proposals were running or run already"
                        time.sleep(RUNNING_BACKOFF_S)
                    continue
                skip = checks.first_skip(params, records, pre_trial)
                if skip is not None:
                    # Repeats and skips run nothing and use up no trial: too many of them in a
                    # row and the space is exhausted.
                    repeats += 1
                    if repeats >= MAX_REPEATS:
                        trial.set_user_attr(NOT_RUN_ATTR, "the space looks exhausted")
                        study.tell(trial, state=TrialState.FAIL)
                        return (
                            f"the last {MAX_REPEATS} proposals repeated settings already run or "
                            f"were skipped: the space looks exhausted after {done} trials"
                        )
                else:
                    repeats = 0
                if skip is not None and skip.repeat_of is not None:
                    tell_repeat(study, trial, skip.repeat_of, budget_gib)
                    continue
                estimate_gib = plan.estimate_gib(params)
                if skip is not None:
                    result = TrialResult(status=Status.SKIPPED, reason=skip.reason)
                else:
                    observer.trial_started(trial.number, params)
                    try:
                        result = launch(
                            plan,
                            trial.number,
                            params,
                            launcher,
                            on_progress=_watching(observer, trial.number, watch),
                        )
                    except BaseException as exc:
                        # Ctrl-C or a bug in the parent: the trial ends FAIL without a result,
                        # which is how a later run of the study recognises it as interrupted.
                        _note_interruption(trial, exc)
                        with contextlib.suppress(ValueError):  # failed as stale meanwhile
                            study.tell(trial, state=TrialState.FAIL)
                        _set_aside_result(trial_dir(plan.study_dir, trial.number))
                        raise
                in_space = baseline_in_space or not trial.user_attrs.get(BASELINE_ATTR)
                result = dataclasses.replace(result, estimate_gib=estimate_gib)
                tell_result(study, trial, result, budget_gib, noise_cv=plan.info.noise_cv,
                            in_space=in_space)  # fmt: skip
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if study.get_trials(deepcopy=False)[trial.number].state is TrialState.RUNNING:
                raise
            # Another process finished this trial under it: failed as stale (no heartbeat
            # for `stale_after`: this process was stopped or cut off from the storage), and
            # its settings queued again; the retry's result is the one kept.
            _set_aside_result(trial_dir(plan.study_dir, trial.number))
            observer.lost(trial.number)
            continue
        observer.trial_ended(record_of(study.get_trials(deepcopy=False)[trial.number]))


@dataclasses.dataclass(frozen=True)
class _NotRun:
    reason: str
    same_as_running: bool = False


def _not_to_run(
    study: optuna.Study,
    trial: optuna.Trial,
    params: dict[str, Any],
    n_trials: int,
    trials: list[FrozenTrial] | None = None,
) -> _NotRun | None:
    """Why a trial just asked for must not run, looking at every process's `trials` (read
    after this one's settings were published; read here when not given): a second baseline or
    a second retry of the same interrupted trial (queued by two processes at once), one more
    than `n_trials` (trials asked for earlier go first: their numbers are smaller), or
    settings another process is running."""
    if trials is None:
        trials = study.get_trials(deepcopy=False)
    queued_as = _queued_as(trial)
    if queued_as is not None:
        for other in trials[: trial.number]:
            if _queued_as(other) == queued_as:
                return _NotRun(f"trial {other.number} was queued for the same: {queued_as}")
    ahead = sum(
        counts_toward_n_trials(t) or (t.state is TrialState.RUNNING and t.number < trial.number)
        for t in trials
    )
    if ahead >= n_trials:
        return _NotRun(f"n_trials={n_trials} were finished or running when it was asked for")
    key = checks.settings_key(params)
    for other in trials:
        theirs = other.user_attrs.get(PARAMS_ATTR)
        if (
            other.state is TrialState.RUNNING
            and other.number != trial.number
            and theirs is not None
            and checks.settings_key(theirs) == key
        ):
            if (
                queued_as is not None
                and other.number > trial.number
                and (_queued_as(other) == queued_as)
            ):
                # A later copy of this queued trial (two processes queued it at once): it
                # steps aside for this one above; stepping aside here too would run neither.
                continue
            return _NotRun(f"trial {other.number} was running these settings", True)
    return None


def _queued_as(trial: FrozenTrial | optuna.Trial) -> str | None:
    """What a trial was queued for: the baseline, or another run of an interrupted trial."""
    retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
    if retry_of is not None:
        return f"trial {retry_of}'s settings again"
    return "the baseline" if trial.user_attrs.get(BASELINE_ATTR) else None


@contextlib.contextmanager
def _heartbeat(trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat every `heartbeat_interval` seconds while it runs, from a
    thread of this process, so another process can tell a dead search's trial from a slow one.
    (Optuna beats only inside `study.optimize`; this loop asks and tells itself.)"""
    storage = trial.storage
    interval = storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a storage hiccup: the next beat may pass
                storage.record_heartbeat(trial._trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _watching(
    observer: SearchObserver, number: int, watch: storage_file.FileWatch | None
) -> Callable[[Progress], None]:
    """Passes the running trial's progress on, and warns once, while it runs, when the study
    file is gone (the loop stops when the trial ends)."""
    warned = False

    def on_progress(progress: Progress) -> None:
        nonlocal warned
        observer.progress(number, progress)
        if watch is not None and not warned and watch.lost():
            warned = True
            observer.warned(f"{watch.path} was deleted or replaced: this search stops when "
                            f"trial {number} ends, and the study cannot be resumed")  # fmt: skip

    return on_progress


def launch(
    plan: SearchPlan,
    number: int,
    params: dict[str, Any],
    launcher: runner.Launcher,
    on_progress: Callable[[Progress], None],
    folder: Path | None = None,
) -> TrialResult:
    """Run one trial of the plan's study in `folder` (default: `trials/NNNN/`)."""
    config = plan.config
    spec = TrialSpec(
        trial_number=number,
        model_name=plan.model.name,
        model_config=plan.model.config,
        task=plan.info.task,
        seq_len=config.seq_len,
        device=plan.device,
        params=params,
        warmup_steps=config.warmup_steps,
        measure_steps=config.measure_steps,
        seed=config.seed,
        memory_budget_bytes=plan.info.memory_budget_bytes,
        compile_cache_dir=str(plan.study_dir / "inductor-cache"),
        peak_tflops=config.peak_tflops,
        data_dir=str(plan.data_dir) if plan.data_dir else None,
        trainer=plan.info.trainer_factory,
        trainer_dir=str(plan.search_dir),
    )
    return runner.launch_trial(
        spec,
        folder or trial_dir(plan.study_dir, number),
        # Compiling gets its own allowance on top of the training time.
        timeout_s=config.trial_timeout + (config.compile_timeout if is_compiled(params) else 0),
        launcher=launcher,
        # On CUDA the worker caps its allocator at the budget; on CPU the parent watches RSS.
        rss_limit_bytes=plan.info.memory_budget_bytes if plan.device == "cpu" else None,
        on_progress=on_progress,
    )


def trial_dir(study_dir: Path, number: int) -> Path:
    return study_dir / "trials" / f"{number:04d}"


def _note_interruption(trial: optuna.Trial, exc: BaseException) -> None:
    """Which signal stopped the search while this trial ran, for its row in the outputs. On
    the way out: one quick write, and a storage that fails it must not stop the exit (the
    trial is recognised as interrupted without it)."""
    if isinstance(exc, KeyboardInterrupt):
        name = exc.signal_name if isinstance(exc, SearchInterrupted) else "SIGINT"
        with contextlib.suppress(Exception):
            trial.set_user_attr(INTERRUPTED_BY_ATTR, name)


def _set_aside_result(trial_dir: Path) -> None:
    """A result the search never recorded (it was interrupted) must not pass for a measurement:
    the study, not this file, says what a trial measured."""
    result = trial_dir / "result.json"
    if result.exists():
        result.replace(trial_dir / INTERRUPTED_RESULT)


def _this_process() -> dict[str, Any]:
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "pid_started": me.create_time()}


def _owner_is_gone(trial: FrozenTrial) -> bool:
    """Whether the search that ran a trial has ended. Only a process on this host can be
    checked; a trial run from another host is left to its heartbeats."""
    owner = trial.user_attrs.get(OWNER_ATTR)
    if owner is None:
        # A search names itself right after asking; a trial still unnamed long after was left
        # by a search of a version that named none.
        started = trial.datetime_start or datetime.datetime.now()
        return (datetime.datetime.now() - started).total_seconds() > UNOWNED_GRACE_S
    if owner["host"] != socket.gethostname():
        return False
    try:
        # The same pid with another start time is a new process that reused the number.
        return psutil.Process(owner["pid"]).create_time() != owner["pid_started"]
    except psutil.NoSuchProcess:
        return True


def enqueue_baseline(
    study: optuna.Study, baseline: dict[str, tuple[optuna.distributions.BaseDistribution, Any]]
) -> None:
    """Queue the baseline (HF defaults) as a new study's first trial. Whoever asks next runs
    it, and only one does: a queued trial is handed out once, also to several processes
    asking at the same time. It is run as it is, outside the sampler's space; its settings are
    Optuna parameters too (where the space's distributions hold them), so the sampler and
    Optuna's tools see it. Queued, it takes no grid point. Two processes queueing it at the
    same moment queue two: only the first runs (`_not_to_run`)."""
    if not any(t.user_attrs.get(BASELINE_ATTR) for t in study.get_trials(deepcopy=False)):
        values = {name: value for name, (_, value) in baseline.items()}
        study.enqueue_trial(values, user_attrs={BASELINE_ATTR: True})


def suggest(
    trial: optuna.Trial, name: str, distribution: optuna.distributions.BaseDistribution
) -> Any:
    """`trial.suggest_*` for a distribution: a queued trial answers with its queued value."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    assert isinstance(distribution, optuna.distributions.IntDistribution), distribution
    return trial.suggest_int(
        name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
    )


def recover(
    study: optuna.Study,
    study_dir: Path,
    baseline: dict[str, tuple[optuna.distributions.BaseDistribution, Any]],
) -> list[int]:
    """Fail the trials whose search has died, and queue each interrupted trial's settings to
    run once more; returns the numbers of the trials queued again.

    A trial's search has died when it ran on this host and its process is gone, or, from any
    host, when it has sent no heartbeat for `stale_after` (Optuna's `fail_stale_trials`; the
    storage's clock). A live search's trial is left alone. Several processes may recover at
    once: a trial is failed by one of them, and of two retries queued for the same trial only
    the first runs (`_not_to_run`). An interrupted baseline is queued with the baseline's
    Optuna parameters (`SearchSpace.optuna_params`; older studies stored none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _owner_is_gone(trial):
            # Another process may fail it at the same moment: one of the two does.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF_ATTR) for t in trials}
    queued = []
    for trial in trials:
        first_run = trial.number not in retried and RETRY_OF_ATTR not in trial.user_attrs
        if is_interrupted(trial) and first_run:
            _set_aside_result(trial_dir(study_dir, trial.number))
            params, attrs = trial.params, {RETRY_OF_ATTR: trial.number}
            if trial.user_attrs.get(BASELINE_ATTR):
                params = {name: value for name, (_, value) in baseline.items()}
                attrs[BASELINE_ATTR] = True
            study.enqueue_trial(params, user_attrs=attrs)
            queued.append(trial.number)
    return queued
