"""The ask -> run -> tell loop over an Optuna multi-objective study (max samples/s, min memory).

Storage is SQLite in the study folder by default, so re-running the same study resumes it:
finished trials are kept and count toward `n_trials`.
"""

from __future__ import annotations

import importlib.util
import json
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import runner
from autotune.errors import ConfigError, StudyError
from autotune.plan import SearchPlan
from autotune.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    RESULT_ATTR,
    RUN_ATTR,
    TrialRecord,
    record_of,
    store_run_info,
)
from autotune.trial import Status, TrialResult, TrialSpec

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
# What makes a study what it is: a resumed study must have been made for the same.
IDENTITY = ("model", "task", "seq_len", "device", "space", "batch_mode")
RETRY_OF_ATTR = "retry_of"
REPEAT_OF_ATTR = "repeat_of"
MAX_REPEATS = 50
CONSTRAINT = "peak_over_budget_gib"
MEMORY_STATUSES = (Status.OOM, Status.HOST_OOM, Status.SKIPPED)
GIB = 1024**3


def open_study(plan: SearchPlan) -> optuna.Study:
    """Create the study, or load it when it exists and was made for the same run."""
    plan.study_dir.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(plan.storage_url)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        load_if_exists=True,
    )
    if study.user_attrs:  # an existing study: it must have been made for this run
        stored = study.user_attrs.get(RUN_ATTR, {})
        made_for = {k: stored.get(k) for k in IDENTITY}
        wanted = {k: getattr(plan.run_info(), k) for k in IDENTITY}
        if made_for != wanted:
            raise StudyError(
                f"study={plan.study_name} in {plan.storage_url} was made for {made_for}, "
                f"not {wanted}; pick another study= name or out= folder"
            )
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time.
    study.sampler = make_sampler(plan, seed=plan.config.seed + len(_finished(study)))
    with warnings.catch_warnings():
        # Stable in practice since Optuna 3.2; it names the objectives in Optuna's own tools.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    store_run_info(study, plan.run_info())
    return study


def load_study_dir(study_dir: Path, storage_url: str | None, name: str | None) -> optuna.Study:
    """A finished or running study, from its folder's study.db or another storage."""
    if storage_url is None:
        db = study_dir / "study.db"
        if not db.is_file():
            raise StudyError(f"{db}: no such file; give the study folder of a search, or storage=")
        storage_url = f"sqlite:///{db.resolve()}"
    storage = optuna.storages.RDBStorage(storage_url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if name is None:
        if len(names) != 1:
            raise StudyError(f"{storage_url} holds {len(names)} studies ({', '.join(names)}): "
                             "pick one with study=NAME")  # fmt: skip
        name = names[0]
    elif name not in names:
        raise StudyError(f"study={name} is not in {storage_url} (it has: {', '.join(names)})")
    return optuna.load_study(study_name=name, storage=storage)


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
    retry_interrupted(study)
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
    )
    compiling = params.get("torch_compile", "off") != "off"
    return runner.run_trial(
        spec,
        plan.study_dir / "trials" / f"{number:04d}",
        # Compiling gets its own allowance on top of the training time.
        timeout_s=config.trial_timeout + (config.compile_timeout if compiling else 0),
        launcher=launcher,
        # On CUDA the worker caps its allocator at the budget; on CPU the parent watches RSS.
        rss_limit_bytes=plan.memory_budget_bytes if plan.device == "cpu" else None,
    )


def retry_interrupted(study: optuna.Study) -> list[int]:
    """Close trials a killed search left RUNNING, and queue each interrupted config once."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # Single-writer storage (the default SQLite file): a RUNNING trial at start-up was
        # left by a search that died.
        study.tell(trial.number, state=TrialState.FAIL)
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
