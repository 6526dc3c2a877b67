"""The ask -> run -> tell loop over an Optuna multi-objective study (max samples/s, min memory).

Storage is SQLite in the study folder by default, so re-running the same study resumes it:
finished trials are kept and count toward `n_trials`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune import runner
from autotune.errors import StudyError
from autotune.plan import SearchPlan
from autotune.records import PARAMS_ATTR, RESULT_ATTR, TrialRecord, record_of
from autotune.trial import Status, TrialSpec

DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)
OBJECTIVES = ("samples_per_s", "peak_memory_gib")
PLAN_ATTR = "plan"
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
        finished = _count_finished(optuna.load_study(study_name=plan.study_name, storage=storage))
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
    worker_command: tuple[str, ...] = runner.WORKER_COMMAND,
) -> None:
    """Run trials until `n_trials` are finished or `timeout` has passed."""
    config = plan.config
    deadline = time.monotonic() + config.timeout if config.timeout else float("inf")
    while _count_finished(study) < config.n_trials and time.monotonic() < deadline:
        trial = study.ask()
        params = plan.space.sample(trial, plan.rules)
        spec = TrialSpec(
            trial_number=trial.number,
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
        )
        trial_dir = plan.study_dir / "trials" / f"{trial.number:04d}"
        try:
            result = runner.run_trial(
                spec, trial_dir, timeout_s=config.trial_timeout, command=worker_command
            )
        except BaseException:
            # Ctrl-C or a bug in the parent: do not leave the trial RUNNING in storage.
            study.tell(trial, state=TrialState.FAIL)
            raise
        trial.set_user_attr(PARAMS_ATTR, params)
        trial.set_user_attr(RESULT_ATTR, result.to_dict())
        if result.status is Status.OK:
            study.tell(trial, [result.samples_per_s, result.peak_memory_gib])
        else:
            study.tell(trial, state=TrialState.FAIL)
        on_trial_end(record_of(study.get_trials(deepcopy=False)[trial.number]))


def _count_finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
