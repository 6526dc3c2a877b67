"""The storage format: what a study keeps in Optuna's storage, and the one way to read it back.

The study loop stores each trial's complete knob values and its `TrialResult` as user attrs, so
every output (tables, recommendation, report) can be rebuilt from the storage alone. Every
user-attr key is named here; `read_snapshot` reads a study once and decodes it for the loop,
the outputs, the report and the exports alike.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StudyError
from autotune.knobs import MathChange, math_changes
from autotune.pareto import Picks, is_noisy, non_dominated, pick
from autotune.trial import MEMORY_STATUSES, Status, TrialResult
from autotune.units import GIB

PARAMS_ATTR = "params"
"""Trial: every knob's value (Optuna's own params hold only what the sampler chose)."""
RESULT_ATTR = "result"
"""Trial: the `TrialResult`; a finished trial without one was interrupted or a repeat."""
BASELINE_ATTR = "baseline"
"""Trial: true for the HF-defaults trial."""
RETRY_OF_ATTR = "retry_of"
"""Trial: the interrupted trial whose settings it runs again."""
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
CONSTRAINT = "peak_over_budget_gib"
"""Trial constraint, feasible when <= 0: peak memory less the budget."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """What a study was run for, stored with it so outputs can be rebuilt from storage alone."""

    study: str
    model: str
    model_config: dict[str, Any]
    task: str
    seq_len: int
    device: str
    device_name: str
    space: str
    space_notes: list[str]
    effective_batch_size: int | None
    """batch_size x grad_accum when fixed by `effective_batch_size=`; None when it varies."""
    memory_budget_bytes: int
    """Resolved once when the study was made; every trial is judged against it."""
    headroom: float
    noise_cv: float
    report_to: str = "none"
    """Trackers the exported script logs to (`TrainingArguments.report_to`); trials never log."""
    data: dict[str, Any] | None = None
    """The user's data (`user_data.DataSpec` fields and its `fingerprint`); None: synthetic."""
    trainer: dict[str, str | None] | None = None
    """The user's Trainer: `factory` (`module:function`, or a file made absolute), the
    `search_dir` a module was looked up in, and the `sha256` of the file it runs (None in
    studies made before it was stored); None: autotune builds the Trainer."""

    @property
    def data_fingerprint(self) -> str | None:
        """What decides the tokens trained on; another dataset is another study."""
        return self.data["fingerprint"] if self.data else None

    @property
    def trainer_factory(self) -> str | None:
        return self.trainer["factory"] if self.trainer else None

    @property
    def batch_mode(self) -> str:
        return batch_mode(self.effective_batch_size)

    @property
    def memory_budget_gib(self) -> float:
        return self.memory_budget_bytes / GIB

    @property
    def memory_limit_gib(self) -> float:
        """Peak memory a recommended config may reach: the budget less the headroom."""
        return self.memory_budget_gib * (1 - self.headroom)

    @classmethod
    def of(cls, study: optuna.Study) -> RunInfo:
        if RUN_ATTR not in study.user_attrs:
            raise StudyError(f"study {study.study_name} was not made by autotune search")
        stored = dict(study.user_attrs[RUN_ATTR])
        if "batch_mode" in stored:  # studies made before the setting itself was stored
            fixed = re.match(r"effective batch (\d+)", stored.pop("batch_mode"))
            stored["effective_batch_size"] = int(fixed.group(1)) if fixed else None
        return cls(**stored)


def batch_mode(effective_batch_size: int | None) -> str:
    """How a study treats the effective batch, in words."""
    if effective_batch_size:
        return f"effective batch {effective_batch_size} (grad_accum derived)"
    return "grad_accum as the space says (effective batch varies)"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    number: int
    params: dict[str, Any]
    result: TrialResult
    baseline: bool = False
    """The HF-defaults trial every speedup is measured against."""

    @property
    def status(self) -> Status:
        return self.result.status


def store_run_info(study: optuna.Study, info: RunInfo) -> None:
    study.set_user_attr(RUN_ATTR, asdict(info))


def is_recorded(trial: FrozenTrial) -> bool:
    """Finished with a result: a measurement, a failure or a skip."""
    return trial.state.is_finished() and RESULT_ATTR in trial.user_attrs


def counts_toward_n_trials(trial: FrozenTrial) -> bool:
    """Recorded and run: a skip (not run, nothing spent) does not use up `n_trials`."""
    return is_recorded(trial) and trial.user_attrs[RESULT_ATTR]["status"] != Status.SKIPPED.value


def trials_run(study: optuna.Study) -> int:
    """The trials that count toward `n_trials` so far."""
    return sum(counts_toward_n_trials(t) for t in study.get_trials(deepcopy=False))


def load_records(study: optuna.Study) -> list[TrialRecord]:
    """Recorded trials, oldest first."""
    return [record_of(t) for t in study.get_trials(deepcopy=False) if is_recorded(t)]


def record_of(trial: FrozenTrial) -> TrialRecord:
    return TrialRecord(
        number=trial.number,
        params=dict(trial.user_attrs[PARAMS_ATTR]),
        result=TrialResult.from_dict(trial.user_attrs[RESULT_ATTR]),
        baseline=bool(trial.user_attrs.get(BASELINE_ATTR)),
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
    trial.set_user_attr("noisy", is_noisy(result, noise_cv))
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
    if result.status is Status.OK:
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


@dataclass(frozen=True, kw_only=True, slots=True)
class StudySnapshot:
    """A study as read once: what every output, the report and the exports are built from."""

    info: RunInfo
    records: list[TrialRecord]
    front: list[TrialRecord]
    """Feasible successful trials no other beats on both samples/s and memory, fastest first."""
    picks: Picks
    search_s: float | None
    """From the first trial's start to the last one's end."""

    def record(self, number: int) -> TrialRecord | None:
        return next((r for r in self.records if r.number == number), None)

    def is_noisy(self, record: TrialRecord) -> bool:
        return is_noisy(record.result, self.info.noise_cv)

    def math_changes(self, record: TrialRecord) -> list[MathChange]:
        """What in its settings changes the training itself compared with the baseline trial
        (another optimizer, effective batch or precision); none when no baseline ran."""
        baseline = self.picks.baseline
        return [] if baseline is None else math_changes(record.params, baseline.params)


def read_snapshot(study: optuna.Study) -> StudySnapshot:
    """Read the study once and decode it."""
    info = RunInfo.of(study)
    trials = study.get_trials(deepcopy=False)
    records = [record_of(t) for t in trials if is_recorded(t)]
    # The front as Optuna's best_trials defines it (COMPLETE, feasible, non-dominated), from
    # the records already read: one read of the storage, and repeats are not records.
    feasible = [
        r
        for r in records
        if r.status is Status.OK and r.result.peak_memory_gib <= info.memory_budget_gib
    ]
    front = sorted(non_dominated(feasible), key=lambda r: r.result.samples_per_s, reverse=True)
    baseline = next((r for r in records if r.baseline), None)
    done = [t for t in trials if t.datetime_complete and t.datetime_start]
    search_s = None
    if done:
        started = min(t.datetime_start for t in done)
        search_s = (max(t.datetime_complete for t in done) - started).total_seconds()
    return StudySnapshot(
        info=info,
        records=records,
        front=front,
        picks=pick(front, info.memory_limit_gib, baseline, info.noise_cv),
        search_s=search_s,
    )
