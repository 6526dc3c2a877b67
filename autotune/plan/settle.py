"""A plan finished for the study it runs in: checked against a resumed study's stored
`RunInfo`, which keeps its memory budget (`settle`), and its batch sizes fitted to the settled
budget (`fit_batches_to_budget`).
"""

from __future__ import annotations

import dataclasses
import itertools

from autotune.common import adapter
from autotune.common.errors import StudyError
from autotune.common.units import format_bytes
from autotune.common.urls import safe_url
from autotune.plan import conditions
from autotune.plan.estimate import KNOBS_READ
from autotune.plan.plan import SearchPlan
from autotune.plan.run_info import RunInfo

# What makes a study what it is: a resumed study must have been made for the same.
# (seq_len, steps, cores or GPU model: `conditions.changed_conditions`, checked first.)
IDENTITY = ("model", "task", "device", "space", "effective_batch_size", "adapter",
            "data_fingerprint", "trainer_factory")  # fmt: skip


def settle(plan: SearchPlan, stored: RunInfo | None, *, joining: bool = False) -> SearchPlan:
    """The plan finished for its study, whose stored `RunInfo` is `stored` (None: a new
    study): the one place a plan is settled before the search runs.

    A resumed study must have been made for the same run, under the same measurement
    conditions (`conditions.changed_conditions`). The memory budget is part of a study:
    resolved once and stored, so that every trial's feasibility is judged against the same
    figure; a resumed study keeps its stored budget, and an explicit `memory_budget=` that
    differs is refused. With the budget settled, the batch sizes that cannot fit it go."""
    if stored is not None:  # an existing study: it must have been made for this run
        if stored.simulated != plan.info.simulated:  # measured and simulated never mix
            raise StudyError(_simulated_refusal(plan.study_name, stored, plan.info))
        # What the trials are measured under: a worker joining with other cores or another
        # GPU model is refused as a resume is.
        if changed := conditions.changed_conditions(stored, plan.info):
            raise StudyError(conditions.refusal(plan.study_name, changed))
        # A joining worker's own trainer= stands in for the study's (`join_config` checked it).
        identity = [k for k in IDENTITY if not (joining and k == "trainer_factory")]
        changed = [
            f"{k} {_shown(k, getattr(stored, k))} -> {_shown(k, getattr(plan.info, k))}"
            for k in identity
            if getattr(stored, k) != getattr(plan.info, k)
        ]
        if changed:
            # data_fingerprint covers the data files' bytes, the tokenizer, column and seq_len.
            raise StudyError(
                f"study={plan.study_name} in {safe_url(plan.storage_url)} was made for other "
                f"settings (the study's -> this run's): {', '.join(changed)}; pick another "
                "study= name or out= folder"
            )
        explicit = plan.config.memory_budget
        if explicit is not None and int(explicit) != stored.memory_budget_bytes:
            raise StudyError(
                f"memory_budget={format_bytes(int(explicit))}: study={plan.study_name} was "
                f"searched with a budget of {format_bytes(stored.memory_budget_bytes)}, and its "
                "trials were judged against it. Leave memory_budget out to resume with the "
                "stored one, or use another study= name for another budget"
            )
        budget = stored.memory_budget_bytes
        # The study's versions stay its own: trials run under others are marked (conditions).
        versions = stored.versions or plan.info.versions
        plan = dataclasses.replace(
            plan,
            info=dataclasses.replace(plan.info, memory_budget_bytes=budget, versions=versions),
        )
    return fit_batches_to_budget(plan)  # the budget is settled: drop what cannot fit


def _simulated_refusal(study: str, stored: RunInfo, now: RunInfo) -> str:
    if stored.simulated is None:
        return (
            f"study={study} holds measured trials, and this run is simulated by {now.simulated}: a "
            "simulated trial would stand among them as a measurement. Give the simulated "
            "search another study= name or out= folder"
        )
    if now.simulated is None:
        this, again = "measures trials", "executor=twin and its gpu="
    else:
        this, again = f"is simulated by {now.simulated}", "the same gpu= and gpu_count="
    return (
        f"study={study} is simulated by {stored.simulated}, and this run {this}: "
        f"the two never mix in one study. Resume it with {again}, or give this run another "
        "study= name or out= folder"
    )


def _shown(key: str, value: object) -> str:
    """An identity's value in a refusal: the adapter in words (`LoRA r=16 ...`)."""
    if key == "adapter":
        return adapter.describe(value)  # type: ignore[arg-type]
    return str(value)


def fit_batches_to_budget(plan: SearchPlan) -> SearchPlan:
    """The plan with the batch sizes removed whose estimate is over `estimate_limit_gib`
    whatever the other knobs (the most frugal choice of each), so the sampler never proposes
    them; the smallest batch always stays. Called once the study's budget is settled."""
    limit = plan.estimate_limit_gib
    knob = plan.space.knobs.get("batch_size")
    if limit is None or knob is None or len(knob.choices) < 2:
        return plan
    others = {
        name: plan.space.knobs[name].choices
        for name in KNOBS_READ
        if name != "batch_size" and name in plan.space.knobs
    }
    combos = [dict(zip(others, v, strict=True)) for v in itertools.product(*others.values())]

    def may_fit(batch_size: int) -> bool:
        estimates = [plan.estimate_gib({**combo, "batch_size": batch_size}) for combo in combos]
        return None in estimates or min(estimates) <= limit

    # A batch's estimate grows with it: the largest that may fit, by bisection (a space of
    # 250 batch sizes and 864 combinations of the other knobs is 8 rounds, not 250).
    choices = sorted(knob.choices)
    low, high = 0, len(choices) - 1  # choices[low] stays (the smallest always does)
    while low < high:
        middle = (low + high + 1) // 2
        if may_fit(choices[middle]):
            low = middle
        else:
            high = middle - 1
    kept = [c for c in knob.choices if c <= choices[low]]
    if len(kept) == len(knob.choices):
        return plan
    note = (
        f"batch_size above {kept[-1]} removed: estimated over the {limit:.2f} GiB "
        f"{plan.estimate_limit_source}, with the most frugal other knobs"
    )
    space = plan.space.with_choices("batch_size", tuple(kept))
    space = dataclasses.replace(space, notes=(*space.notes, note))
    info = dataclasses.replace(plan.info, space_notes=list(space.notes))
    return dataclasses.replace(plan, space=space, info=info)
