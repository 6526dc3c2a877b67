"""`sampler=effects` (and `auto`): a model of each knob's effect on throughput, fitted to the
trials so far and asked for its most promising untried setting.

Throughput effects of training settings are close to multiplicative: precision, optimizer,
attention kernel, checkpointing and batch size each scale samples/s by a factor that depends
little on the others. So log samples/s is modelled as one effect per knob value, plus smaller
effects of pairs of values, plus a trend along each numeric knob (batch size, accumulation
steps), plus a part that only settings close to each other share: a Gaussian process whose
kernel counts the knob values two settings share. Of a few such kernels (`KERNELS`), the one
that explains the trials best (marginal likelihood) is used, so a landscape whose knobs
interact gets a model whose knobs interact. A measurement the other trials contradict is
taken for a disturbed run and loses its weight. The search:

1. **Designed start** (`START_TRIALS`): after the baseline, each trial takes the untried
   setting with the most knob values not yet seen in any trial (ties at random), so that
   every value of every knob is measured early.
2. **Model**: each trial then takes the untried setting with the highest optimistic estimate
   (mean plus `UCB_BETA` standard deviations) times its chance to fit the memory budget (the
   same model of log peak memory over the setting's estimate, out-of-memory trials counted
   past the budget).
3. **Local** (`LOCAL_TRIALS`): the last trials change one knob of the fastest trial at a
   time, in the model's order: where the model is wrong about one knob, this corrects it.

Every setting is a point of the space enumerated once (`SearchSpace.points`); candidates the
search loop would skip (the pre-trial checks: over the memory budget by estimate, at least as
hungry as an out-of-memory trial, settings that cannot train together) are passed over here,
so that proposals run. Settings another worker is running count as tried.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.common.trial import OUT_OF_MEMORY, Status
from autotune.plan.plan import SearchPlan
from autotune.store.records import (
    PARAMS_ATTR,
    SearchConfidence,
    TrialRecord,
    is_recorded,
    record_of,
)
from autotune.study import checks

START_TRIALS = 6
"""Trials (the baseline included) before the model chooses: the designed start."""
UCB_BETA = 2.0
"""How optimistic the model's choice is: its mean plus this many standard deviations."""
LOCAL_TRIALS = 6
"""The last trials of `n_trials`, which change one knob of the fastest trial at a time."""
OUTLIER_Z = 2.25
"""A measurement this many standard deviations from what the other trials predict for it
(leave-one-out) is taken for a disturbed run..."""
OUTLIER_NOISE = 1.0
"""...and counted with this variance in (log samples/s)^2: almost no weight."""
OOM_OVER = 1.25
"""An out-of-memory trial's peak, as a multiple of the budget, for the memory model: at least
the budget (how far past is unknown)."""
POINTS_LIMIT = 200_000
"""Settings enumerated at most; a larger space is searched over a random sample of them."""
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
        return (self.constant + self.value * shared + self.pair * shared * (shared - 1) / 2
                + self.trend * trend + self.whole * np.exp(-differ / self.length))  # fmt: skip


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


class EffectsSampler(optuna.samplers.BaseSampler):
    def __init__(self, plan: SearchPlan, *, seed: int) -> None:
        self.plan = plan
        self.rng = np.random.default_rng(seed)
        self.pre_trial = checks.for_plan(plan)
        self.chosen: dict[int, dict[str, Any]] = {}
        """trial id -> the Optuna parameters of the setting chosen for it."""
        self.estimates: dict[int, float | None] = {}

    @functools.cached_property
    def points(self) -> Points:
        """Enumerated at the first proposal, not when the study opens (`autotune confirm`
        and `report` open it too, and never ask)."""
        return Points.of(self.plan, self.rng)

    # The BaseSampler interface: the whole setting is chosen before the trial asks for its
    # parameters, and each parameter is answered from it.

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.system_attrs.get("fixed_params"):
            return  # queued: the baseline, or an interrupted trial run again
        index = self.choose(study.get_trials(deepcopy=False))
        if index is not None:
            self.chosen[trial._trial_id] = self.points.optuna[index]

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        chosen = self.chosen.get(trial._trial_id, {})
        if param_name in chosen:
            return chosen[param_name]
        choices = getattr(param_distribution, "choices", None)
        if choices is None:  # an int range: the space expands them, so this is a fallback
            low, high = param_distribution.low, param_distribution.high  # type: ignore[attr-defined]
            return int(self.rng.integers(low, high + 1))
        return choices[int(self.rng.integers(len(choices)))]

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: list[float] | None,
    ) -> None:
        self.chosen.pop(trial._trial_id, None)

    # The search.

    def choose(self, trials: list[FrozenTrial]) -> int | None:
        """The index of the setting to run next, or None when every setting was tried."""
        tried = {self.points.find(t.user_attrs[PARAMS_ATTR]) for t in trials
                 if PARAMS_ATTR in t.user_attrs}  # fmt: skip
        untried = [i for i in range(len(self.points.keys)) if i not in tried]
        if not untried:
            return None
        records = [record_of(t) for t in trials if is_recorded(t)]
        speeds = [r for r in records if r.status is Status.OK and r.result.samples_per_s
                  and self.points.find(r.params) is not None]  # fmt: skip
        order = (
            self._designed(untried, records)
            if len(records) < START_TRIALS or len(speeds) < 2
            else self._by_model(untried, speeds, records)
        )
        for index in order:
            if self._runs(index, records):
                return index
        return None

    def _designed(self, untried: list[int], records: list[TrialRecord]) -> list[int]:
        """Untried settings, most unseen knob values first, ties in random order."""
        seen = np.zeros(self.points.levels.shape, dtype=bool)
        for record in records:
            index = self.points.find(record.params)
            if index is not None:
                seen |= self.points.levels == self.points.levels[index]
        unseen = (~seen[untried]).sum(axis=1) + self.rng.random(len(untried))
        return [untried[i] for i in np.argsort(-unseen)]

    def _by_model(
        self, untried: list[int], speeds: list[TrialRecord], records: list[TrialRecord]
    ) -> list[int]:
        """Untried settings, most promising first: the model's optimistic log samples/s (mean
        plus UCB_BETA standard deviations), times the chance the setting fits the memory
        budget. In the last LOCAL_TRIALS trials, only settings one knob away from the
        fastest feasible trial (while any is left)."""
        budget = self.plan.info.memory_budget_gib
        observed = [self._index(r) for r in speeds]
        y = np.log([r.result.samples_per_s for r in speeds])
        feasible = [r.result.feasible(budget) for r in speeds]
        done = sum(r.status is not Status.SKIPPED for r in records)
        if self.plan.config.n_trials - done <= LOCAL_TRIALS and any(feasible):
            incumbent = observed[int(np.argmax(np.where(feasible, y, -np.inf)))]
            differ = (self.points.levels[untried] != self.points.levels[incumbent]).sum(axis=1)
            near = [index for index, d in zip(untried, differ, strict=True) if d <= 1]
            untried = near or untried
        mean, sd = predict(self.points, observed, y, untried)
        promise = np.exp(mean + UCB_BETA * sd) * self._fits(untried, records)
        return [untried[i] for i in np.argsort(-promise, kind="stable")]

    def _fits(self, untried: list[int], records: list[TrialRecord]) -> np.ndarray:
        """The chance that each setting's peak stays within the budget: the same model, of log
        peak memory over the setting's estimate, fitted to the measured peaks and to the
        out-of-memory trials (counted at OOM_OVER x the budget)."""
        budget = self.plan.info.memory_budget_gib
        observed, y = [], []
        for record in records:
            if self.points.find(record.params) is None:
                continue
            result = record.result
            if result.status is Status.OK and result.peak_memory_gib:
                peak = result.peak_memory_gib
            elif result.status in OUT_OF_MEMORY:
                peak = max(result.peak_memory_gib or 0.0, budget) * OOM_OVER
            else:
                continue
            index = self._index(record)
            observed.append(index)
            y.append(math.log(peak / self._estimate(index)))
        if not observed:
            return np.ones(len(untried))
        mean, sd = predict(self.points, observed, np.array(y), untried)
        limit = np.log([budget / self._estimate(i) for i in untried])
        return normal_cdf((limit - mean) / sd)

    def _index(self, record: TrialRecord) -> int:
        index = self.points.find(record.params)
        assert index is not None
        return index

    def _estimate(self, index: int) -> float:
        """The setting's memory estimate in GiB; 1 where none is made (the user's Trainer)."""
        if index not in self.estimates:
            self.estimates[index] = self.plan.estimate_gib(self.points.params[index])
        return self.estimates[index] or 1.0

    def _runs(self, index: int, records: list[TrialRecord]) -> bool:
        """Whether the search loop would run this setting (no pre-trial check skips it)."""
        self._estimate(index)
        params, estimate = self.points.params[index], self.estimates[index]
        return checks.first_skip(params, records, self.pre_trial, estimate) is None


def confidence(
    plan: SearchPlan, records: list[TrialRecord], *, gain: float = 0.02, chance: float = 0.1
) -> SearchConfidence | None:
    """How many untried settings that would run could beat the fastest feasible trial by
    `gain`, each with a chance of at least `chance` under the model fitted to every trial;
    None before two trials in the space were measured within the budget."""
    points = Points.of(plan, np.random.default_rng(0))
    budget = plan.info.memory_budget_gib
    measured = [
        r for r in records
        if r.status is Status.OK and r.result.samples_per_s
        and points.find(r.params) is not None
    ]  # fmt: skip
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
        i for i in candidates
        if checks.first_skip(points.params[i], records, pre_trial,
                             plan.estimate_gib(points.params[i])) is None
    ]  # fmt: skip
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
        trials=len(measured), best_samples_per_s=best, untried=len(untried),
        could_beat=could_beat, upper_samples_per_s=upper, gain=gain, chance=chance,
        sampled=sampled, records_seen=len(records),
    )  # fmt: skip


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


def normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(z, dtype=float) / math.sqrt(2)))


@dataclass(frozen=True)
class Points:
    """Every setting of the space (or a random sample of a huge one), encoded for the model."""

    params: list[dict[str, Any]]
    optuna: list[dict[str, Any]]
    """Each setting's Optuna parameters (what `SearchSpace.sample` asks for)."""
    keys: list[str]
    index: dict[str, int | None]
    """Settings key -> index; also of settings found by `find`."""
    levels: np.ndarray
    """settings x knobs: the index of each knob's value (an inactive knob has its own)."""
    trends: np.ndarray
    """settings x numeric knobs: standardised log2(1 + value)."""

    @classmethod
    def of(cls, plan: SearchPlan, rng: np.random.Generator) -> Points:
        found = plan.space.points(plan.rules, limit=POINTS_LIMIT, rng=rng)
        params = [p for p, _ in found]
        names = sorted({k for p in params for k in p})
        values = [sorted({repr(p.get(k)) for p in params}) for k in names]
        levels = np.array(
            [[values[j].index(repr(p.get(k))) for j, k in enumerate(names)] for p in params],
            dtype=np.int32,
        ).reshape(len(params), len(names))
        numeric = [
            k for k in names
            if all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool)
                   and p[k] >= 0 for p in params)
            and len({p[k] for p in params}) > 1
        ]  # fmt: skip
        trends = np.array([[math.log2(1 + p[k]) for k in numeric] for p in params]).reshape(
            len(params), len(numeric)
        )
        if len(numeric):
            trends = (trends - trends.mean(axis=0)) / trends.std(axis=0)
        keys = [checks.settings_key(p) for p in params]
        return cls(
            params=params,
            optuna=[o for _, o in found],
            keys=keys,
            index={key: i for i, key in enumerate(keys)},
            levels=levels,
            trends=trends,
        )

    def find(self, params: dict[str, Any]) -> int | None:
        """The index of these settings; settings that leave out knobs the space fixes (a
        baseline planned before them) match the setting that agrees on the rest."""
        key = checks.settings_key(params)
        if key not in self.index:
            found = [i for i, p in enumerate(self.params) if params.items() <= p.items()]
            self.index[key] = found[0] if len(found) == 1 else None
        return self.index[key]

    def kernel(self, a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(knob values shared, product of the numeric knobs' trends) between `a` and `b`."""
        shared = (self.levels[a][:, None, :] == self.levels[b][None, :, :]).sum(axis=2)
        return shared, self.trends[a] @ self.trends[b].T, self.levels.shape[1] - shared

    def kernel_diagonal(self, a: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        knobs = self.levels.shape[1]
        return np.full(len(a), knobs), (self.trends[a] ** 2).sum(axis=1), np.zeros(len(a))
