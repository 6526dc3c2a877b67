"""Which untried settings the effects sampler may choose from (`study/effects.py`): those
within a trust radius of the fastest trial, leaving out changes not worth a trial, and
compiled or fp8 settings only as the last trials' refinements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.common.knobs import is_compiled, value_of
from autotune.common.trial import Status
from autotune.plan.plan import SearchPlan
from autotune.store.records import TrialRecord
from autotune.study.sampling.points import Points

WIDEN_AFTER = 3
"""Trials without a faster one after which the model looks one knob further from the fastest
(its trust radius)."""
RECOMPUTES = ("gradient_checkpointing", "activation_offload")
"""Knobs that buy memory with time: turned on alone they only slow a trial down."""


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    points: Points
    plan: SearchPlan

    def refinements(self, untried: list[int], incumbent: int | None, late: bool) -> list[int]:
        """The settings the model may choose from now: before the last trials
        (`effects.LOCAL_TRIALS`), none compiled or in fp8 (their compile and scaling cost most
        and pay off least often: tried last, on the best eager settings); in them, those one
        knob from the fastest feasible trial, a compile mode other than the default only once
        a compiled trial is the fastest. Compiling or fp8 may come with another batch (and its
        accumulation): compiled activations take more memory (`estimate`), so the fastest
        eager batch may not fit them."""
        points = self.points
        if late and incumbent is not None:
            compiled = is_compiled(points.params[incumbent])
            refined = _refinement(points.params[incumbent])
            batch_knobs = {"batch_size", "grad_accum"}
            near = [
                i
                for i, changed in zip(untried, self._changed(untried, incumbent, 3), strict=True)
                if changed is not None
                and (compiled or _default_mode(points.params[i]))
                and not self._pointless(changed, points.params[i], batch=False)
                and (
                    len(changed) == 1
                    or (
                        len(set(changed) - batch_knobs) == 1
                        and _refinement(points.params[i])
                        and not refined
                    )
                )
            ]
            if near:
                return near
        plain = [i for i in untried if not _refinement(points.params[i])]
        return plain or untried

    def around(self, untried: list[int], incumbent: int, records: list[TrialRecord]) -> list[int]:
        """The settings within a trust radius of the fastest feasible trial: one knob away,
        widened by one knob for each `WIDEN_AFTER` trials that found nothing faster since it
        ended (all of them where none is left within)."""
        since = 0
        for record in reversed(records):
            if self.points.find(record.params) == incumbent:
                break
            since += record.status is not Status.SKIPPED
        radius = 1 + since // WIDEN_AFTER
        near = [
            index
            for index, changed in zip(
                untried, self._changed(untried, incumbent, radius), strict=True
            )
            if changed is not None and not self._pointless(changed, self.points.params[index])
        ]
        return near or untried

    def _changed(self, untried: list[int], incumbent: int, most: int) -> list[list[str] | None]:
        """For each setting, the knobs (active in both) in which it differs from `incumbent`;
        None where they are more than `most`."""
        names = self.points.names
        rows = self.points.differing(untried, incumbent)
        counts = rows.sum(axis=1)
        return [
            None if count > most else [names[j] for j in np.flatnonzero(row)]
            for row, count in zip(rows, counts, strict=True)
        ]

    def _pointless(self, changed: list[str], params: dict[str, Any], batch: bool = True) -> bool:
        """A change of the fastest trial not worth a trial: its batch alone (`batch`: the
        ladder moved it; with a fixed effective batch the accumulation follows), or recomputing
        activations at the same batch (slower by design: it pays only with a batch that did
        not fit)."""
        batch_knobs = {"batch_size"}
        if self.plan.rules.effective_batch_size:
            batch_knobs.add("grad_accum")
        if batch and changed and set(changed) <= batch_knobs:
            return True
        return len(changed) == 1 and changed[0] in RECOMPUTES and bool(params.get(changed[0]))


def _refinement(params: dict[str, Any]) -> bool:
    """Compiled or fp8: tried last, as refinements of the best eager settings."""
    return is_compiled(params) or params.get("precision") == "fp8"


def _default_mode(params: dict[str, Any]) -> bool:
    return value_of(params, "compile_mode") == "default"
