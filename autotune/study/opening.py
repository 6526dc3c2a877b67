"""Opening a study for a finished plan, in one place: the study folder's lock, the storage, the
plan settled against what the study stored (`plan.settle`), the sampler, the stored run info and
settings, and the baseline queued once. A search opens its study with `locked_study`; a worker
process of the same search, or `autotune worker` from another host, joins it with
`open_study(plan, joining=True)` after `join_config` has read the study's settings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.common.errors import ConfigError, StudyError
from autotune.common.layout import STUDY_DB
from autotune.common.urls import safe_url
from autotune.plan.config import PER_PROCESS_SETTINGS, RunConfig, WorkerConfig
from autotune.plan.factory_trust import factory_to_run
from autotune.plan.overrides import make_config
from autotune.plan.plan import Reference, SearchPlan
from autotune.plan.settle import settle
from autotune.store.records import (
    BASELINE_ATTR,
    DIRECTIONS,
    OBJECTIVES,
    REFERENCE_ATTR,
    RUN_ATTR,
    SETTINGS_ATTR,
    is_recorded,
    run_info,
    store_run_info,
)
from autotune.store.storage import load_named, open_storage, write_back
from autotune.store.study_lock import StudyLock
from autotune.study.sampling.sampler import make_sampler


@contextlib.contextmanager
def locked_study(
    plan: SearchPlan, what: str = "search"
) -> Iterator[tuple[optuna.Study, SearchPlan]]:
    """The study, opened under the study folder's lock, and the plan with the stored budget.

    Refuses a study another search holds. A failure before the study opens leaves no trace: a
    study folder made by this call is removed again, and so is an `out=` folder it made (when
    nothing else was put in it meanwhile).
    """
    missing = [p for p in (plan.study_dir, *plan.study_dir.parents) if not p.exists()]
    created = _make_study_dir(plan.study_dir)
    opened = False
    try:
        with StudyLock.acquire(plan.study_dir, plan.study_name, what):
            study, plan = open_study(plan)
            opened = True
            try:
                yield study, plan
            finally:
                write_back(plan.storage_url)
    finally:
        if created and not opened:
            shutil.rmtree(plan.study_dir, ignore_errors=True)
            for folder in missing[1:]:  # innermost first; rmdir leaves one in use alone
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _make_study_dir(study_dir: Path) -> bool:
    """Create the study folder; True when it did not exist before."""
    try:
        study_dir.mkdir(parents=True)
    except FileExistsError:
        if study_dir.is_dir():
            return False  # made before, or a moment ago by a search started at the same time
        raise StudyError(
            f"cannot create the study folder {study_dir}: a file has its name"
        ) from None
    except OSError as exc:
        raise StudyError(
            f"cannot create the study folder {study_dir}: {exc.strerror}; "
            "check out= (it must be a folder this user can write)"
        ) from exc
    return True


def open_study(
    plan: SearchPlan, *, joining: bool = False, storage: optuna.storages.BaseStorage | None = None
) -> tuple[optuna.Study, SearchPlan]:
    """Create the study, or load it when it exists and was made for the same run, and return
    it with the plan settled for it (`plan.settle`: identity, conditions, the stored budget,
    the batch sizes fitted to it).

    A search stores its run info and settings with the study, for workers that join it, and
    queues the baseline once; a worker (`joining`) takes them as they are. `storage`: another
    than the plan's (the landscape replay's in-memory one)."""
    storage = storage or open_storage(plan.storage_url, stale_after_s=plan.config.stale_after)
    study = optuna.create_study(
        study_name=plan.study_name,
        storage=storage,
        directions=list(DIRECTIONS),
        load_if_exists=True,
    )
    stored = run_info(study) if RUN_ATTR in study.user_attrs else None
    plan = settle(plan, stored, joining=joining)
    trials = study.get_trials(deepcopy=False)
    _refuse_other_values(plan, trials)
    # Offset the seed by the trials already run, so a resumed study does not replay the same
    # random start-up proposals it made the first time; a worker among several by its pid, so
    # that they do not all propose the same start-up points.
    recorded = sum(is_recorded(t) for t in trials)
    seed = plan.config.seed + recorded + (os.getpid() if joining else 0)
    study.sampler = make_sampler(plan, seed=seed % 2**32)
    if not joining:
        with warnings.catch_warnings():
            # Stable in practice since Optuna 3.2; it names the objectives in Optuna's tools.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(OBJECTIVES))
        store_run_info(study, plan.info)
        study.set_user_attr(SETTINGS_ATTR, study_settings(plan))
        # Queued before any worker starts, so that none of them queues it too.
        enqueue_baseline(study, trials, plan.space.optuna_params(plan.baseline, plan.rules))
        if (reference := plan.reference()) is not None:  # the defaults will not fit
            enqueue_reference(study, trials, reference_params(plan, reference))
    return study, plan


def _refuse_other_values(plan: SearchPlan, trials: list[FrozenTrial]) -> None:
    """Refuse a space whose knobs take other values than the study's trials were given (the
    space file was edited): Optuna keeps one set of values per parameter in a study, and would
    fail the first trial that asks with the new ones."""
    stored: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in trials:
        stored.update(trial.distributions)
    now = plan.space.distributions(plan.rules)
    changed = [
        f"{name} ({_values(stored[name])} in the study, {_values(now[name])} now)"
        for name in sorted(set(stored) & set(now))
        if stored[name] != now[name]
    ]
    if changed:
        raise StudyError(
            f"study={plan.study_name} was searched with other values of {'; '.join(changed)}. "
            "A study keeps each knob's values: restore them in the space, or search the new "
            "space as another study= name (or out= folder)"
        )


def _values(distribution: optuna.distributions.BaseDistribution) -> str:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return str(list(distribution.choices))
    return f"{distribution.low}..{distribution.high}"  # type: ignore[attr-defined]


def study_settings(plan: SearchPlan) -> dict[str, Any]:
    """The settings a worker joining the study takes from it (the rest are its own); the
    device as resolved (a worker on a host without the study's device is refused)."""
    settings = plan.config.model_dump(mode="json") | {"device": plan.device}
    return {k: v for k, v in settings.items() if k not in PER_PROCESS_SETTINGS}


def join_config(worker: WorkerConfig) -> RunConfig:
    """The settings of the study a worker joins (`autotune worker`), with the worker's own.

    The study must exist: a worker joins a search, it does not start one."""
    url = worker.storage
    if url is None:
        if worker.study is None:
            raise ConfigError(
                "study: required when storage= is not given (the study folder "
                "OUT/STUDY holds study.db)"
            )
        db = worker.out / worker.study / STUDY_DB
        if not db.is_file():
            raise StudyError(
                f"{db}: no such file; start the study with autotune search, or give its storage="
            )
        url = f"sqlite:///{db.resolve()}"
    shown = f"storage={safe_url(url)}"
    study = load_named(
        open_storage(url, shown=shown),
        worker.study,
        shown,
        missing="; start it with autotune search",
    )
    name = study.study_name
    settings = study.user_attrs.get(SETTINGS_ATTR)
    if settings is None:
        raise StudyError(
            f"study={name} stores no search settings (it was made by an older autotune or by "
            "Optuna alone): resume it with autotune search"
        )
    # Read whole, before anything runs: a study a later autotune wrote is refused here.
    stored_trainer = run_info(study).trainer if RUN_ATTR in study.user_attrs else None
    # Before anything imports it: the worker's own choice, or the very file the search checked.
    trainer = factory_to_run(stored_trainer, worker.trainer, Path.cwd(), name)
    own = worker.model_dump(exclude={"study", "storage", "trainer"})
    return make_config({**settings, **own, "study": name, "storage": url, "trainer": trainer})


def reference_params(
    plan: SearchPlan, reference: Reference
) -> dict[str, tuple[optuna.distributions.BaseDistribution, Any]]:
    """The reference as Optuna parameters (`SearchSpace.optuna_params`), less those the
    baseline holds with another distribution: a knob the space fixes (a single batch size
    left by the budget) has a one-value distribution at the baseline's value, and a study
    holds one distribution per name."""
    baseline = plan.space.optuna_params(plan.baseline, plan.rules)
    return {
        name: (distribution, value)
        for name, (distribution, value) in plan.space.optuna_params(
            reference.params, plan.rules
        ).items()
        if name not in baseline or baseline[name][0] == distribution
    }


def enqueue_reference(
    study: optuna.Study,
    trials: list[FrozenTrial],
    reference: dict[str, tuple[optuna.distributions.BaseDistribution, Any]],
) -> None:
    """Queue the reference (`SearchPlan.reference`) once, after the baseline: where the HF
    defaults do not fit, speedups are told against it."""
    if not any(t.user_attrs.get(REFERENCE_ATTR) for t in trials):
        values = {name: value for name, (_, value) in reference.items()}
        study.enqueue_trial(values, user_attrs={REFERENCE_ATTR: True})


def enqueue_baseline(
    study: optuna.Study,
    trials: list[FrozenTrial],
    baseline: dict[str, tuple[optuna.distributions.BaseDistribution, Any]],
) -> None:
    """Queue the baseline (HF defaults) as a new study's first trial. Whoever asks next runs
    it, and only one does: a queued trial is handed out once, also to several processes
    asking at the same time. It is run as it is, outside the sampler's space; its settings are
    Optuna parameters too (where the space's distributions hold them), so the sampler and
    Optuna's tools see it. Queued, it takes no grid point. Two processes queueing it at the
    same moment queue two: only the first runs (`not_run.not_to_run`)."""
    if not any(t.user_attrs.get(BASELINE_ATTR) for t in trials):
        values = {name: value for name, (_, value) in baseline.items()}
        study.enqueue_trial(values, user_attrs={BASELINE_ATTR: True})
