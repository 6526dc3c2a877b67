"""`sampler=effects` (and `auto`): the search's choice of each trial's setting, by the model
of each knob's effect on throughput (`study/model.py`) and what each trial costs.

1. **Baseline** (queued when the study opens), a point of the space like any other: knobs it
   leaves out count at what training then does (`Points.find`).
2. **The expert's guess, then the batch ladder** (`study/guess.py`): what the guides advise
   for the device, at the largest batch that fits, and its batch moved while that pays.
3. **Model**: each trial then takes the untried setting with the highest expected gain over
   the fastest feasible trial, times its chance to fit the memory limit a pick keeps under
   (the budget less its headroom: the same model of log peak memory over the setting's
   estimate, out-of-memory trials counted past the budget)
   and the guides' advice (a weight that fades as trials accumulate, after piBO), per second
   of its predicted wall time (`study/cost.py`) to a power that fades from 1 to 0 over the
   search (cost-cooling). It looks within a trust radius of the fastest trial: one knob away,
   one more for every `WIDEN_AFTER` trials that found nothing faster. Settings predicted to
   pass their trial's time limit even at an optimistic pace are passed over.
4. **Local and refinements** (`LOCAL_TRIALS`): the last trials change one knob of the fastest
   trial at a time, in the model's order; compiling and fp8 wait for them, and a compile mode
   other than the default for a compiled fastest trial.

While fewer than two settings of the space were measured (the baseline and the guess did not
both run), each trial takes the untried setting with the most knob values not yet seen,
within the trust radius of the fastest trial once one ran, compiled and fp8 ones last.

Every setting is a point of the space enumerated once (`study/points.py`); candidates the
search loop would skip (the pre-trial checks: over the memory budget by estimate, at least as
hungry as an out-of-memory trial, settings that cannot train together) are passed over here,
so that proposals run. Settings another worker is running count as tried.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.common.trial import OUT_OF_MEMORY, Status
from autotune.plan.estimate import calibrated_gib
from autotune.plan.plan import SearchPlan
from autotune.store.records import PARAMS_ATTR, TrialRecord, is_recorded, record_of
from autotune.study import checks
from autotune.study.cost import TrialCost
from autotune.study.launch import time_limit_s
from autotune.study.sampling.guess import expert_guess, ladder_step, prior_rank
from autotune.study.sampling.model import expected_gain, normal_cdf, predict
from autotune.study.sampling.neighbourhood import Neighbourhood
from autotune.study.sampling.points import Points

UCB_BETA = 2.0
"""How optimistic a pace the time limit is checked at: the model's mean plus this many
standard deviations (also the tie-break among equal gains)."""
LOCAL_TRIALS = 6
"""The last trials of `n_trials`, which change one knob of the fastest trial at a time."""
PRIOR_WEIGHT = 0.5
PRIOR_BETA = 6.0
"""The guides' advice in the model's choice, after piBO (Hvarfner et al. 2022): each step a
setting is from the advice (`guess.prior_rank`) weighs its promise by PRIOR_WEIGHT raised to
PRIOR_BETA / the settings measured, a weight that fades as measurements accumulate, so that
wrong advice costs a few trials, not the search."""
ENOUGH_SAMPLE = 5_000
"""Untried settings, beyond those the model chooses from now, that the search looks at for a
gain worth its trial before it stops by itself (`min_gain_per_minute`)."""
ENOUGH_CHECKS = 50
"""The most promising of them checked against the memory budget and the pre-trial checks."""
MEASURED = frozenset({Status.OK, Status.STOPPED})
"""Trials whose samples/s the model learns from as measured (a stopped one: over fewer steps)."""
OOM_OVER = 1.25
"""An out-of-memory trial's peak, as a multiple of the budget, for the memory model: at least
the budget (how far past is unknown)."""


class EffectsSampler(optuna.samplers.BaseSampler):
    def __init__(self, plan: SearchPlan, *, seed: int) -> None:
        self.plan = plan
        self.rng = np.random.default_rng(seed)
        self.pre_trial = checks.for_plan(plan)
        self.chosen: dict[int, dict[str, Any]] = {}
        """trial number -> the Optuna parameters of the setting chosen for it."""
        self.estimates: dict[int, float | None] = {}
        self.guesses: dict[tuple, int | None] = {}
        """The expert's guess, by the baseline records it was made from."""
        self.enough_now: str | None = None
        """Why no untried setting is worth its trial, as the last choice found."""
        self.said_enough: dict[int, str] = {}
        """trial number -> why the search should stop before it."""

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
            self.chosen[trial.number] = self.points.optuna[index]
        if self.enough_now is not None:
            self.said_enough[trial.number] = self.enough_now

    def enough(self, number: int) -> str | None:
        """Why the search should stop before trial `number`, where the model says no untried
        setting is worth its trial (`worth_going_on`)."""
        return self.said_enough.pop(number, None)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        chosen = self.chosen.get(trial.number, {})
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
        self.chosen.pop(trial.number, None)

    # The search.

    def choose(self, trials: list[FrozenTrial]) -> int | None:
        """The index of the setting to run next, or None when every setting was tried."""
        self.enough_now = None
        tried = {
            self.points.find(t.user_attrs[PARAMS_ATTR])
            for t in trials
            if PARAMS_ATTR in t.user_attrs
        }
        untried = [i for i in range(len(self.points.keys)) if i not in tried]
        if not untried:
            return None
        records = [record_of(t) for t in trials if is_recorded(t)]

        def runs(index: int) -> bool:
            return index not in tried and self._runs(index, records)

        guess = self.guess(records, tried)
        if guess is not None:
            if guess not in tried:
                return guess
            step = ladder_step(self.points, guess, self.plan, records, runs)
            if step is not None:
                return step
        cost = TrialCost.fit(records, self._steps)
        observed, y, feasible = self._observed(records, cost)
        order = (
            self._designed(untried, records)
            if len(observed) < 2
            else self._by_model(untried, observed, y, feasible, records, cost)
        )
        for index in order:
            if self._runs(index, records):
                return index
        return None

    def guess(self, records: list[TrialRecord], tried: set[int | None]) -> int | None:
        """The expert's guess (`study/guess.py`), from the baseline's record alone: the same
        whichever worker asks, and however the study grew since."""
        baseline = [r for r in records if r.baseline]

        def runs(index: int) -> bool:
            return index in tried or self._runs(index, baseline)

        key = tuple((r.number, r.status) for r in baseline)
        if key not in self.guesses:
            self.guesses[key] = expert_guess(self.points, self.plan, baseline, runs)
        return self.guesses[key]

    @property
    def _steps(self) -> int:
        return self.plan.trial_steps

    def _observed(
        self, records: list[TrialRecord], cost: TrialCost
    ) -> tuple[list[int], np.ndarray, list[bool]]:
        """The settings measured, their log samples/s and whether each is feasible (ok under
        the memory limit, so that it could be recommended): the ok trials, and the trials
        that timed out, at the fastest pace they could have had (`TrialCost.pace_bound`)."""
        observed, speeds, feasible = [], [], []
        for record in records:
            index = self.points.find(record.params)
            if index is None:
                continue
            if record.status in MEASURED and record.result.samples_per_s:
                observed.append(index)
                speeds.append(record.result.samples_per_s)
                feasible.append(self._feasible(record))
            elif record.status is Status.TIMEOUT:
                bound = cost.pace_bound(record.params, self._limit_s(record.params))
                if bound is not None:
                    observed.append(index)
                    speeds.append(bound)
                    feasible.append(False)
        return observed, np.log(speeds) if speeds else np.zeros(0), feasible

    def _limit_s(self, params: dict[str, Any]) -> float:
        return time_limit_s(self.plan.config, params)

    def _designed(self, untried: list[int], records: list[TrialRecord]) -> list[int]:
        """Untried settings, most unseen knob values first, ties in random order: while fewer
        than two settings were measured (the baseline and the guess did not both run: on a GPU
        the HF defaults of a large model often run out of memory). First those within the
        trust radius of the fastest feasible trial, where one ran (`Neighbourhood.around`),
        then the others; compiled and fp8 settings last, as the model leaves them
        (`Neighbourhood.refinements`): a setting that changes every knob at once
        (checkpointing, eager attention, a paged 8-bit optimizer and max-autotune together)
        is the likeliest to fail, and says least of what each change does."""
        near = Neighbourhood(self.points, self.plan)
        plain = set(near.refinements(untried, None, late=False))
        measured = [(r, self.points.find(r.params)) for r in records]
        feasible = [(r, i) for r, i in measured if i is not None and self._feasible(r)]
        close = [i for i in untried if i in plain]
        if feasible:
            incumbent = max(feasible, key=lambda pair: pair[0].result.samples_per_s)[1]
            close = near.around(close, incumbent, records)
        seen = np.zeros(self.points.levels.shape, dtype=bool)
        for _, index in measured:
            if index is not None:
                seen |= self.points.levels == self.points.levels[index]

        def by_novelty(indices: list[int]) -> list[int]:
            unseen = (~seen[indices]).sum(axis=1) + self.rng.random(len(indices))
            return [indices[i] for i in np.argsort(-unseen)]

        first = set(close)
        rest = [i for i in untried if i not in first]
        return (
            by_novelty(close)
            + by_novelty([i for i in rest if i in plain])
            + by_novelty([i for i in rest if i not in plain])
        )

    def _by_model(
        self,
        untried: list[int],
        observed: list[int],
        y: np.ndarray,
        feasible: list[bool],
        records: list[TrialRecord],
        cost: TrialCost,
    ) -> list[int]:
        """Untried settings, most promising first: the model's expected gain over the fastest
        feasible trial, times the chance the setting fits the memory limit, per predicted
        second of its trial raised to a weight that fades from 1 to 0 over the search
        (`cost_weight`); ties by the model's optimistic estimate. Compiled and fp8 settings
        wait for the last LOCAL_TRIALS trials (`refinements`), which change one knob of the
        fastest feasible trial at a time (while any is left). A setting that would pass its
        trial's time limit even at the model's optimistic pace is passed over."""
        incumbent = (
            observed[int(np.argmax(np.where(feasible, y, -np.inf)))] if any(feasible) else None
        )
        everywhere = untried
        done = sum(r.status is not Status.SKIPPED for r in records)
        late = self.plan.config.n_trials - done <= LOCAL_TRIALS
        near = Neighbourhood(self.points, self.plan)
        untried = near.refinements(untried, incumbent, late)
        if incumbent is not None and not late:
            untried = near.around(untried, incumbent, records)
        untried = self.within_budget(untried, records)
        mean, sd = predict(self.points, observed, y, untried)
        best = float(np.max(np.where(feasible, y, -np.inf))) if any(feasible) else float(y.max())
        gain = expected_gain(mean, sd, best) * self._fits(untried, records)
        params = [self.points.params[i] for i in untried]
        seconds = np.array(
            [cost.predict_s(p, s) for p, s in zip(params, np.exp(mean), strict=True)]
        )
        optimistic = np.exp(mean + UCB_BETA * sd)
        fastest = np.array([cost.predict_s(p, s) for p, s in zip(params, optimistic, strict=True)])
        limits = np.array([self._limit_s(p) for p in params])
        within = fastest <= limits
        ranks = np.array([prior_rank(p, self.plan.device) for p in params])
        advice = PRIOR_WEIGHT ** (ranks * PRIOR_BETA / len(observed))
        score = advice * gain / np.maximum(seconds, 1e-3) ** self.cost_weight(done, records)
        order = np.lexsort((-optimistic, -score))
        order = [untried[i] for i in order if within[i]]
        threshold = self.plan.config.min_gain_per_minute
        rate = gain / np.maximum(seconds / 60, 1e-6)  # share of samples/s a minute of trial
        near_worth = not threshold or bool(np.any(within & (rate >= threshold)))
        if not near_worth and not self.worth_going_on(
            everywhere, order, observed, y, best, records, cost
        ):
            self.enough_now = (
                "the model expects no untried setting to gain "
                f"{self.plan.config.min_gain_per_minute:.2%} of samples/s a minute of its trial "
                "(min_gain_per_minute)"
            )
        return order

    def worth_going_on(
        self,
        untried: list[int],
        near: list[int],
        observed: list[int],
        y: np.ndarray,
        best: float,
        records: list[TrialRecord],
        cost: TrialCost,
    ) -> bool:
        """Whether some untried setting that would run is expected to gain at least
        `min_gain_per_minute` of the fastest feasible trial's samples/s per minute of its
        predicted trial: the expected gain, times its chance to fit the budget, within its
        time limit. Asked once none the model chooses from now (`near`) is: among a sample of
        all the others (ENOUGH_SAMPLE: the trust radius is how the search moves, not where
        gains can be); only the most promising (ENOUGH_CHECKS) are checked against the memory
        budget, the pre-trial checks and the time limit, and if all of those pass, the search
        goes on."""
        threshold = self.plan.config.min_gain_per_minute
        if not threshold:
            return True
        chosen_from = set(near)
        candidates = [i for i in untried if i not in chosen_from]
        if len(candidates) > ENOUGH_SAMPLE:
            rng = np.random.default_rng(len(records))  # the same answer on a rerun
            candidates = [int(i) for i in rng.choice(candidates, ENOUGH_SAMPLE, replace=False)]
        if not candidates:
            return False
        mean, sd = predict(self.points, observed, y, candidates)
        params = [self.points.params[i] for i in candidates]
        minutes = (
            np.array([cost.predict_s(p, s) for p, s in zip(params, np.exp(mean), strict=True)]) / 60
        )
        rate = expected_gain(mean, sd, best) / np.maximum(minutes, 1e-6)
        top = [k for k in np.argsort(-rate)[:ENOUGH_CHECKS] if rate[k] >= threshold]
        if len(top) == ENOUGH_CHECKS:
            return True  # too many to check: far from enough
        fastest = [cost.predict_s(params[k], math.exp(mean[k] + UCB_BETA * sd[k])) for k in top]
        top = [
            k
            for k, seconds in zip(top, fastest, strict=True)
            if seconds <= self._limit_s(params[k]) and self._runs(candidates[k], records)
        ]
        indices = [candidates[k] for k in top]
        fits = self._fits(indices, records) if indices else np.zeros(0)
        return bool(np.any(rate[top] * fits >= threshold))

    def within_budget(self, untried: list[int], records: list[TrialRecord]) -> list[int]:
        """The settings whose estimate, calibrated on the measured peaks
        (`estimate.calibrated_gib`), stays within the memory limit a pick must keep under (the
        budget less its headroom; all of them where none does): a trial past it may run, but
        is never recommended; the pre-trial check allows `estimate_margin` over the budget,
        for an estimate not yet calibrated; an out-of-memory trial costs a trial's start-up
        for nothing."""
        limit = self.plan.info.memory_limit_gib
        peaks = checks.measured_peaks(records)
        if not peaks:
            return untried
        within = [
            i
            for i in untried
            if self._raw_estimate(i) is None
            or calibrated_gib(self.points.params[i], self._estimate(i), peaks) <= limit
        ]
        return within or untried

    def cost_weight(self, done: int, records: list[TrialRecord]) -> float:
        """How much a trial's predicted time weighs in the choice (cost-cooling, after Lee et
        al. 2020): 1 at the start of the search, falling to 0 at its last trial, or at
        `timeout=` when the trials' time so far is nearer to it."""
        config = self.plan.config
        spent = done / max(config.n_trials, 1)
        if config.timeout:
            spent = max(spent, sum(r.result.wall_s or 0.0 for r in records) / config.timeout)
        return max(0.0, 1.0 - spent)

    def _fits(self, untried: list[int], records: list[TrialRecord]) -> np.ndarray:
        """The chance that each setting's peak stays within the memory limit a pick must keep
        under (the budget less its headroom): the same model, of log peak memory over the
        setting's estimate, fitted to the measured peaks and to the out-of-memory trials
        (counted at OOM_OVER x the budget)."""
        budget = self.plan.info.memory_budget_gib
        observed, y = [], []
        for record in records:
            if self.points.find(record.params) is None:
                continue
            result = record.result
            if result.status in MEASURED and result.peak_memory_gib:
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
        pick_limit = self.plan.info.memory_limit_gib
        limit = np.log([pick_limit / self._estimate(i) for i in untried])
        return normal_cdf((limit - mean) / sd)

    def _feasible(self, record: TrialRecord) -> bool:
        """Whether the trial could be recommended: ok, under the memory limit."""
        return record.result.feasible(self.plan.info.memory_limit_gib)

    def _index(self, record: TrialRecord) -> int:
        index = self.points.find(record.params)
        assert index is not None
        return index

    def _estimate(self, index: int) -> float:
        """The setting's memory estimate in GiB; 1 where none is made (the user's Trainer)."""
        if index not in self.estimates:
            self.estimates[index] = self.plan.estimate_gib(self.points.params[index])
        return self.estimates[index] or 1.0

    def _raw_estimate(self, index: int) -> float | None:
        self._estimate(index)
        return self.estimates[index]

    def _runs(self, index: int, records: list[TrialRecord]) -> bool:
        """Whether the search loop would run this setting (no pre-trial check skips it)."""
        self._estimate(index)
        params, estimate = self.points.params[index], self.estimates[index]
        return checks.first_skip(params, records, self.pre_trial, estimate) is None
