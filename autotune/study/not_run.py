"""Proposals that must not run: asked for by two processes at once (a second baseline, a
second retry of one interrupted trial), past `n_trials` for the whole study, or settings
another process is running. Several processes share a study; each reads every trial first."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.store.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    REFERENCE_ATTR,
    RETRY_OF_ATTR,
    SECOND_LOOK_ATTR,
    counts_toward_n_trials,
)
from autotune.study import checks


@dataclasses.dataclass(frozen=True)
class NotRun:
    """Why a proposal does not run; `same_as_running`: another process runs its settings."""

    reason: str
    same_as_running: bool = False


def not_to_run(
    trial: optuna.Trial, params: dict[str, Any], n_trials: int, trials: list[FrozenTrial]
) -> NotRun | None:
    """Why a trial just asked for must not run, looking at every process's `trials` (read
    after this one's settings were published): a second baseline or
    a second retry of the same interrupted trial (queued by two processes at once), one more
    than `n_trials` (trials asked for earlier go first: their numbers are smaller; a second
    look is over it by design), or settings another process is running."""
    queued_as = _queued_as(trial)
    if queued_as is not None:
        for other in trials[: trial.number]:
            if _queued_as(other) == queued_as:
                return NotRun(f"trial {other.number} was queued for the same: {queued_as}")
    ahead = sum(
        counts_toward_n_trials(t)
        or (
            t.state is TrialState.RUNNING
            and t.number < trial.number
            and SECOND_LOOK_ATTR not in t.user_attrs
        )
        for t in trials
    )
    # A second look runs one trial over n_trials, in whichever process took it.
    if ahead >= n_trials and SECOND_LOOK_ATTR not in trial.user_attrs:
        return NotRun(f"n_trials={n_trials} were finished or running when it was asked for")
    key = checks.settings_key(params)
    for other in trials:
        theirs = other.user_attrs.get(PARAMS_ATTR)
        if (
            other.state is TrialState.RUNNING
            and other.number != trial.number
            and theirs is not None
            and checks.settings_key(theirs) == key
        ):
            if (
                queued_as is not None
                and other.number > trial.number
                and (_queued_as(other) == queued_as)
            ):
                # A later copy of this queued trial (two processes queued it at once): it
                # steps aside for this one above; stepping aside here too would run neither.
                continue
            return NotRun(f"trial {other.number} was running these settings", True)
    return None


def _queued_as(trial: FrozenTrial | optuna.Trial) -> str | None:
    """What a trial was queued for: the baseline, another run of an interrupted trial, or a
    second look at a stopped one."""
    retry_of = trial.user_attrs.get(RETRY_OF_ATTR)
    if retry_of is not None:
        return f"trial {retry_of}'s settings again"
    looked_at = trial.user_attrs.get(SECOND_LOOK_ATTR)
    if looked_at is not None:
        return f"a second look at trial {looked_at}"
    if trial.user_attrs.get(REFERENCE_ATTR):
        return "the reference"
    return "the baseline" if trial.user_attrs.get(BASELINE_ATTR) else None
