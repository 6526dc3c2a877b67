"""The model of each knob's effect on throughput, that `sampler=effects` (and `auto`) asks
(`study/effects.py`), and the confidence a search reports at its end.

Throughput effects of training settings are close to multiplicative: precision, optimizer,
attention kernel, checkpointing and batch size each scale samples/s by a factor that depends
little on the others. So log samples/s is modelled as one effect per knob value, plus smaller
effects of pairs of values, plus a trend along each numeric knob (batch size, accumulation
steps), plus a part that only settings close to each other share: a Gaussian process whose
kernel counts the knob values two settings share. Of a few such kernels (`KERNELS`), the one
that explains the trials best (marginal likelihood) is used, so a landscape whose knobs
interact gets a model whose knobs interact. A measurement the other trials contradict is
taken for a disturbed run and loses its weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autotune.common.trial import Status
from autotune.plan.plan import SearchPlan
from autotune.store.outcomes import SearchConfidence
from autotune.store.records import TrialRecord
from autotune.study import checks
from autotune.study.sampling.points import POINTS_LIMIT, Points

OUTLIER_Z = 2.25
"""A measurement this many standard deviations from what the other trials predict for it
(leave-one-out) is taken for a disturbed run..."""
OUTLIER_NOISE = 1.0
"""...and counted with this variance in (log samples/s)^2: almost no weight."""
CONFIDENCE_SAMPLE = 5_000
"""Untried settings the confidence looks at, at most (a random sample of more)."""


@dataclass(frozen=True)
class Kernel:
    """Prior variances in (log samples/s)^2: a constant, each shared knob value, each shared
    pair of values, and the product of standardised log2 values of each numeric knob; the
    noise of one measurement."""

    value: float
    pair: float
    trend: float
    noise: float
    whole: float = 0.0
    length: float = 1.0
    constant: float = 1.0

    def combine(self, parts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        shared, trend, differ = parts
        return (
            self.constant
            + self.value * shared
            + self.pair * shared * (shared - 1) / 2
            + self.trend * trend
            + self.whole * np.exp(-differ / self.length)
        )


KERNELS = tuple(
    Kernel(
        value=value**2, pair=pair**2, trend=trend**2, noise=noise**2, whole=whole**2, length=length
    )
    for value in (0.1, 0.3)
    for pair in (0.0, 0.05, 0.15)
    for trend in (0.0, 0.3)
    for noise in (0.03, 0.1)
    for whole, length in ((0.0, 1.0), (0.3, 1.0), (0.3, 2.0))
)
"""The kernels the model chooses among, by how well each explains the trials so far."""


def confidence(
    plan: SearchPlan, records: list[TrialRecord], *, gain: float = 0.02, chance: float = 0.1
) -> SearchConfidence | None:
    """How many untried settings that would run could beat the fastest feasible trial by
    `gain`, each with a chance of at least `chance` under the model fitted to every trial;
    None before two trials in the space were measured within the budget."""
    points = Points.of(plan, np.random.default_rng(0))
    budget = plan.info.memory_budget_gib
    measured = [
        r
        for r in records
        if r.status is Status.OK and r.result.samples_per_s and points.find(r.params) is not None
    ]
    fastest = [r.result.samples_per_s for r in measured if r.result.feasible(budget)]
    if len(measured) < 2 or not fastest:
        return None
    tried = {points.find(r.params) for r in records}
    candidates = [i for i in range(len(points.keys)) if i not in tried]
    sampled = len(points.keys) >= POINTS_LIMIT or len(candidates) > CONFIDENCE_SAMPLE
    if len(candidates) > CONFIDENCE_SAMPLE:  # the checks take ~1 ms a setting
        rng = np.random.default_rng(0)
        candidates = sorted(int(i) for i in rng.choice(candidates, CONFIDENCE_SAMPLE, False))
    pre_trial = checks.for_plan(plan)
    untried = [
        i
        for i in candidates
        if checks.first_skip(
            points.params[i], records, pre_trial, plan.estimate_gib(points.params[i])
        )
        is None
    ]
    best = max(fastest)
    if not untried:
        could_beat, upper = 0, None
    else:
        observed = [points.find(r.params) for r in measured]
        y = np.log([r.result.samples_per_s for r in measured])
        mean, sd = predict(points, observed, y, untried)
        beats = 1 - normal_cdf((math.log(best * (1 + gain)) - mean) / sd)
        could_beat = int((beats >= chance).sum())
        upper = float(np.exp(mean + 1.645 * sd).max())
    return SearchConfidence(
        trials=len(measured),
        best_samples_per_s=best,
        untried=len(untried),
        could_beat=could_beat,
        upper_samples_per_s=upper,
        gain=gain,
        chance=chance,
        sampled=sampled,
        records_seen=len(records),
    )


def predict(
    points: Points, observed: list[int], y: np.ndarray, at: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The model's mean and standard deviation at settings `at`, given the measurements `y`
    of settings `observed` (a setting measured twice counts twice), under the kernel of
    `KERNELS` that explains the measurements best (the highest marginal likelihood)."""
    centre = float(y.mean())
    k_oo = points.kernel(observed, observed)
    k_ao = points.kernel(at, observed)
    best = None
    for kernel in KERNELS:
        chol = np.linalg.cholesky(kernel.combine(k_oo) + kernel.noise * np.eye(len(y)))
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y - centre))
        fit = -0.5 * float((y - centre) @ alpha) - float(np.log(np.diag(chol)).sum())
        if best is None or fit > best[0]:
            best = (fit, kernel, chol, alpha)
    _, kernel, chol, alpha = best
    # A measurement the others contradict (far outside what the model predicts for it from the
    # rest, leave-one-out) is most likely a disturbed run: its weight is taken away.
    inverse = np.linalg.solve(chol.T, np.linalg.solve(chol, np.eye(len(y))))
    surprise = np.abs(alpha) / np.sqrt(np.diag(inverse))
    outliers = surprise > OUTLIER_Z
    if outliers.any() and len(y) > 4:
        noise = np.where(outliers, OUTLIER_NOISE, kernel.noise)
        chol = np.linalg.cholesky(kernel.combine(k_oo) + np.diag(noise))
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y - centre))
    cross = kernel.combine(k_ao)
    v = np.linalg.solve(chol, cross.T)
    prior = kernel.combine(points.kernel_diagonal(at))
    variance = np.maximum(prior - (v * v).sum(axis=0), 1e-12)
    return centre + cross @ alpha, np.sqrt(variance)


def expected_gain(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """The expected improvement in samples/s over the best, as a share of it, for settings
    whose log samples/s is normal (`mean`, `sd`) and the best's log is `best`:
    E[max(exp(Y) - exp(best), 0)] / exp(best)."""
    m, s = mean - best, np.maximum(sd, 1e-9)
    return np.exp(m + s * s / 2) * normal_cdf((m + s * s) / s) - normal_cdf(m / s)


def normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(z, dtype=float) / math.sqrt(2)))
