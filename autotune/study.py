"""The ask -> run -> tell loop over an Optuna multi-objective study (max samples/s, min memory).

Storage is SQLite in the study folder by default, so re-running the same study resumes it:
finished trials are kept and count toward `n_trials`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import runner
from autotune.errors import StudyError
from autotune.plan import SearchPlan
from autotune.records import PARAMS_ATTR, RESULT_ATTR, TrialRecord, record_of
from autotune.trial import Status, TrialResult, TrialSpec

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
PLAN_ATTR = "plan"
RETRY_OF_ATTR = "retry_of"
REPEAT_OF_ATTR = "repeat_of"
MAX_REPEATS = 50
NOTES_ATTR = "space_notes"


def open_study(plan: SearchPlan) -> optuna.Study:
    """Create the study, or load it when it exists and was made for the same run."""
    plan.study_dir.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(plan.storage_url)
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    finished = 0
    if plan.study_name in existing:
        stored = existing[plan.study_name].user_attrs.get(PLAN_ATTR)
        if stored != plan.describe():
            raise StudyError(
                f"study={plan.study_name} in {plan.storage_url} was made for {stored}, "
                f"not {plan.describe()}; pick another study= name or out= folder"
            )
        finished = len(_finished(optuna.load_study(study_name=plan.study_name, storage=storage)))
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time.
    sampler = optuna.samplers.TPESampler(seed=plan.config.seed + finished)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        sampler=sampler,
        load_if_exists=True,
    )
    with warnings.catch_warnings():
        # Stable in practice since Optuna 3.2; it names the objectives in Optuna's own tools.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    study.set_user_attr(PLAN_ATTR, plan.describe())
    study.set_user_attr(NOTES_ATTR, list(plan.space.notes))
    return study


def run_search(
    plan: SearchPlan,
    study: optuna.Study,
    *,
    on_trial_end: Callable[[TrialRecord], None] = lambda record: None,
    launcher: runner.Launcher | None = None,
) -> str:
    """Run trials until `n_trials` are finished or `timeout` has passed; says why it stopped.

    Trials interrupted earlier (Ctrl-C, or the search process killed) are retried once first.
    A configuration that was already run is not run again.
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
        trial = study.ask()
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
        try:
            result = _run(plan, trial.number, params, launcher)
        except BaseException:
            # Ctrl-C or a bug in the parent: the trial ends FAIL without a result, which is
            # how a later run of the same study recognises it as interrupted and retries it.
            study.tell(trial, state=TrialState.FAIL)
            raise
        trial.set_user_attr(RESULT_ATTR, result.to_dict())
        if result.status is Status.OK:
            study.tell(trial, [result.samples_per_s, result.peak_memory_gib])
        else:
            study.tell(trial, state=TrialState.FAIL)
        finished = study.get_trials(deepcopy=False)[trial.number]
        done[_key(params)] = finished
        on_trial_end(record_of(finished))
    return f"{len(done)} of {config.n_trials} trials finished"


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
        study.tell(trial, earlier.values)
    else:
        study.tell(trial, state=TrialState.FAIL)


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if RESULT_ATTR in t.user_attrs]


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)
