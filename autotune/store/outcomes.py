"""What a study keeps about its searches as a whole, beside its trials: how the last search
ended (`RunEnd`, and a loop's `Stop`), the model's confidence at the end, and the long runs
that verified its trials (`Verification`)."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from autotune.common.trial import Status
from autotune.common.units import plural

VERIFICATION_PREFIX = "verification:"
"""Study: a trial's settings trained for many steps (`verify.Verification.to_json`), one attr
per trial, keyed by this prefix and its number."""

RUN_END_ATTR = "run_end"
"""Study: the `RunEnd` of its last search; None while a search runs."""


class Ending(enum.StrEnum):
    COMPLETE = "complete"
    """Every trial ran, the grid or the space ran out, or too many proposals repeated."""
    TIMEOUT = "timeout"
    """`timeout=` passed: no trial started after it (a normal end, exit code as complete)."""
    INTERRUPTED = "interrupted"
    """Ctrl-C, SIGTERM or SIGHUP (`interrupts.SearchInterrupted`)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a search loop stopped, in words, and how the search ends for it."""

    reason: str
    ending: Ending = Ending.COMPLETE

    @staticmethod
    def of_all(stops: list[Stop]) -> Stop:
        """Why several loops on one study stopped: their words, each once; a timeout when
        any of them timed out."""
        timed_out = any(s.ending is Ending.TIMEOUT for s in stops)
        return Stop(
            "; ".join(dict.fromkeys(s.reason for s in stops)),
            Ending.TIMEOUT if timed_out else Ending.COMPLETE,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnd:
    """How a search ended, stored in the study when it stopped, so that `autotune report`
    says the same words later and exits with the code the search had."""

    how: Ending
    done: int
    """Trials that count toward n_trials when it stopped."""
    planned: int
    """Its n_trials."""
    signal: str | None = None
    """SIGINT, SIGTERM or SIGHUP when interrupted."""
    stopped: str = ""
    """The search's own words for a complete end (`every grid point has run: 4 trials ...`)."""
    then: str = ""
    """What ran after its loops stopped, however they stopped: a second look
    (`study.second_look`)."""

    def describe(self) -> str:
        """`interrupted after 2 of 6 trials (SIGTERM)`, `stopped by timeout after 2 of 6
        trials`, or why a complete search stopped."""
        if self.how is Ending.INTERRUPTED:
            return f"interrupted after {self.done} of {self.planned} trials ({self.signal})"
        if self.how is Ending.TIMEOUT:
            words = f"stopped by timeout after {self.done} of {self.planned} trials"
        else:
            words = self.stopped or f"{self.done} of {self.planned} trials finished"
        return f"{words}; {self.then}" if self.then else words

    @classmethod
    def of(cls, study: optuna.Study) -> RunEnd | None:
        stored = study.user_attrs.get(RUN_END_ATTR)
        return None if stored is None else cls(**stored | {"how": Ending(stored["how"])})


def store_run_end(study: optuna.Study, end: RunEnd | None) -> None:
    """None when a search starts: a report read meanwhile says nothing of an earlier end."""
    study.set_user_attr(RUN_END_ATTR, None if end is None else asdict(end))


CONFIDENCE_ATTR = "search_confidence"
"""Study: the `SearchConfidence` of its last search's end."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchConfidence:
    """How many settings the search left untried could still beat the fastest trial, by the
    model of the knobs' effects fitted to every trial (`study.model.confidence`): whether
    more trials would pay."""

    trials: int
    """Measured trials the model was fitted to."""
    best_samples_per_s: float
    """The fastest trial within the budget."""
    untried: int
    """Settings of the space not run that would run (no pre-trial check skips them)."""
    could_beat: int
    """Of them, those with a chance of at least `chance` to beat the best by `gain`."""
    upper_samples_per_s: float | None
    """The highest 95% upper bound the model gives an untried setting; None: none is left."""
    gain: float
    chance: float
    sampled: bool = False
    """The space was too large to enumerate: `untried` counts a random sample of it."""
    records_seen: int = 0
    """The study's records when it was worked out: trials recorded since make it stale."""

    def describe(self) -> str:
        if not self.untried:
            return "every setting of the space that fits was tried"
        of = f"{self.could_beat} of {self.untried} untried settings{' sampled' * self.sampled}"
        verdict = "more trials may pay" if self.could_beat else "more trials are unlikely to pay"
        return (
            f"{of} could beat the best by {self.gain:.0%} (a chance of {self.chance:.0%} or "
            f"more each; the model's 95% bound {self.upper_samples_per_s:.1f} samples/s, "
            f"fastest found {self.best_samples_per_s:.1f}): {verdict}"
        )

    @classmethod
    def of(cls, study: optuna.Study) -> SearchConfidence | None:
        stored = study.user_attrs.get(CONFIDENCE_ATTR)
        return None if stored is None else cls(**stored)


def store_confidence(study: optuna.Study, confidence: SearchConfidence | None) -> None:
    study.set_user_attr(CONFIDENCE_ATTR, None if confidence is None else asdict(confidence))


@dataclass(frozen=True, kw_only=True, slots=True)
class Verification:
    """A trial's settings trained for many steps (`autotune verify`, `outputs/verify.py`),
    beside what its short trial measured; stored one study attr per trial."""

    trial: int
    steps: int
    """Optimizer steps trained, warm-up included."""
    status: str
    reason: str
    samples_per_s: float | None
    peak_memory_gib: float | None
    peak_allocated_gib: float | None
    """CUDA: the allocator's peak of live tensors (the peak reserved is `peak_memory_gib`)."""
    step_time_cv: float | None
    searched_samples_per_s: float
    searched_peak_memory_gib: float
    searched_rounds: int = 0
    """The confirmation rounds `searched_samples_per_s` is the median of; 0: the trial's own
    measurement (it was not confirmed)."""
    searched_interval: tuple[float, float] | None = None
    """The lowest and highest confirmation round's samples/s; None: not confirmed (or stored
    before it was kept)."""

    @property
    def agreed(self) -> tuple[float, float]:
        """The samples/s the long run agrees with the search within: the confirmation rounds'
        range, at least `AGREED_WITHIN` of their median either side (rounds that close a
        few steps apart say little of a long run's drift); for an unconfirmed trial (one
        measurement, its noise unknown) its figure within `UNCONFIRMED_BAND`."""
        s = self.searched_samples_per_s
        if self.searched_rounds and self.searched_interval is not None:
            low, high = self.searched_interval
            return min(low, s * (1 - AGREED_WITHIN)), max(high, s * (1 + AGREED_WITHIN))
        band = AGREED_WITHIN if self.searched_rounds else UNCONFIRMED_BAND
        return s * (1 - band), s * (1 + band)

    def verdict(self) -> str:
        """What the long run's samples/s says of the search's figure, and what to do."""
        if self.samples_per_s is None:
            return ""
        low, high = self.agreed
        if self.searched_rounds and self.searched_interval is not None:
            band = f"the confirmed rounds' range widened to {low:.1f}-{high:.1f}"
        elif self.searched_rounds:  # stored before the rounds' range was kept
            band = f"{low:.1f}-{high:.1f}, the confirmed median +-{AGREED_WITHIN:.0%}"
        else:
            band = f"{low:.1f}-{high:.1f}, the trial's one measurement +-{UNCONFIRMED_BAND:.0%}"
        if low <= self.samples_per_s <= high:
            return f"as searched: {self.samples_per_s:.1f} samples/s lies in {band}"
        direction = "faster" if self.samples_per_s > high else "slower"
        return (
            f"not as searched: {self.samples_per_s:.1f} samples/s is {direction} than "
            f"{band}. The machine's load changed between the search and this run, or the "
            "trial's few steps were not representative of a long run (its warm-up, the data, "
            "the allocator). Verify again on a quiet machine; if it stays off, search again "
            "with more measure_steps= and compare the picks by this run's figures"
        )

    @property
    def samples_per_s_ratio(self) -> float | None:
        """The long run's samples/s over the trial's: 1.0 when the short trial told the truth."""
        return _ratio(self.samples_per_s, self.searched_samples_per_s)

    @property
    def peak_memory_ratio(self) -> float | None:
        return _ratio(self.peak_memory_gib, self.searched_peak_memory_gib)

    @property
    def fragmentation(self) -> float | None:
        """CUDA: peak reserved over peak allocated over the whole run (1.0: no cache beyond
        the live tensors); None on CPU."""
        return _ratio(self.peak_memory_gib, self.peak_allocated_gib)

    def describe(self) -> str:
        if self.status != Status.OK.value:
            return f"trial {self.trial} over {self.steps} steps: {self.status} ({self.reason})"
        searched = (
            f"its confirmed median of {plural(self.searched_rounds, 'round')}, "
            f"{self.searched_samples_per_s:.1f}"
            if self.searched_rounds
            else f"the trial's {self.searched_samples_per_s:.1f}"
        )
        text = (
            f"trial {self.trial} over {self.steps} steps: {self.samples_per_s:.1f} samples/s "
            f"({self.samples_per_s_ratio:.2f}x {searched}), "
            f"peak {self.peak_memory_gib:.2f} GiB ({self.peak_memory_ratio:.2f}x the trial's "
            f"{self.searched_peak_memory_gib:.2f})"
        )
        if self.fragmentation is not None:
            text += f", reserved/allocated {self.fragmentation:.2f} over the run"
        return f"{text}; {self.verdict()}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "samples_per_s_ratio": self.samples_per_s_ratio,
            "peak_memory_ratio": self.peak_memory_ratio,
            "fragmentation": self.fragmentation,
        }

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> Verification:
        """From its study attr (the derived ratios stored beside are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        found = {k: v for k, v in stored.items() if k in names}
        if found.get("searched_interval") is not None:
            found["searched_interval"] = tuple(found["searched_interval"])
        return cls(**found)


AGREED_WITHIN = 0.05
"""The least a verify run may land from a confirmed median, either side, and agree with it."""

UNCONFIRMED_BAND = 0.10
"""How far a verify run may land from an unconfirmed trial's one measurement and still agree
with it: no rounds say how noisy that measurement was."""


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference or not math.isfinite(value):
        return None
    return value / reference


def read_verifications(study: optuna.Study) -> dict[int, Verification]:
    """Every trial's verification stored with the study, by trial number."""
    return {
        int(key.removeprefix(VERIFICATION_PREFIX)): Verification.from_json(value)
        for key, value in study.user_attrs.items()
        if key.startswith(VERIFICATION_PREFIX)
    }
