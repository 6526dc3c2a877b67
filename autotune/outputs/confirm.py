"""Confirmation: the picks measured again, interleaved, before a speedup is printed.

Each trial of a search is one short measurement on a machine whose load drifts: a pick can win
by drift alone, and the baseline was measured once, at the start. After the search, the
baseline, the fastest, the memory saver and the same-training pick (`candidates`) run
again in `rounds` rounds, A B C D, D C B A, A B C D, ..., each run a fresh trial process with
the trial's own warm-up, as a search trial runs. Within a round the picks ran back to back, so
their round-by-round ratios cancel the drift; the figures are the medians over the rounds and
the intervals their lowest and highest (`pareto.Confirmed`). Stored with the study, so
`autotune report` shows the same, and `autotune confirm` runs it again on any study.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import optuna

from autotune.common.layout import CONFIRM
from autotune.common.trial import Status, TrialResult
from autotune.execute.base import TrialExecutor
from autotune.outputs.pareto import Confirmed, pick
from autotune.outputs.snapshot import StudySnapshot, changes_training_of
from autotune.plan.plan import SearchPlan
from autotune.store.records import CONFIRMATION_ATTR, TrialRecord
from autotune.study.launch import launch
from autotune.study.observer import SearchObserver


def picks_to_confirm(snapshot: StudySnapshot) -> list[TrialRecord]:
    """The baseline and the picks, each once; none when there is nothing to compare (a
    single successful trial)."""
    feasible = [r for r in snapshot.records if r.result.feasible(snapshot.info.memory_budget_gib)]
    baseline = snapshot.picks.baseline
    chosen = candidates(
        feasible, snapshot.info.memory_limit_gib, baseline, changes_training_of(baseline)
    )
    reference = snapshot.picks.reference
    if reference is not None and reference.status is Status.OK and not baseline_measured(baseline):
        # The yardstick where the defaults did not fit: it is measured again with the picks.
        chosen = sorted(
            {r.number: r for r in (*chosen, reference)}.values(), key=lambda r: r.number
        )
    return chosen if len(chosen) > 1 else []


def baseline_measured(baseline: TrialRecord | None) -> bool:
    return baseline is not None and baseline.status is Status.OK


def candidates(
    feasible: list[TrialRecord],
    limit_gib: float,
    baseline: TrialRecord | None,
    changes_training: Callable[[TrialRecord], bool],
) -> list[TrialRecord]:
    """The trials a confirmation measures again: the baseline, the fastest, the memory saver
    and the same-training pick by their own figures, each once, in trial order. When all of
    them are the baseline (its one measurement, taken first, beat every other trial's), the
    runner-up under the limit runs too, however far behind it measured: the baseline may have
    won by drift alone. On a busy machine the trials after a quiet baseline measured at
    0.05-0.31 of it (step CVs of 60-150%); without a second look the search would recommend the
    defaults at 1.0x. Where the baseline is truly faster, the rounds say so at the cost of
    `rounds` runs of the baseline and of the runner-up."""
    single = pick(
        feasible, limit_gib, baseline, noise_cv=float("inf"), changes_training=changes_training
    )
    chosen = {
        r.number: r
        for r in (single.baseline, single.fastest, single.saver, single.same_training)
        if r is not None
    }
    if baseline is not None and baseline.status is Status.OK and set(chosen) == {baseline.number}:
        fits = [r for r in feasible if r.result.peak_memory_gib <= limit_gib]
        others = [r for r in fits if r.number != baseline.number]
        runner_up = max(others, key=lambda r: r.result.samples_per_s, default=None)
        if runner_up is not None:
            chosen[runner_up.number] = runner_up
    return [chosen[n] for n in sorted(chosen) if chosen[n].status is Status.OK]


def confirm(
    plan: SearchPlan,
    study: optuna.Study,
    snapshot: StudySnapshot,
    rounds: int,
    *,
    executor: TrialExecutor,
    observer: SearchObserver | None = None,
) -> Confirmed | None:
    """Run the picks `rounds` times, interleaved, store the figures with the study and return
    them; None when there is nothing to confirm. Run under the slot the trials had (its cores:
    the same measurement conditions)."""
    picks = picks_to_confirm(snapshot)
    if rounds < 1 or not picks:
        return None
    observer = observer or SearchObserver()
    expected_s = rounds * sum(r.result.wall_s or 0.0 for r in picks)
    observer.confirming(len(picks), rounds, expected_s)
    started = time.perf_counter()
    results: dict[int, list[TrialResult]] = {r.number: [] for r in picks}
    for round_number in range(1, rounds + 1):
        for record in order(picks, round_number):
            run = run_once(plan, record, round_number, executor, observer)
            results[record.number].append(run)
            observer.confirmed_run(round_number, record, run)
    confirmed = Confirmed(
        rounds=rounds,
        samples_per_s={
            n: tuple(_figure(r, "samples_per_s") for r in runs) for n, runs in results.items()
        },
        peak_memory_gib={
            n: tuple(_figure(r, "peak_memory_gib") for r in runs) for n, runs in results.items()
        },
        # The rounds run one after another: at least their trials' own times, which is what
        # an executor that answers elsewhere (the twin's, at once) says they took.
        wall_s=max(
            time.perf_counter() - started,
            sum(r.wall_s or 0.0 for runs in results.values() for r in runs),
        ),
        # Measured records, as `read_snapshot` counts them: an interrupted trial is no new pick.
        records_seen=sum(r.status is not Status.INTERRUPTED for r in snapshot.records),
    )
    study.set_user_attr(CONFIRMATION_ATTR, confirmed.to_json())
    return confirmed


def order(picks: list[TrialRecord], round_number: int) -> list[TrialRecord]:
    """A B C D in odd rounds, D C B A in even ones: a drift that favours whoever runs later
    favours each pick in turn, so the round-by-round ratios straddle the true one."""
    return picks if round_number % 2 else picks[::-1]


def run_once(
    plan: SearchPlan,
    record: TrialRecord,
    round_number: int,
    executor: TrialExecutor,
    observer: SearchObserver,
) -> TrialResult:
    folder = plan.study_dir / CONFIRM / f"r{round_number}-t{record.number:04d}"
    on_progress = functools.partial(observer.progress, record.number)
    return launch(plan, record.number, record.params, executor, on_progress, folder=folder)


def _figure(result: TrialResult, name: str) -> float | None:
    return getattr(result, name) if result.status is Status.OK else None
