"""Fit a search space, once fitted to the device (`capabilities`), to the batch-size rule
(`space.multiple_for`) and a fixed effective batch (`effective_batch_size=`): a precision with
no batch size left under them leaves the space, with a note; when none is left, the space is
refused, with the batch sizes the rule allows each precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autotune.common.errors import SpaceError
from autotune.plan.space import SamplingRules, SearchSpace, multiple_for


def apply_sampling_rules(space: SearchSpace, rules: SamplingRules) -> SearchSpace:
    """Fit the space to the batch-size rule and a fixed effective batch: a precision with no
    batch size left under them leaves the space, with a note; when none is left, a SpaceError
    names each one's batch sizes. Notes the effective batch."""
    if "batch_size" not in space.knobs:
        if rules.effective_batch_size:
            raise SpaceError(f"space {space.name} has no batch_size knob for effective_batch_size")
        return space
    precisions = space.knobs["precision"].choices if "precision" in space.knobs else (None,)
    kept = tuple(p for p in precisions if space.batch_candidates(p, rules))
    left_out = [p for p in precisions if p not in kept]
    # Without a fixed effective batch every precision has sizes: a space file lists a multiple
    # of its `multiple_of`, and of 64 under `auto` (space_file's rule check).
    assert rules.effective_batch_size or not left_out, left_out
    grouped = _by_rule(space, left_out, rules)
    if not kept:
        named = "precision" in space.knobs
        lines = [
            f"  - {'precision=' + ', '.join(names) if named else 'the space'}: {sizes}"
            for (_, sizes), names in grouped.items()
        ]
        raise SpaceError(
            f"effective_batch_size={rules.effective_batch_size}: no batch size of space "
            f"{space.name} divides it under the batch-size rule:\n"
            + "\n".join(lines)
            + "\n  give an effective_batch_size that one of these batch sizes divides"
        )
    notes = [
        f"precision={', '.join(names)} left out: no batch size that is a multiple of {multiple} "
        f"divides effective_batch_size={rules.effective_batch_size} ({sizes})"
        for (multiple, sizes), names in grouped.items()
    ]
    if left_out:
        space = space.with_choices("precision", kept)
    if rules.effective_batch_size:
        notes.append(
            f"effective batch fixed at {rules.effective_batch_size}: grad_accum = "
            f"{rules.effective_batch_size} / batch_size"
            + (
                "; the space's grad_accum values are not used"
                if "grad_accum" in space.knobs
                else ""
            )
        )
    return replace(space, notes=space.notes + tuple(notes))


def _by_rule(
    space: SearchSpace, precisions: Sequence[str | None], rules: SamplingRules
) -> dict[tuple[int, str], list[str]]:
    """(multiple, the sizes the rule allows, in short) -> the precisions under it: precisions
    under one rule share a line of a message."""
    grouped: dict[tuple[int, str], list[str]] = {}
    for precision in precisions:
        multiple = multiple_for(space.knobs["batch_size"], precision, rules)
        key = (multiple, _rule_sizes(space, precision, rules))
        grouped.setdefault(key, []).append(str(precision))
    return grouped


def _rule_sizes(space: SearchSpace, precision: str | None, rules: SamplingRules) -> str:
    """The batch sizes the rule allows a precision, whatever the effective batch, in short."""
    sizes = space.batch_candidates(precision, replace(rules, effective_batch_size=None))
    if not sizes:
        knob = space.knobs["batch_size"]
        multiple = multiple_for(knob, precision, rules)
        return f"multiples of {multiple} from {min(knob.choices)} to {max(knob.choices)}: none"
    # A range holds up to hundreds of sizes: its first few and its last tell the rule.
    shown = sizes if len(sizes) <= 6 else (*sizes[:3], "...", sizes[-1])
    return "batch sizes allowed under the rule: " + ", ".join(map(str, shown))
