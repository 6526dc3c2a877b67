"""The search's opening after the baseline: the expert's guess, then a batch ladder at it.

**The guess** is what the HF single-GPU guide and the PyTorch/NVIDIA tuning guides advise for
the device in hand, taken from the knob catalogue's priors (`Knob.prior`, per device kind,
each with its source): on a CUDA GPU with bf16, bf16 with TF32 matmuls, fused AdamW,
FlashAttention where installed (else SDPA), no checkpointing, no compile; on a CPU, bf16 where
it has it, eager attention, fused AdamW. It runs at the largest batch whose estimate, corrected
by the baseline's measured peak, fills at most `GUESS_FILL` of the memory limit a pick must
keep under (the budget less its headroom: a trial past it is never recommended), and whose
trial would cost at most `GUESS_COST` baseline trials were it to train no faster a sample than
the baseline. A knob without a prior keeps its HF default. Where no batch of that setting
fits, the next most advised setting is taken (checkpointing first).

**The ladder** then moves the guess's batch while it pays: up to at most twice the batch, and
again while the last step up gained `LADDER_GAIN`; down by half where up lost or did not fit,
and again while the last step down gained. It ends at the first step that gains less. A guess
that trained past the memory limit steps down to the largest batch that fits by its estimate
calibrated on that peak, not to half (on the H200 the guess at batch 240 measured 1.3% past
the limit); one out of memory halves, having no peak to calibrate on. Both are read from the
study's records alone, so that every worker of a study agrees on them.

A wrong prior costs one or two trials: after the ladder the effects model chooses
(`study/effects.py`), and the guess is one measured point among the others.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.common.knobs import KNOBS, SAMPLE_ORDER, left_out, value_of
from autotune.common.trial import Status
from autotune.plan.estimate import calibrated_gib
from autotune.store.records import TrialRecord
from autotune.study.checks import measured_peaks, settings_key
from autotune.study.cost import TrialCost, pace_at

if TYPE_CHECKING:
    from autotune.plan.plan import SearchPlan
    from autotune.study.sampling.points import Points

GUESS_FILL = 0.85
"""The share of the memory limit (the budget less its headroom) the guess's batch may fill by
estimate: room for the estimate's error (7-8% low at large batches on the H100, 9% at batch
240 in bf16 on the H200) and the allocator's fragmentation. Against the budget it filled past
the limit: the H200's guess, bert-large at batch 240, measured 127.0 GiB against a limit of
125.4, and the search recommended the baseline it was 9.2x."""
GUESS_COST = 3.0
"""The most the guess may cost, in baseline trials, were it to train no faster a sample than
the baseline (`TrialCost` fitted on the baseline; on a GPU its pace scaled by the precision's
datasheet peak, `cost.pace_at`). On a GPU that leaves the largest batch that fits (bert-large
at seq 512 on the H100 twin: batch 128 against a bound of about 2,000; on the A100, 128
against 880). On a CPU a trial's cost is its steps, and past batch 8-16 more samples a step
rarely train faster there (recorded on an AMD EPYC and an AMX Xeon:
`benchmarks/results/cpu-advice.md`); the bound keeps the guess to 16-32 samples a step (27 on
bert-mini at seq 256), where the largest batch that fits cost up to 6 baseline trials even
stopped early (there, bf16 SDPA at batch 32 was recorded at 5.8 s a step against 0.9 s at
16)."""
LADDER_GAIN = 0.05
"""A step of the ladder that gains less than this (in samples/s) is its last."""
LINES_LOOKED_AT = 500
"""Settings lines (all but the batch) the guess looks through for one that fits, at most."""
RELAX_LAST = ("precision", "attn_implementation", "torch_compile", "use_liger_kernel", "optim")
"""The guess's knobs in the order they are given up last: where the most advised setting does
not fit, the knobs after these (checkpointing last of all) change first."""
BATCH_KNOBS = ("batch_size", "grad_accum")

Runs = Callable[[int], bool]
"""Whether the search loop would run the setting of this index (no pre-trial check skips it)."""


def expert_guess(
    points: Points, plan: SearchPlan, records: list[TrialRecord], runs: Runs
) -> int | None:
    """The index of the expert's guess among the space's settings; None where no setting of
    the space runs. Calibrated on the baseline alone, so that it stays the same guess while
    the study grows."""
    free = _batch_knobs(plan)
    kind = plan.device
    order = [
        *RELAX_LAST,
        *(
            k
            for k in SAMPLE_ORDER
            if k not in RELAX_LAST and k not in free and k != "gradient_checkpointing"
        ),
        "gradient_checkpointing",
    ]

    ranked = _most_advised_first(points, order, kind)
    measured = measured_peaks([r for r in records if r.baseline])
    affordable = _affordable(plan, records)

    def preference(index: int) -> tuple[bool, int, int]:
        """The largest batch the cost bound allows (else the smallest), then the least
        accumulation."""
        params = points.params[index]
        allowed, batch = affordable(params), _batch(params)
        return (not allowed, -batch if allowed else batch, value_of(params, "grad_accum"))

    limit = plan.info.memory_limit_gib * GUESS_FILL
    lines = itertools.groupby(ranked, key=lambda i: _line_key(points.params[i], free))
    for _, line in itertools.islice(lines, LINES_LOOKED_AT):
        members = list(line)
        fitting = []
        for index in members:
            params = points.params[index]
            estimate = plan.estimate_gib(params)
            if estimate is None:  # the user's Trainer: no estimate; start at the HF batch
                fits = params.get("batch_size") == plan.baseline.get("batch_size")
            else:
                fits = calibrated_gib(params, estimate, measured) <= limit
            if fits:
                fitting.append(index)
        for index in sorted(fitting, key=preference):
            if runs(index):
                return index
    return None


def _most_advised_first(points: Points, order: list[str], kind: str) -> list[int]:
    """The settings' indices sorted by how advised each knob of `order` is in turn (`_rank`),
    ties in index order: ranked once per knob value, not once per setting (the default CUDA
    space has 62,208 settings)."""
    columns = []
    for name in order:
        if name not in points.names:  # the same for every setting: no say in the order
            continue
        levels = points.levels[:, points.names.index(name)]
        _, first = np.unique(levels, return_index=True)
        by_level = np.zeros(int(levels.max()) + 1, dtype=np.int64)
        for index in first:
            by_level[levels[index]] = _rank(name, points.params[index].get(name), kind)
        columns.append(by_level[levels])
    if not columns:
        return list(range(len(points.params)))
    # lexsort's last key sorts first, and it is stable.
    return [int(i) for i in np.lexsort(columns[::-1])]


def _affordable(plan: SearchPlan, records: list[TrialRecord]) -> Callable[[dict], bool]:
    """Whether a setting's trial would cost at most `GUESS_COST` baseline trials at the
    baseline's pace a sample, scaled by its precision's peak rate over the baseline's on a GPU
    (`cost.pace_at`); every setting where the baseline measured none."""
    baseline = [
        r
        for r in records
        if r.baseline and r.status is Status.OK and r.result.samples_per_s and r.result.wall_s
    ]
    if not baseline:
        return lambda params: True
    record = baseline[0]
    cost = TrialCost.fit(baseline, plan.trial_steps)

    def affordable(params: dict[str, Any]) -> bool:
        pace = pace_at(params, record, plan.compute_tflops)
        return cost.predict_s(params, pace) <= GUESS_COST * record.result.wall_s

    return affordable


def ladder_step(
    points: Points, guess: int, plan: SearchPlan, records: list[TrialRecord], runs: Runs
) -> int | None:
    """The next rung of the batch ladder at the guess, or None when the ladder is over (or
    the guess has not ended yet)."""
    free = _batch_knobs(plan)
    same = [j for j, name in enumerate(points.names) if name not in free]
    on_line = (points.levels[:, same] == points.levels[guess, same]).all(axis=1)
    line = {_batch(points.params[i]): int(i) for i in np.flatnonzero(on_line)}
    limit = plan.info.memory_limit_gib  # a rung past it is never recommended
    measured: dict[int, float | None] = {}
    """batch -> samples/s; None where it failed (out of memory, timeout, ...) or trained
    past the limit."""
    over_limit: set[int] = set()
    """The batches that trained, but past the limit: their peak is known."""
    for record in records:
        if record.status is Status.SKIPPED:
            continue
        index = points.find(record.params)
        if index is None or line.get(_batch(points.params[index])) != index:
            continue
        batch = _batch(points.params[index])
        ok = record.result.feasible(limit) or record.status is Status.STOPPED  # a slower rung
        measured[batch] = record.result.samples_per_s if ok else None
        if not ok and record.status is Status.OK and record.result.peak_memory_gib:
            over_limit.add(batch)
    if _batch(points.params[guess]) not in measured:
        return None
    batches = sorted(line)
    speeds = {b: s for b, s in measured.items() if s}
    peaks = measured_peaks(records)

    def first_running(candidates: list[int]) -> int | None:
        """The first batch not measured that runs and fits the memory limit by its estimate
        calibrated on the study's peaks."""
        for b in candidates:
            params = points.params[line[b]]
            estimate = plan.estimate_gib(params)
            fits = estimate is None or calibrated_gib(params, estimate, peaks) <= limit
            if b not in measured and fits and runs(line[b]):
                return line[b]
        return None

    if not speeds:
        smallest = min(measured)
        if smallest in over_limit:  # trained past the limit: the largest below fitting by its peak
            return first_running([b for b in reversed(batches) if b < smallest])
        # Out of memory (or another failure): no peak to calibrate on; halve below it.
        return first_running([b for b in reversed(batches) if b <= smallest / 2])
    best = max(speeds, key=speeds.__getitem__)
    above = [b for b in measured if b > best]
    below = [b for b in measured if b < best]

    def gained(neighbour: int | None) -> bool:
        """The step that reached the best gained enough over the neighbour it came from."""
        return neighbour is None or speeds[best] >= (1 + LADDER_GAIN) * (
            speeds.get(neighbour) or 0.0
        )

    if not above and gained(max(below, default=None)):
        up = first_running([b for b in reversed(batches) if best < b <= 2 * best])
        if up is not None:
            return up
    # Down where up ran slower, or where no larger batch fits: not where a larger batch ran
    # out of memory (which says nothing of a smaller one's speed).
    lost = [b for b in above if measured[b]]
    if not below and (not above or lost) and gained(min(lost, default=None)):
        return first_running([b for b in reversed(batches) if b <= best / 2])
    return None


def prior_rank(params: dict[str, Any], kind: str) -> int:
    """How far a setting is from the guides' advice: the sum over the knobs with a prior of
    how many more advised values each has (0: the advised setting, at any batch)."""
    return sum(_rank(name, params.get(name), kind) for name in params if KNOBS[name].prior)


def _rank(name: str, value: Any, kind: str) -> int:
    """0 for the most advised value of a knob (or, without a prior, its HF default or no
    value), higher for less advised ones."""
    prior = KNOBS[name].prior.get(kind)
    if prior:
        return prior.index(value) if value in prior else len(prior)
    return 0 if value is None or value == left_out(name) else 1


def _batch_knobs(plan: SearchPlan) -> tuple[str, ...]:
    """The knobs the ladder moves: the batch, and the accumulation when it follows the batch
    (a fixed effective batch)."""
    return BATCH_KNOBS if plan.rules.effective_batch_size else ("batch_size",)


def _line_key(params: dict[str, Any], free: tuple[str, ...]) -> str:
    return settings_key({k: v for k, v in params.items() if k not in free})


def _batch(params: dict[str, Any]) -> int:
    return int(value_of(params, "batch_size"))
