"""The trade-off between speed and memory: the non-dominated trials, and the ones to recommend.

Pure functions over decoded trials (`records.read_snapshot` reads the study and calls them).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.common.trial import Status
from autotune.common.units import format_gib, plural

if TYPE_CHECKING:  # records imports this module to build its snapshot
    from autotune.store.records import TrialRecord

SAVER_WITHIN = 0.10
"""The memory saver may be this much slower than the recommendation."""


NOTHING_TO_RECOMMEND = 3
"""Exit code of a search that finished but has no trial to recommend (`Picks.recommended` is
None)."""


ONE_TRIAL = "in one short trial"
"""How a trial's own speedup is marked where a confirmed one may stand beside it."""

SAME_MEMORY = 0.01
"""Peaks within this share of each other count as the same memory on the front: a CPU's
resident memory varies by a few MiB between runs of one setting, and a trial 3x slower is no
memory saver for 0.3 MiB less."""


def non_dominated(records: list[TrialRecord]) -> list[TrialRecord]:
    """Trials no other trial beats on both samples/s (higher) and peak memory (lower, or
    within `SAME_MEMORY` of it)."""

    def beats(a: TrialRecord, b: TrialRecord) -> bool:
        faster, smaller = a.result.samples_per_s, a.result.peak_memory_gib
        other_speed, other_memory = b.result.samples_per_s, b.result.peak_memory_gib
        at_least = faster >= other_speed and smaller <= other_memory * (1 + SAME_MEMORY)
        return at_least and (faster > other_speed or smaller < other_memory)

    return [r for r in records if not any(beats(other, r) for other in records)]


UNSTEADY_ROUNDS = 2.0
"""A pick whose highest confirmation round is over this many times its lowest is said to be
unsteady: rounds of one setting on a steady machine lie within a few percent."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Confirmed:
    """The picks measured again after the search (`autotune.outputs.confirm`): `rounds` rounds, each
    running every pick once in a fresh trial process (A B C D, D C B A, ...). Within a round
    the picks ran minutes apart at most, so their ratios there cancel the machine's drift; a
    figure is the median over rounds, its interval the lowest and highest round."""

    rounds: int
    samples_per_s: dict[int, tuple[float | None, ...]]
    """Trial number -> its samples/s in each round (None: that run did not measure)."""
    peak_memory_gib: dict[int, tuple[float | None, ...]]
    wall_s: float
    """What the confirmation took."""
    records_seen: int
    """How many trials the study had recorded: with more since, the picks may be others."""

    def covers(self, record: TrialRecord | None) -> bool:
        return record is not None and len(self._measured(record.number)) > 0

    def median(self, number: int) -> float | None:
        values = self._measured(number)
        return statistics.median(values) if values else None

    def interval(self, number: int) -> tuple[float, float] | None:
        values = self._measured(number)
        return (min(values), max(values)) if values else None

    def unsteady(self) -> str | None:
        """Where a pick's rounds lie over UNSTEADY_ROUNDS apart (the machine's load changed
        while they ran): which, and what to do, in words; None where every pick held."""
        apart = []
        for number in sorted(self.samples_per_s):
            found = self.interval(number)
            if found is not None and found[0] > 0 and found[1] / found[0] > UNSTEADY_ROUNDS:
                apart.append(
                    f"trial {number}'s {found[1] / found[0]:.1f}x ({found[0]:.2f}-{found[1]:.2f})"
                )
        if not apart:
            return None
        return (
            f"the confirmation's rounds disagree: highest over lowest round {', '.join(apart)}. "
            "The machine's load changed while they ran: the medians stand, but a tie or a "
            "speedup among these picks is not steady; confirm again on a quiet machine "
            "(autotune confirm STUDY_DIR)"
        )

    def median_peak_gib(self, number: int) -> float | None:
        values = [v for v in self.peak_memory_gib.get(number, ()) if v is not None]
        return statistics.median(values) if values else None

    def ratios(self, a: int, b: int) -> list[float]:
        """a's samples/s over b's, round by round (the rounds where both measured)."""
        pairs = zip(self.samples_per_s.get(a, ()), self.samples_per_s.get(b, ()), strict=False)
        return [x / y for x, y in pairs if x is not None and y]

    def ratio(self, a: int, b: int) -> tuple[float, float, float] | None:
        """(median, lowest, highest) of `ratios`; None when no round measured both."""
        ratios = self.ratios(a, b)
        return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None

    def clearly_faster(self, a: int, b: int) -> bool:
        """a was faster than b in every round, and there were at least two."""
        ratios = self.ratios(a, b)
        return len(ratios) >= 2 and min(ratios) > 1

    def tied(self, a: int, b: int) -> bool:
        """The rounds disagree on which of the two is faster: their figures cannot tell them
        apart."""
        return bool(self.ratios(a, b)) and not (
            self.clearly_faster(a, b) or self.clearly_faster(b, a)
        )

    def _measured(self, number: int) -> list[float]:
        return [v for v in self.samples_per_s.get(number, ()) if v is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "samples_per_s": {str(k): list(v) for k, v in self.samples_per_s.items()},
            "peak_memory_gib": {str(k): list(v) for k, v in self.peak_memory_gib.items()},
            "wall_s": self.wall_s,
            "records_seen": self.records_seen,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confirmed:
        return cls(
            rounds=data["rounds"],
            samples_per_s={int(k): tuple(v) for k, v in data["samples_per_s"].items()},
            peak_memory_gib={int(k): tuple(v) for k, v in data["peak_memory_gib"].items()},
            wall_s=data["wall_s"],
            records_seen=data["records_seen"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Picks:
    recommended: TrialRecord | None
    """What to train with: the same-training pick, unless a trial that changes the training
    is faster by `min_gain` and clear of the noise (`choose`)."""
    why: str
    """Why the recommendation is that trial, in words ("" when there is none)."""
    fastest: TrialRecord | None
    """The highest samples/s under the limit (confirmed when there is a confirmation)."""
    same_training: TrialRecord | None
    """The fastest trial under the limit whose training is the baseline's (same effective
    batch, precision family and optimizer family); None without a baseline to compare with."""
    saver: TrialRecord | None
    """The least memory within SAVER_WITHIN of the recommendation's samples/s (by the trials'
    own figures: the confirmation measures it again)."""
    baseline: TrialRecord | None
    """The HF-defaults trial, when it ran."""
    noise_cv: float
    """A trial whose step-time CV is above this is flagged noisy."""
    reference: TrialRecord | None = None
    """The reference, queued where the HF defaults do not fit (`SearchPlan.reference`)."""
    min_gain: float = 1.10
    confirmed: Confirmed | None = None
    """The picks measured again after the search; None when not (`confirm_rounds=0`)."""

    def is_confirmed(self, record: TrialRecord) -> bool:
        return self.confirmed is not None and self.confirmed.covers(record)

    def samples_per_s(self, record: TrialRecord) -> float | None:
        """The confirmed median when there is one, else the trial's own figure."""
        if self.confirmed is not None and self.is_confirmed(record):
            return self.confirmed.median(record.number)
        return record.result.samples_per_s

    @property
    def yardstick(self) -> TrialRecord | None:
        """What speedups are told against (`_yardstick`)."""
        return _yardstick(self.baseline, self.reference)

    @property
    def yardstick_name(self) -> str:
        """`the baseline` or `the reference`, as speedups name what they are against."""
        yardstick = self.yardstick
        return "the reference" if yardstick is not None and yardstick.reference else "the baseline"

    def speedup(self, record: TrialRecord) -> float | None:
        """samples/s relative to the yardstick (the baseline, else the reference), confirmed
        (the median of the round-by-round ratios) when both were confirmed; None when neither
        has a figure."""
        if (yardstick := self.yardstick) is None:
            return None
        if (confirmed := self._confirmed_ratio(record, yardstick)) is not None:
            return confirmed[0]
        return self.measured_speedup(record)

    def measured_speedup(self, record: TrialRecord) -> float | None:
        """The trial's own samples/s over the yardstick's (not confirmed); None where either
        has no figure."""
        if (yardstick := self.yardstick) is None:
            return None
        mine, theirs = record.result.samples_per_s, yardstick.result.samples_per_s
        return mine / theirs if mine and theirs else None

    def speedup_note(self, record: TrialRecord) -> str:
        """The one speedup told of a trial beside its own samples/s: `one short trial;
        confirmed 1.60x [1.47-1.99] the baseline` where the rounds measured it against the
        yardstick, else `2.07x the baseline in one short trial`; "" without a figure."""
        versus = self.yardstick_name
        interval = self.speedup_interval(record)
        if (times := self.speedup(record)) is None:
            return ""
        if interval is None:
            return f"{times:.2f}x {versus} {ONE_TRIAL}"
        low, high = interval
        return f"one short trial; confirmed {times:.2f}x [{low:.2f}-{high:.2f}] {versus}"

    def speedup_interval(self, record: TrialRecord) -> tuple[float, float] | None:
        """The lowest and highest round's ratio to the yardstick; None unconfirmed."""
        yardstick = self.yardstick
        if yardstick is None or (found := self._confirmed_ratio(record, yardstick)) is None:
            return None
        return found[1], found[2]

    def ties(self, record: TrialRecord) -> list[TrialRecord]:
        """The other confirmed picks the rounds cannot tell from this one."""
        if self.confirmed is None or not self.is_confirmed(record):
            return []
        others = {
            r.number: r
            for r in (self.fastest, self.same_training, self.saver, self.baseline, self.reference)
            if r is not None
        }
        return [
            r
            for n, r in sorted(others.items())
            if n != record.number and self.confirmed.tied(record.number, n)
        ]

    def _confirmed_ratio(
        self, record: TrialRecord, other: TrialRecord
    ) -> tuple[float, float, float] | None:
        if self.confirmed is None or record.number == other.number:
            return (1.0, 1.0, 1.0) if self.is_confirmed(record) else None
        return self.confirmed.ratio(record.number, other.number)

    def reference_changes(self) -> dict[str, Any]:
        """What the reference's settings change of the baseline's (the low-memory recipe)."""
        if self.reference is None:
            return {}
        before = self.baseline.params if self.baseline is not None else {}
        return {k: v for k, v in self.reference.params.items() if before.get(k) != v}

    def describe_reference(self) -> str:
        """The reference's figure, or why it has none; "" where none was queued."""
        return "" if self.reference is None else self._describe_yardstick(self.reference)

    def describe_baseline(self) -> str:
        return "not run" if self.baseline is None else self._describe_yardstick(self.baseline)

    def _describe_yardstick(self, record: TrialRecord) -> str:
        if record.result.samples_per_s is None:
            return f"trial {record.number}: {record.status.value}: {record.result.reason}"
        return self.describe(record, speedup=False)

    def describe(self, record: TrialRecord, speedup: bool = True) -> str:
        """`trial 7: 512.30 samples/s (1.42x the baseline) at 3.210 GiB`, confirmed with its
        interval (`median of 3 rounds 498.10-520.30, 1.42x [1.38-1.45] the baseline`) or with
        a caveat when this trial or the baseline measured noisily."""
        notes = []
        yardstick, versus = self.yardstick, self.yardstick_name
        speedup = speedup and not (yardstick and record.number == yardstick.number)
        if self.confirmed is not None and self.is_confirmed(record):
            low, high = self.confirmed.interval(record.number) or (0.0, 0.0)
            notes.append(
                f"confirmed: median of {plural(self.confirmed.rounds, 'round')}, "
                f"{low:.2f}-{high:.2f}"
            )
            interval = self.speedup_interval(record)
            if speedup and (times := self.speedup(record)) is not None and interval is not None:
                notes.append(f"{times:.2f}x [{interval[0]:.2f}-{interval[1]:.2f}] {versus}")
            notes += [f"tied with trial {r.number}" for r in self.ties(record)]
        else:
            if speedup and (times := self.speedup(record)) is not None:
                notes.append(f"{times:.2f}x {versus} {ONE_TRIAL}")
            notes += [caveat] if (caveat := self.noise_caveat(record)) else []
        times_text = f" ({'; '.join(notes)})" if notes else ""
        memory = record.result.peak_memory_gib
        return (
            f"trial {record.number}: {self.samples_per_s(record):.2f} samples/s{times_text} at "
            f"{format_gib(memory, 3)}"
        )

    def noise_caveat(self, record: TrialRecord) -> str:
        """`noisy: step CV 35% on this trial, 22% on the baseline (above 10%): ...`; "" when
        neither figure behind the speedup is noisy."""
        measured = [(record, "it")]
        if (yardstick := self.yardstick) is not None and yardstick.number != record.number:
            measured.append((yardstick, self.yardstick_name))
        noisy = [
            f"{r.result.step_time_cv:.0%} on {which}"
            for r, which in measured
            if r.result.noisy(self.noise_cv)
        ]
        if not noisy:
            return ""
        return (
            f"noisy: step CV {' and '.join(noisy)} (above noise_cv {self.noise_cv * 100:g}%); more "
            "measure_steps or an idle machine would firm the figure up"
        )

    def describe_saver(self) -> str:
        if self.saver is None or self.recommended is None:
            return "none"
        if self.saver.number == self.recommended.number:
            return f"the same trial: nothing within {SAVER_WITHIN:.0%} uses less memory"
        return self.describe(self.saver)

    def describe_same_training(self) -> str:
        if self.same_training is None:
            return "none (no baseline to compare with)" if self.baseline is None else "none"
        if self.recommended is not None and self.same_training.number == self.recommended.number:
            return "the recommended trial: it keeps the training"
        return self.describe(self.same_training)


def pick(
    feasible: list[TrialRecord],
    limit_gib: float,
    baseline: TrialRecord | None,
    noise_cv: float,
    *,
    changes_training: Callable[[TrialRecord], bool],
    min_gain: float = 1.10,
    confirmed: Confirmed | None = None,
    reference: TrialRecord | None = None,
) -> Picks:
    """The picks among the successful trials under the budget (`feasible`) that also stay
    under `limit_gib` (the budget less headroom). With a confirmation that covers the trials
    their own figures pick, the fastest and the same-training pick are ranked among those by
    their confirmed figures instead; one made for other picks is not used."""
    fitting = [r for r in feasible if r.result.peak_memory_gib <= limit_gib]

    def fastest_of(
        records: list[TrialRecord], speed: Callable[[TrialRecord], float]
    ) -> tuple[TrialRecord | None, TrialRecord | None]:
        keeping = [r for r in records if baseline is not None and not changes_training(r)]
        return max(records, key=speed, default=None), max(keeping, key=speed, default=None)

    def measured(record: TrialRecord) -> float:
        return record.result.samples_per_s

    fastest, same = fastest_of(fitting, measured)
    recommended, why = _choose(fastest, same, measured, min_gain, None)
    # By its own figures: the confirmation measures it too.
    saver = _saver(fitting, recommended, measured)
    if confirmed is not None:
        picked = [
            r for r in (fastest, same, saver, baseline, reference) if r and r.status is Status.OK
        ]
        if all(confirmed.covers(r) for r in picked):
            speed = functools.partial(_confirmed_speed, confirmed, _yardstick(baseline, reference))
            covered = [r for r in fitting if confirmed.covers(r)]
            fastest, same = fastest_of(covered, speed)
            recommended, why = _choose(fastest, same, speed, min_gain, confirmed)
            # Within 10% of the recommendation as confirmed, which may be another trial now.
            saver = _saver(covered, recommended, speed)
        else:
            confirmed = None  # made for other picks (trials were added since)
    return Picks(
        recommended=recommended,
        why=why,
        fastest=fastest,
        same_training=same,
        saver=saver,
        baseline=baseline,
        reference=reference,
        noise_cv=noise_cv,
        min_gain=min_gain,
        confirmed=confirmed,
    )


def _saver(
    records: list[TrialRecord],
    recommended: TrialRecord | None,
    speed: Callable[[TrialRecord], float],
) -> TrialRecord | None:
    """The least memory among `records` within `SAVER_WITHIN` of the recommendation's speed."""
    if recommended is None:
        return None
    close = [r for r in records if speed(r) >= (1 - SAVER_WITHIN) * speed(recommended)]
    return min(close, key=lambda r: r.result.peak_memory_gib)


def _yardstick(baseline: TrialRecord | None, reference: TrialRecord | None) -> TrialRecord | None:
    """What speedups are told against: the baseline where it measured, else the reference
    where it did; None: neither has a figure."""
    return next((r for r in (baseline, reference) if r is not None and r.status is Status.OK), None)


def _confirmed_speed(
    confirmed: Confirmed, yardstick: TrialRecord | None, record: TrialRecord
) -> float:
    """A trial's confirmed figure for ranking the picks: the yardstick's median times the
    trial's speedup over it (the median of their round-by-round ratios: the speedup every
    output shows), so that a drift in the machine's load during the rounds ranks no trial
    above one its speedup puts ahead; its own median where the rounds did not measure the
    yardstick beside it."""
    own = confirmed.median(record.number) or 0.0
    if yardstick is None or yardstick.number == record.number:
        return own
    ratio = confirmed.ratio(record.number, yardstick.number)
    base = confirmed.median(yardstick.number)
    return ratio[0] * base if ratio and base else own


def _choose(
    fastest: TrialRecord | None,
    same: TrialRecord | None,
    speed: Callable[[TrialRecord], float],
    min_gain: float,
    confirmed: Confirmed | None,
) -> tuple[TrialRecord | None, str]:
    """The same-training pick, unless the fastest changes the training and is faster by at
    least `min_gain` and clear of the noise: faster in every confirmed round or, unconfirmed,
    its samples/s less one step-time CV above the other's plus one."""
    if fastest is None:
        return None, ""
    if same is None:
        return fastest, "the fastest: no trial keeps the baseline's training to compare with"
    if same.number == fastest.number:
        return same, "the fastest, and it keeps the training"
    gain = speed(fastest) / speed(same)
    if confirmed is not None and (ratio := confirmed.ratio(fastest.number, same.number)):
        gain = ratio[0]  # the median of the round-by-round ratios: the drift cancelled
    if confirmed is not None:
        clear = confirmed.clearly_faster(fastest.number, same.number)
        noise = "faster in every confirmed round" if clear else "not faster in every round"
    else:
        # One measurement each: clear when their spans of +-1 step-time CV do not overlap.
        low = fastest.result.samples_per_s * (1 - (fastest.result.step_time_cv or 0))
        high = same.result.samples_per_s * (1 + (same.result.step_time_cv or 0))
        clear = low > high
        noise = "clear of both step-time CVs" if clear else "within their step-time CVs"
    versus = (
        f"trial {fastest.number}, which changes the training, is {gain:.2f}x trial {same.number}"
    )
    if clear and gain >= min_gain:
        return fastest, f"{versus} ({noise}), at least math_change_min_gain {min_gain:.2f}"
    below = "" if gain >= min_gain else f" below math_change_min_gain {min_gain:.2f}"
    return same, f"the fastest that keeps the training: {versus}{below} ({noise})"


def hypervolume(points: list[tuple[float, float]], max_memory_gib: float) -> float:
    """Area (samples/s x GiB) dominated by (samples/s up, memory down) points, measured from
    zero throughput and the memory budget: the larger, the better the front."""
    area, best = 0.0, 0.0
    for speed, memory in sorted(points, key=lambda p: p[1]):
        if speed > best and memory < max_memory_gib:
            area += (speed - best) * (max_memory_gib - memory)
            best = speed
    return area
