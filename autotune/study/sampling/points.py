"""The search space's settings, enumerated once and encoded for the effects model
(`study/effects.py`) and the search's opening (`study/guess.py`)."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.common.knobs import SAMPLE_ORDER, active, value_of
from autotune.plan.plan import SearchPlan
from autotune.plan.space import Condition
from autotune.study import checks

POINTS_LIMIT = 200_000
"""Settings enumerated at most; a larger space is searched over a random sample of them."""


@dataclass(eq=False)
class Points:
    """Every setting of the space (or a random sample of a huge one), encoded for the model.
    Not frozen: `find` remembers its lookups in `found`; the rest is not changed once made."""

    params: list[dict[str, Any]]
    optuna: list[dict[str, Any]]
    """Each setting's Optuna parameters (what `SearchSpace.sample` asks for)."""
    keys: list[str]
    index: dict[str, int]
    """Settings key -> index."""
    names: list[str]
    """The knobs, in the order of `levels`' columns."""
    levels: np.ndarray
    """settings x knobs: the index of each knob's value (an inactive knob has its own)."""
    unset: np.ndarray
    """knobs: the level of "inactive" of each knob; -1 where it is always active."""
    trends: np.ndarray
    """settings x numeric knobs: standardised log2(1 + value)."""
    conditions: dict[str, tuple[Condition, ...]] = field(default_factory=dict)
    """knob -> the space's own conditions on it (`when:` in a space file)."""
    found: dict[str, int | None] = field(default_factory=dict)
    """Settings key -> index, of the settings `find` looked up that no key names (a memo:
    the one part that changes)."""

    @classmethod
    def of(cls, plan: SearchPlan, rng: np.random.Generator) -> Points:
        # A space too large to enumerate is searched over a random sample: the baseline's
        # setting is drawn into it first, so that the model has it from the first trial.
        conditions = {k: knob.when for k, knob in plan.space.knobs.items()}
        baseline = as_searched(plan.baseline, plan.space.knobs.keys(), conditions)
        found = plan.space.points(plan.rules, limit=POINTS_LIMIT, rng=rng, first=[baseline])
        params = [p for p, _ in found]
        names = sorted({k for p in params for k in p})
        values = [sorted({repr(p.get(k)) for p in params}) for k in names]
        level_of = [{value: level for level, value in enumerate(v)} for v in values]
        levels = np.array(
            [[level_of[j][repr(p.get(k))] for j, k in enumerate(names)] for p in params],
            dtype=np.int32,
        ).reshape(len(params), len(names))
        numeric = [
            k
            for k in names
            if all(
                isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] >= 0
                for p in params
            )
            and len({p[k] for p in params}) > 1
        ]
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
            names=names,
            levels=levels,
            unset=np.array(
                [v.index("None") if "None" in v else -1 for v in values], dtype=np.int32
            ),
            trends=trends,
            conditions={k: conditions[k] for k in names if k in conditions},
        )

    def find(self, params: dict[str, Any]) -> int | None:
        """The index of these settings. Settings that leave out knobs the space searches (a
        baseline planned before them, which sets no compile) match the setting with each
        left-out knob that is active there at what training then does (`knobs.value_of`:
        compile off, DDP's 25 MiB buckets), or else the one setting that agrees on the rest; a
        knob the space does not search, set at that value, is as if left out."""
        key = checks.settings_key(params)
        if key in self.index:
            return self.index[key]
        if key not in self.found:
            filled = as_searched(params, self.names, self.conditions)
            found = self.index.get(checks.settings_key(filled))
            if found is None:
                agree = [i for i, p in enumerate(self.params) if params.items() <= p.items()]
                found = agree[0] if len(agree) == 1 else None
            self.found[key] = found
        return self.found[key]

    def differ(self, a: list[int], b: int) -> np.ndarray:
        """How many knobs active in both differ between each setting of `a` and `b`."""
        return self.differing(a, b).sum(axis=1)

    def differing(self, a: list[int], b: int) -> np.ndarray:
        """settings of `a` x knobs: whether the knob is active in both and differs from `b`."""
        mine, theirs = self.levels[a], self.levels[b]
        active = (mine != self.unset) & (theirs != self.unset)
        return (mine != theirs) & active

    def kernel(self, a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Between each point of `a` and each of `b` (arrays of len(a) x len(b)): the knob
        values they share, the product of their numeric knobs' trends, and the knob values
        they differ in."""
        shared = (self.levels[a][:, None, :] == self.levels[b][None, :, :]).sum(axis=2)
        return shared, self.trends[a] @ self.trends[b].T, self.levels.shape[1] - shared

    def kernel_diagonal(self, a: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`kernel` of each point of `a` with itself (arrays of len(a))."""
        knobs = self.levels.shape[1]
        return np.full(len(a), knobs), (self.trends[a] ** 2).sum(axis=1), np.zeros(len(a))


def as_searched(
    params: dict[str, Any], names: Collection[str], conditions: dict[str, tuple[Condition, ...]]
) -> dict[str, Any]:
    """Settings as the space of knobs `names` (with its `when:` `conditions`) would hold them:
    each knob they leave out that the space searches, where it is active, at what training
    then does (`knobs.value_of`); a knob the space does not search, set at that value, as if
    left out (the baseline's fp32 where the space searches no precision)."""
    filled = {k: v for k, v in params.items() if k in names or v != value_of({}, k)}
    for name in SAMPLE_ORDER:  # each knob after those it requires
        if name not in names or name in params:
            continue
        if (value := value_of(filled, name)) is not None:
            # As the space has it: no knob set where it is inactive.
            when = conditions.get(name, ())
            if active(name, filled) and all(c.holds(filled) for c in when):
                filled[name] = value
    return filled
