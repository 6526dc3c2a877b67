"""One read of a study for its outputs: `read_snapshot` decodes the stored records once into a
`StudySnapshot` (run info, records, the front and the picks) that the terminal view, the study
folder's tables, the report, the exports and the confirmation share."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.common.errors import StudyError
from autotune.common.knobs import KNOBS, is_compiled, training_args
from autotune.common.trial import Status
from autotune.common.trial_settings import MathChange, math_changes
from autotune.outputs.pareto import Confirmed, Picks, non_dominated, pick
from autotune.plan import conditions
from autotune.plan.run_info import RunInfo
from autotune.store.outcomes import RunEnd, SearchConfidence, Verification, read_verifications
from autotune.store.records import (
    CONFIRMATION_ATTR,
    TrialRecord,
    interrupted_records,
    is_recorded,
    read_runs,
    record_of,
    run_info,
)
from autotune.store.storage import damaged, storage_url_of, where_stored


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
    ended: RunEnd | None = None
    """How the study's last search ended; None while one runs, or for older studies."""
    runs: tuple[dict[str, Any], ...] = ()
    """Each run's provenance (`conditions.run_record`), oldest first."""
    verifications: dict[int, Verification] = field(default_factory=dict)
    """Trials whose settings `autotune verify` trained for many steps, by number."""
    confidence: SearchConfidence | None = None
    """What the last search's model thinks is left to find; None when trials were recorded
    since (or none was worked out)."""

    @property
    def simulated_time(self) -> str | None:
        """For a simulated study (`executor=twin`): what it is, and the time its GPU would
        have spent, in words; None for a measured one."""
        if self.info.simulated is None:
            return None
        clock_s = sum(run.get("simulated_clock_s", 0.0) for run in self.runs)
        device_s = sum(run.get("simulated_device_s", 0.0) for run in self.runs)
        return (
            f"{self.info.simulated_note}; on the GPU the searching would take "
            f"{clock_s / 60:.1f} min ({device_s / 60:.1f} GPU-minutes), the confirmation "
            "included"
        )

    def other_versions(self, record: TrialRecord) -> str | None:
        """How the versions it was measured under differ from the study's; None: they do not.
        Such a trial is kept out of the front and the picks."""
        return conditions.other_versions(record.versions, self.info.versions)

    def record(self, number: int) -> TrialRecord | None:
        return next((r for r in self.records if r.number == number), None)

    def is_noisy(self, record: TrialRecord) -> bool:
        return record.result.noisy(self.info.noise_cv)

    def trained_note(self) -> str | None:
        """For a study of the user's own Trainer (`trainer=`): what its factory really trains,
        from the first successful trial, when it is not what `model=` and `seq_len=` say (they
        then only name the study); None otherwise."""
        if self.info.trainer is None:
            return None
        return trained_note(self.info, self.records)

    def scaling_efficiency(self, record: TrialRecord) -> float | None:
        """On several devices a trial: its samples/s over the devices' count times the best
        `single` trial's (one of those devices, its share of the cores): 1.0 is perfect
        scaling. None without such a trial, for a `single` trial or on one device."""
        devices = self.info.devices_per_trial or 1
        if devices == 1 or record.params.get("strategy") == "single":
            return None
        singles = [
            r.result.samples_per_s
            for r in self.records
            if r.params.get("strategy") == "single"
            and r.status is Status.OK
            and r.result.samples_per_s
            and not self.other_versions(r)
        ]
        if not singles or not record.result.samples_per_s:
            return None
        return record.result.samples_per_s / (devices * max(singles))

    def anytime(self, share: float = 0.9) -> Anytime | None:
        """The best feasible trial and when it was found, and when a trial first reached
        `share` of it; None before a feasible trial ended."""
        return anytime(self.records, self.info.memory_budget_gib, share)

    def compile_payoff(self, record: TrialRecord) -> str | None:
        """For a compiled trial: what compiling cost, and after how many training steps its
        faster steps repay it, against the trial of the same settings run eagerly or, where
        none ran (compiled activations take more memory: the search may compile at a smaller
        batch), the fastest feasible eager trial, sample for sample; None for an eager
        trial."""
        result = record.result
        if not is_compiled(record.params) or result.compile_s is None:
            return None
        eager = {
            k: v for k, v in record.params.items() if "torch_compile" not in KNOBS[k].requires
        } | {"torch_compile": "off"}
        twin = next((r for r in self.records if r.status is Status.OK and r.params == eager), None)
        spent = f"compiling took {result.compile_s:.0f} s"
        if twin is not None and twin.result.step_time_median_ms and result.step_time_median_ms:
            saved_ms = twin.result.step_time_median_ms - result.step_time_median_ms
            if saved_ms <= 0:
                return (
                    f"{spent}, and its steps are slower than trial {twin.number}'s eager ones "
                    f"({result.step_time_median_ms:.0f} vs "
                    f"{twin.result.step_time_median_ms:.0f} ms): it never pays off"
                )
            steps = result.compile_s / (saved_ms / 1e3)
            return (
                f"{spent}; it pays off after {steps:,.0f} training steps (each {saved_ms:.0f} "
                f"ms faster than trial {twin.number}'s eager steps)"
            )
        budget = self.info.memory_budget_gib
        eager_ok = [
            r
            for r in self.records
            if r.status is Status.OK
            and not is_compiled(r.params)
            and r.result.samples_per_s
            and r.result.feasible(budget)
        ]
        fastest = max(eager_ok, key=lambda r: r.result.samples_per_s, default=None)
        if fastest is None or not result.samples_per_s or not result.step_time_median_ms:
            return f"{spent} (no eager trial to compare)"
        ours, theirs = result.samples_per_s, fastest.result.samples_per_s
        if ours <= theirs:
            return (
                f"{spent}, and it trains slower than trial {fastest.number}, the fastest eager "
                f"one ({ours:.1f} vs {theirs:.1f} samples/s): it never pays off"
            )
        # Each of its steps trains what takes trial `fastest` step_ms x ours/theirs.
        saved_ms = result.step_time_median_ms * (ours / theirs - 1)
        steps = result.compile_s / (saved_ms / 1e3)
        return (
            f"{spent}; it pays off after {steps:,.0f} training steps (each trains its samples "
            f"{saved_ms:.0f} ms faster than trial {fastest.number}, the fastest eager one)"
        )

    def math_changes(self, record: TrialRecord) -> list[MathChange]:
        """What in its settings changes the training itself compared with the baseline trial
        (another optimizer, effective batch or precision); none when no baseline ran."""
        baseline = self.picks.baseline
        if baseline is None:
            return []
        return math_changes(record.params, baseline.params, self.info.devices_per_trial or 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Anytime:
    """A search judged on its clock: the best it found, and how soon. Times are trial time,
    the wall times of the trials that ran, added up in the order they were asked for (with
    several workers, more than the search's own time)."""

    best: TrialRecord
    best_s: float
    """The trial time by the end of the best trial."""
    near: TrialRecord
    """The first trial within `share` of the best."""
    near_s: float
    share: float

    def describe(self, speedup: str = "") -> str:
        """`best 462.24 samples/s (2.07x the baseline in one short trial) by trial 5, ...`;
        `speedup` is the one its picks tell (`Picks.speedup_note`)."""
        speed = self.best.result.samples_per_s
        times = f" ({speedup})" if speedup else ""
        return (
            f"best {speed:.2f} samples/s{times} by trial {self.best.number}, "
            f"{_minutes(self.best_s)} of trials into the search; {self.share:.0%} of it by "
            f"trial {self.near.number}, {_minutes(self.near_s)}"
        )


def anytime(records: list[TrialRecord], budget_gib: float, share: float = 0.9) -> Anytime | None:
    found: list[tuple[TrialRecord, float]] = []
    spent = 0.0
    for record in sorted(records, key=lambda r: r.number):
        if record.status in (Status.SKIPPED, Status.INTERRUPTED):
            continue
        spent += record.result.wall_s or 0.0
        if record.result.feasible(budget_gib) and record.result.samples_per_s:
            found.append((record, spent))
    if not found:
        return None
    best, best_s = max(found, key=lambda f: f[0].result.samples_per_s or 0.0)
    goal = share * (best.result.samples_per_s or 0.0)
    near, near_s = next(f for f in found if (f[0].result.samples_per_s or 0.0) >= goal)
    return Anytime(best=best, best_s=best_s, near=near, near_s=near_s, share=share)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def trained_note(info: RunInfo, records: list[TrialRecord]) -> str | None:
    """What a `trainer=` factory trained, when it differs from `model=`/`seq_len=`."""
    first = next((r for r in records if r.status is Status.OK and r.result.trained_seq_len), None)
    if first is None:
        return None
    model, seq_len = first.result.trained_model, first.result.trained_seq_len
    named_model = model in (info.model, info.model_config.get("model_type"))
    if named_model and seq_len == info.seq_len:
        return None
    estimated = (
        f"trials after trial {first.number} are estimated as that model"
        if first.result.trained_config and first.result.trained_task
        else "no memory estimate is made for a factory's model"
    )
    return (
        f"the factory trains {model} on batches of up to {seq_len} tokens, not model="
        f"{info.model} at seq_len={info.seq_len}: those name the study only, and {estimated}"
    )


def changes_training_of(baseline: TrialRecord | None) -> Callable[[TrialRecord], bool]:
    """Whether a trial's settings change the training compared with the baseline's."""
    return lambda record: (
        baseline is not None and bool(math_changes(record.params, baseline.params))
    )


def _as_trained(info: RunInfo, record: TrialRecord) -> TrialRecord:
    """The record with its `TrainingArguments` kwargs as its settings give them (the knobs' one
    mapping, `knobs.training_args`): what the exports write. A set the trial recorded (the
    worker's, the twin's) must be that; another is refused, naming the trial (changed outside
    autotune: what the exports would write is not what was measured). A trial measured under
    other versions, or a study that stores no fields to name them by, keeps what it recorded."""
    recorded = record.result.training_args
    if info.training_fields is None or conditions.other_versions(record.versions, info.versions):
        return record
    derived = training_args(record.params, device=info.device, fields=info.training_fields)
    derived = json.loads(json.dumps(derived))  # as a record stores it: lists, not tuples
    if not recorded:
        return dataclasses.replace(
            record, result=dataclasses.replace(record.result, training_args=derived)
        )
    if recorded != derived:
        differ = sorted(
            k for k in recorded.keys() | derived.keys() if recorded.get(k) != derived.get(k)
        )
        raise StudyError(
            f"trial {record.number}'s recorded TrainingArguments are not what its settings "
            f"give (they differ in {', '.join(map(repr, differ))}): the study was changed "
            "outside autotune, or recorded by another autotune of the same version; rerun "
            "the search into another out= or study="
        )
    return record


def read_snapshot(study: optuna.Study) -> StudySnapshot:
    """Read the study once and decode it."""
    info = run_info(study)
    try:
        trials = study.get_trials(deepcopy=False)
    except json.JSONDecodeError as exc:  # optuna's storage decodes each attribute itself
        raise StudyError(damaged(f"study={study.study_name}", exc, storage_url_of(study))) from exc
    try:
        records = [_as_trained(info, record_of(t)) for t in trials if is_recorded(t)]
    except StudyError as exc:  # which trial, and in which study
        raise StudyError(f"study={study.study_name} in {where_stored(study)}: {exc}") from None
    # Only trials measured under the study's versions are compared (`autotune.plan.conditions`).
    same = [r for r in records if conditions.other_versions(r.versions, info.versions) is None]
    # The front as Optuna's best_trials defines it (COMPLETE, feasible, non-dominated), from
    # the records already read: one read of the storage, and repeats are not records.
    feasible = [r for r in same if r.result.feasible(info.memory_budget_gib)]
    front = sorted(non_dominated(feasible), key=lambda r: r.result.samples_per_s, reverse=True)
    baseline = next((r for r in same if r.baseline), None)
    reference = next((r for r in same if r.reference), None)
    confirmed = None
    if (stored := study.user_attrs.get(CONFIRMATION_ATTR)) is not None:
        confirmed = Confirmed.from_json(stored)
        if confirmed.records_seen != len(records):
            confirmed = None  # trials were recorded since: it measured other picks
    confidence = SearchConfidence.of(study)
    if confidence is not None and confidence.records_seen != len(records):
        confidence = None
    done = [t for t in trials if t.datetime_complete and t.datetime_start]
    search_s = None
    if done:
        started = min(t.datetime_start for t in done)
        search_s = (max(t.datetime_complete for t in done) - started).total_seconds()
    return StudySnapshot(
        info=info,
        # A row per trial: the interrupted ones too, with their status (never in the front).
        records=sorted(records + interrupted_records(trials), key=lambda r: r.number),
        front=front,
        picks=pick(
            feasible,
            info.memory_limit_gib,
            baseline,
            info.noise_cv,
            changes_training=changes_training_of(baseline),
            min_gain=info.math_change_min_gain,
            confirmed=confirmed,
            reference=reference,
        ),
        search_s=search_s,
        ended=RunEnd.of(study),
        runs=read_runs(study),
        verifications=read_verifications(study),
        confidence=confidence,
    )
