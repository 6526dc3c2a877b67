"""The storage format: what a study keeps in Optuna's storage, and the one way to read it back.

The study loop stores each trial's complete knob values and its `TrialResult` as user attrs, so
every output (tables, recommendation, report) can be rebuilt from the storage alone. Every
user-attr key is named here, with how a trial is told and decoded, but for those about a
search as a whole (how it ended, its confidence, verifications: `outcomes`); the outputs read
a study once through `autotune.outputs.snapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.common.errors import StudyError
from autotune.common.trial import MEMORY_STATUSES, SCHEMA_VERSION, Status, TrialResult
from autotune.plan import conditions
from autotune.plan.run_info import RunInfo

PARAMS_ATTR = "params"
"""Trial: every knob's value (Optuna's own params hold only what the sampler chose)."""
RESULT_ATTR = "result"
"""Trial: the `TrialResult`; a finished trial without one was interrupted or a repeat."""
BASELINE_ATTR = "baseline"
"""Trial: true for the HF-defaults trial."""
REFERENCE_ATTR = "reference"
"""Trial: true for the reference, queued where the HF defaults do not fit (the guides'
low-memory recipe on them: `SearchPlan.reference`); speedups are told against it then."""
RETRY_OF_ATTR = "retry_of"
"""Trial: the interrupted trial whose settings it runs again."""
SECOND_LOOK_ATTR = "second_look_of"
"""Trial: the stopped trial whose settings it runs again, to the end (`study.second_look`)."""
REPEAT_OF_ATTR = "repeat_of"
"""Trial: the earlier trial with the same settings, whose values it was told instead."""
NOT_RUN_ATTR = "not_run"
"""Trial: why a proposal ended FAIL without running (another process was running its settings,
the study had its n_trials, another retry ran the same settings): the sampler learns nothing
from it, and it does not count."""
SAME_AS_RUNNING_ATTR = "same_as_running"
"""Trial: NOT_RUN_ATTR's earlier name, for a proposal another process was running."""
OUTSIDE_SPACE_ATTR = "outside_space"
"""Trial: true for a measured trial (the baseline) whose settings are no point of the space: it
is told FAIL so that no sampler sees it. Relative samplers (GP, NSGA-II) model only parameters
every COMPLETE trial has with one distribution; one trial without them would empty that set
and leave them sampling at random."""
SETTINGS_ATTR = "settings"
"""Study: the search's settings (`RunConfig` keys), for a worker that joins the study."""
OWNER_ATTR = "owner"
"""Trial: the search process running it: {host, pid, pid_started}."""
RUN_ATTR = "run"
"""Study: the `RunInfo`."""
VERSIONS_ATTR = "versions"
"""Trial: the versions it was measured under (`conditions.installed_versions`)."""
PROVENANCE_PREFIX = "provenance:"
"""Study: one attr per run on it (`conditions.run_record`), keyed by this prefix and a run id,
so that runs on several hosts never write the same attr."""
CONFIRMATION_ATTR = "confirmation"
"""Study: the picks measured again after the search (`pareto.Confirmed.to_json`)."""
CONSTRAINT = "peak_over_budget_gib"
"""Trial constraint, feasible when <= 0: peak memory less the budget."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    number: int
    params: dict[str, Any]
    result: TrialResult
    baseline: bool = False
    """The HF-defaults trial every speedup is measured against."""
    reference: bool = False
    """The reference that fits, where the HF defaults do not (`REFERENCE_ATTR`)."""
    versions: dict[str, str] | None = None
    """What it was measured under (torch, transformers, autotune); None: not stored."""

    @property
    def status(self) -> Status:
        return self.result.status


def run_info(study: optuna.Study) -> RunInfo:
    """The `RunInfo` the study was made with."""
    if RUN_ATTR not in study.user_attrs:
        raise StudyError(f"study {study.study_name} was not made by autotune search")
    return RunInfo.from_stored(study.user_attrs[RUN_ATTR], study.study_name)


def store_run_info(study: optuna.Study, info: RunInfo) -> None:
    study.set_user_attr(RUN_ATTR, info.stored())


def start_run(study: optuna.Study, run: dict[str, Any]) -> str:
    """Store a run's provenance (`conditions.run_record`) as it starts; returns its key."""
    key = f"{PROVENANCE_PREFIX}{run['started']}:{run['host']}:{run['pid']}"
    study.set_user_attr(key, run)
    return key


def end_run(study: optuna.Study, key: str, run: dict[str, Any]) -> None:
    """Record when the run stored as `key` ended."""
    study.set_user_attr(key, run | {"ended": conditions.now()})


def read_runs(study: optuna.Study) -> tuple[dict[str, Any], ...]:
    """The provenance of each run on the study, oldest first."""
    runs = [v for k, v in study.user_attrs.items() if k.startswith(PROVENANCE_PREFIX)]
    return tuple(sorted(runs, key=lambda r: (r["started"], r["host"], r["pid"])))


def is_recorded(trial: FrozenTrial) -> bool:
    """Finished with a result: a measurement, a failure or a skip."""
    return trial.state.is_finished() and RESULT_ATTR in trial.user_attrs


def counts_toward_n_trials(trial: FrozenTrial) -> bool:
    """Recorded and run: a skip (not run, nothing spent) does not use up `n_trials`, nor does
    a second look (`study.second_look`), which runs one trial over it, nor a trial whose node
    left the cluster under it (`TrialResult.rerun`: its settings run again)."""
    if not is_recorded(trial) or SECOND_LOOK_ATTR in trial.user_attrs:
        return False
    result = record_of(trial).result
    return result.status is not Status.SKIPPED and not result.rerun  # rerun: run again


def trials_run(study: optuna.Study) -> int:
    """The trials that count toward `n_trials` so far."""
    return sum(counts_toward_n_trials(t) for t in study.get_trials(deepcopy=False))


def load_records(study: optuna.Study) -> list[TrialRecord]:
    """Recorded trials, oldest first."""
    return [record_of(t) for t in study.get_trials(deepcopy=False) if is_recorded(t)]


def record_of(trial: FrozenTrial) -> TrialRecord:
    """The trial's record; a StudyError naming the trial where what is stored is no record
    this autotune reads (a later one's, or one changed outside autotune)."""
    stored = trial.user_attrs[RESULT_ATTR]
    try:
        if not isinstance(stored, dict):
            raise ValueError(f"a {type(stored).__name__}, not a result")
        result = TrialResult.from_dict(stored)
        params = dict(trial.user_attrs[PARAMS_ATTR])
    except (ValueError, TypeError, KeyError) as exc:
        version = stored.get("schema_version") if isinstance(stored, dict) else None
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise StudyError(
                f"trial {trial.number} was recorded by a later autotune (result schema "
                f"{version}; this one reads {SCHEMA_VERSION}): open the study with that "
                "autotune or a later one"
            ) from exc
        raise StudyError(
            f"trial {trial.number}'s stored result cannot be read ({exc}): the study was "
            "changed outside autotune; rerun the search into another out= or study="
        ) from exc
    return TrialRecord(
        number=trial.number,
        params=params,
        result=result,
        baseline=bool(trial.user_attrs.get(BASELINE_ATTR)),
        reference=bool(trial.user_attrs.get(REFERENCE_ATTR)),
        versions=trial.user_attrs.get(VERSIONS_ATTR),
    )


FLAT_ATTRS = ("status", "samples_per_s", "tokens_per_s", "peak_memory_gib", "step_time_cv", "mfu")
"""Trial: the main figures as user attrs of their own, beside `result`, so that
`study.trials_dataframe()` and optuna-dashboard show them as columns (plus `noisy`)."""


def tell_result(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TrialResult,
    budget_gib: float,
    *,
    noise_cv: float,
    in_space: bool = True,
) -> None:
    """Record a trial's result and tell Optuna the outcome; a trial whose settings are no
    point of the space (`in_space=False`) is recorded, but told FAIL (OUTSIDE_SPACE_ATTR)."""
    trial.set_user_attr(RESULT_ATTR, result.to_dict())
    for name in FLAT_ATTRS:
        trial.set_user_attr(name, result.to_dict()[name])
    trial.set_user_attr("noisy", result.noisy(noise_cv))
    if not in_space:
        trial.set_user_attr(OUTSIDE_SPACE_ATTR, True)
        study.tell(trial, state=TrialState.FAIL)
        return
    _tell_outcome(study, trial, result, budget_gib)


def tell_repeat(
    study: optuna.Study, trial: optuna.Trial, earlier: TrialRecord, budget_gib: float
) -> None:
    """Tell the sampler what the earlier run of these settings measured, without running: the
    trial is not recorded (it does not count toward n_trials)."""
    trial.set_user_attr(REPEAT_OF_ATTR, earlier.number)
    _tell_outcome(study, trial, earlier.result, budget_gib)


def _tell_outcome(
    study: optuna.Study, trial: optuna.Trial, result: TrialResult, budget_gib: float
) -> None:
    """Out-of-memory is information, so OOM and skipped trials are COMPLETE but infeasible
    (samplers ignore FAIL trials and would keep proposing the region); failures that say
    nothing about memory are FAIL."""
    if result.status in (Status.OK, Status.STOPPED):  # a stopped trial: measured, slower
        trial.set_constraint(CONSTRAINT, result.peak_memory_gib - budget_gib)
        study.tell(trial, [result.samples_per_s, result.peak_memory_gib])
    elif result.status in MEMORY_STATUSES:
        peak_gib = max(result.peak_memory_gib or budget_gib, budget_gib)
        # How far over is unknown (the allocator refused); any positive value is infeasible.
        trial.set_constraint(CONSTRAINT, max(peak_gib - budget_gib, 1.0))
        study.tell(trial, [0.0, peak_gib])
    else:
        study.tell(trial, state=TrialState.FAIL)


def is_interrupted(trial: FrozenTrial) -> bool:
    """Failed without a result, and not a repeat nor a proposal that was not to run: its
    search stopped while it ran (or was found dead: gone from this host, or stale)."""
    return (
        trial.state is TrialState.FAIL
        and RESULT_ATTR not in trial.user_attrs
        and REPEAT_OF_ATTR not in trial.user_attrs
        and NOT_RUN_ATTR not in trial.user_attrs
        and SAME_AS_RUNNING_ATTR not in trial.user_attrs
    )


# --- How a search ended, and the trials it left interrupted --------------------------------
INTERRUPTED_BY_ATTR = "interrupted_by"
"""Trial: the signal (`SIGTERM`) that stopped its search while it ran."""
REFUSED_ATTR = "refused"
"""Trial: why it was refused before it ran (a link planted in its folder); it runs again."""


# --- What the search thinks is left to find --------------------------------------------------


def interrupted_records(trials: list[FrozenTrial]) -> list[TrialRecord]:
    """A record (status `interrupted`, no figures) for each trial whose search stopped while
    it ran. A retried one stays, pointing at its retry: the study holds it (Optuna's tools
    show it FAIL), and the table says why its number has no measurement. A trial another live
    search is running is RUNNING, not failed: not among them."""
    retries = {
        t.user_attrs[RETRY_OF_ATTR]: t.number
        for t in trials
        if RETRY_OF_ATTR in t.user_attrs and NOT_RUN_ATTR not in t.user_attrs
    }
    return [interrupted_record(t, retries.get(t.number)) for t in trials if is_interrupted(t)]


def interrupted_record(trial: FrozenTrial, retry: int | None) -> TrialRecord:
    signal = trial.user_attrs.get(INTERRUPTED_BY_ATTR)
    if (refused := trial.user_attrs.get(REFUSED_ATTR)) is not None:
        reason = f"refused before it ran: {refused}"
    elif signal:
        reason = f"the search was interrupted ({signal}) while it ran"
    else:
        reason = "its search process ended while it ran (killed, or lost its heartbeat)"
    if retry is not None:
        reason += f"; trial {retry} runs its settings again"
    return TrialRecord(
        number=trial.number,
        params=dict(trial.user_attrs.get(PARAMS_ATTR, {})),
        result=TrialResult(status=Status.INTERRUPTED, reason=reason),
        baseline=bool(trial.user_attrs.get(BASELINE_ATTR)),
        reference=bool(trial.user_attrs.get(REFERENCE_ATTR)),
    )


DIRECTIONS = (optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE)


OBJECTIVES = ("samples_per_s", "peak_memory_gib")
