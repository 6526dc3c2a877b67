"""Pre-trial checks: what the study loop asks before it runs a proposed configuration.

Each check looks at the proposal (its settings and their memory estimate, computed once by the
loop) and the trials recorded so far, and returns None (run it) or a `Skip` that says why not.
Adding a rule (an estimate over budget, a config another worker is running) is one function
here and one entry in `PRE_TRIAL_CHECKS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.common.knobs import KNOBS, value_of
from autotune.common.trial import OUT_OF_MEMORY, Status
from autotune.common.trial_settings import at_least_as_hungry, conflict
from autotune.plan.estimate import Measured, calibrated_gib
from autotune.store.records import TrialRecord
from autotune.study.cost import Rate, TrialCost, pace_at
from autotune.study.launch import time_limit_s

if TYPE_CHECKING:
    from autotune.plan.plan import SearchPlan


@dataclass(frozen=True, kw_only=True, slots=True)
class Skip:
    reason: str
    repeat_of: TrialRecord | None = None
    """Set when the same settings ran before: the sampler is told that trial's outcome and
    the proposal does not count as a trial. Otherwise the skip is recorded as `skipped`."""


Check = Callable[[dict[str, Any], list[TrialRecord], float | None], Skip | None]
"""(settings, the study's records, the settings' raw memory estimate in GiB or None)."""


def settings_key(params: dict[str, Any]) -> str:
    """Equal for settings that train alike, whatever the order of the keys: each knob they
    leave out counts at what training then does (`knobs.value_of`), so the baseline, which
    sets no `dataloader_num_workers`, is the same as a proposal of its settings with
    `dataloader_num_workers=0`. The one comparison of settings: already measured, running
    elsewhere, the sampler's points, the guess's lines."""
    filled = dict(params)
    for name in KNOBS:
        if name not in filled and (value := value_of(params, name)) is not None:
            filled[name] = value
    return json.dumps(filled, sort_keys=True)


def already_measured(
    params: dict[str, Any], records: list[TrialRecord], estimate_gib: float | None = None
) -> Skip | None:
    key = settings_key(params)
    # A trial whose node left under it measured nothing of its settings: they run again.
    earlier = next(
        (r for r in records if settings_key(r.params) == key and not r.result.rerun), None
    )
    if earlier is None:
        return None
    return Skip(reason=f"the same settings as trial {earlier.number}", repeat_of=earlier)


def as_hungry_as_an_oom(
    params: dict[str, Any], records: list[TrialRecord], estimate_gib: float | None = None
) -> Skip | None:
    for record in records:
        if record.status in OUT_OF_MEMORY and at_least_as_hungry(params, record.params):
            return Skip(
                reason=f"at least as memory-hungry as trial {record.number}, which ran out of "
                "memory"
            )
    return None


def over_budget_by_estimate(
    limit_gib: float,
    limit_source: str = "memory_budget and estimate_margin allow",
) -> Check:
    """A check that skips settings whose estimate, calibrated on the study's ok trials
    (`estimate.calibrated_gib`), is above `limit_gib` (the budget plus the margin, or what
    `limit_source` says)."""

    def check(
        params: dict[str, Any], records: list[TrialRecord], estimate_gib: float | None
    ) -> Skip | None:
        if estimate_gib is None:
            return None
        measured = measured_peaks(records)
        predicted = calibrated_gib(params, estimate_gib, measured)
        if predicted <= limit_gib:
            return None
        basis = f"calibrated on {len(measured)} trial(s)" if measured else "not yet calibrated"
        return Skip(
            reason=f"estimated at {predicted:.2f} GiB ({basis}), over the "
            f"{limit_gib:.2f} GiB {limit_source}"
        )

    return check


def over_time_by_pace(
    limit_s: Callable[[dict[str, Any]], float],
    steps: int,
    rate: Rate,
) -> Check:
    """A check that skips settings sure to pass their trial's time limit: their warm-up and
    timed steps at the fastest pace any trial measured, scaled by the precision's peak rate
    over that trial's (`rate`: TFLOP/s by precision; 1:1 where unknown), plus the start-up
    (and compile) the finished trials took (`study/cost.py`)."""

    def check(
        params: dict[str, Any], records: list[TrialRecord], estimate_gib: float | None
    ) -> Skip | None:
        measured = [r for r in records if r.status is Status.OK and r.result.samples_per_s]
        if not measured:
            return None

        def pace(record: TrialRecord) -> float:
            return pace_at(params, record, rate)

        fastest = max(measured, key=pace)
        limit = limit_s(params)
        predicted = TrialCost.fit(records, steps).predict_s(params, pace(fastest))
        if predicted <= limit:
            return None
        return Skip(
            reason=f"would take at least {predicted:.0f} s, over its {limit:.0f} s "
            f"limit (trial_timeout): its {steps} steps at the fastest pace "
            f"measured ({pace(fastest):.2f} samples/s, from trial "
            f"{fastest.number}) and the trials' start-up"
        )

    return check


def measured_peaks(records: list[TrialRecord]) -> list[Measured]:
    """The peaks of the ok trials, and of those stopped early (the peak is reached in the
    first steps: the optimizer's states, the activations of a step), beside their estimates:
    what `estimate.calibrated_gib` corrects an estimate by."""
    return [
        Measured(
            params=r.params, estimate_gib=r.result.estimate_gib, peak_gib=r.result.peak_memory_gib
        )
        for r in records
        if r.status in (Status.OK, Status.STOPPED)
        and r.result.estimate_gib
        and r.result.peak_memory_gib
    ]


def cannot_run_together(
    params: dict[str, Any], records: list[TrialRecord], estimate_gib: float | None = None
) -> Skip | None:
    """Settings the worker would refuse (`knobs.conflict`)."""
    reason = conflict(params)
    return None if reason is None else Skip(reason=reason)


PRE_TRIAL_CHECKS: tuple[Check, ...] = (already_measured, cannot_run_together, as_hungry_as_an_oom)


def for_plan(plan: SearchPlan) -> tuple[Check, ...]:
    """The checks a search of this plan runs before each trial."""
    config = plan.config
    by_time = over_time_by_pace(
        lambda params: time_limit_s(config, params),
        plan.trial_steps,
        plan.compute_tflops,
    )
    if plan.estimate_limit_gib is None:
        return (*PRE_TRIAL_CHECKS, by_time)
    by_estimate = over_budget_by_estimate(plan.estimate_limit_gib, plan.estimate_limit_source)
    return (*PRE_TRIAL_CHECKS, by_estimate, by_time)


def first_skip(
    params: dict[str, Any],
    records: list[TrialRecord],
    checks: tuple[Check, ...] = PRE_TRIAL_CHECKS,
    estimate_gib: float | None = None,
) -> Skip | None:
    """The first check that says no, or None when the configuration should run."""
    for check in checks:
        skip = check(params, records, estimate_gib)
        if skip is not None:
            return skip
    return None
