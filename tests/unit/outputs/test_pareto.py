"""The picks: a same-training pick beside the fastest, the rule between them, and what a
confirmation (the picks measured again, interleaved) changes."""

from __future__ import annotations

import optuna
import pytest

from autotune.common.trial import Status, TrialResult
from autotune.common.units import GIB
from autotune.outputs.confirm import candidates, order
from autotune.outputs.outcome import _speedup_cell
from autotune.outputs.pareto import Confirmed, pick
from autotune.outputs.snapshot import changes_training_of, read_snapshot
from autotune.plan.run_info import RunInfo
from autotune.store.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    RESULT_ATTR,
    TrialRecord,
    record_of,
    store_run_info,
    tell_result,
)

BUDGET_GIB = 10.0


def SAME(record):
    return False


def study_with(outcomes):
    """outcomes: (samples_per_s, peak_gib) for ok trials, or a Status for the others.
    The first trial is the baseline."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, outcome in enumerate(outcomes):
        trial = study.ask()
        if isinstance(outcome, Status):
            result = TrialResult(status=outcome, reason="x")
        else:
            result = TrialResult(
                status=Status.OK, samples_per_s=outcome[0], peak_memory_gib=outcome[1]
            )
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, BUDGET_GIB, noise_cv=0.1)
    store_run_info(study, info(headroom=0.1))
    return study


def info(headroom):
    return RunInfo(
        study="s",
        model="m",
        model_config={},
        task="t",
        seq_len=8,
        device="cpu",
        device_name="cpu",
        space="cpu",
        space_notes=[],
        effective_batch_size=None,
        memory_budget_bytes=int(BUDGET_GIB * GIB),
        headroom=headroom,
        noise_cv=0.1,
    )


def pareto_front(study):
    return read_snapshot(study).front


def test_front_holds_only_non_dominated_feasible_trials_fastest_first():
    study = study_with([(100, 4.0), (80, 2.0), (90, 5.0), Status.CRASHED, (120, 8.0), (500, 12.0)])
    front = pareto_front(study)
    # trial 2 is slower and bigger than trial 0; trial 5 is over the 10 GiB budget.
    assert [r.number for r in front] == [4, 0, 1]


def test_oom_and_skipped_trials_are_complete_but_infeasible():
    study = study_with([(100, 4.0), Status.OOM, Status.SKIPPED, Status.ERROR])
    states = [t.state for t in study.trials]
    C, F = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL
    assert states == [C, C, C, F]
    assert study.trials[0].constraints["peak_over_budget_gib"] == pytest.approx(-6.0)
    assert study.trials[1].constraints["peak_over_budget_gib"] > 0
    assert study.trials[2].constraints["peak_over_budget_gib"] > 0
    assert [r.number for r in pareto_front(study)] == [0]


def test_picks_fastest_under_the_limit_and_a_memory_saver_within_ten_percent():
    study = study_with([(50, 1.0), (100, 6.0), (95, 3.0), (80, 2.0), (120, 9.5)])
    front = pareto_front(study)
    baseline = record_of(study.trials[0])
    picks = pick(front, limit_gib=9.0, baseline=baseline, noise_cv=0.1, changes_training=SAME)
    assert picks.fastest.number == picks.recommended.number == 1  # 120/s needs 9.5 GiB: over
    assert picks.saver.number == 2  # 95 >= 0.9 x 100, and 3 GiB instead of 6
    assert picks.speedup(picks.fastest) == pytest.approx(2.0)
    nothing = pick(front, limit_gib=0.5, baseline=baseline, noise_cv=0.1, changes_training=SAME)
    assert nothing.fastest is nothing.recommended is None


def test_no_speedup_when_the_baseline_ran_out_of_memory():
    study = study_with([Status.OOM, (100, 2.0)])
    baseline = record_of(study.trials[0])
    picks = pick(
        pareto_front(study), limit_gib=9.0, baseline=baseline, noise_cv=0.1, changes_training=SAME
    )
    assert picks.fastest.number == 1
    assert picks.speedup(picks.fastest) is None


def test_memory_limit_leaves_the_headroom():
    assert info(headroom=0.1).memory_limit_gib == pytest.approx(9.0)
    assert RESULT_ATTR in study_with([(1, 1)]).trials[0].user_attrs


def test_the_snapshot_front_is_optunas_best_trials():
    study = study_with([(100, 4.0), (80, 2.0), (90, 5.0), Status.OOM, (120, 8.0), (80, 2.0)])
    optuna_front = {t.number for t in study.best_trials}
    assert {r.number for r in pareto_front(study)} == optuna_front == {0, 1, 4, 5}


def noisy_study(baseline_cv, fastest_cv):
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (speed, cv) in enumerate(((100, baseline_cv), (150, fastest_cv))):
        trial = study.ask()
        result = TrialResult(
            status=Status.OK, samples_per_s=speed, peak_memory_gib=1.0, step_time_cv=cv
        )
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, BUDGET_GIB, noise_cv=0.1)
    store_run_info(study, info(headroom=0.1))
    return read_snapshot(study)


@pytest.mark.parametrize(
    ("baseline_cv", "fastest_cv", "said"),
    [
        (0.02, 0.03, None),
        (0.02, 0.35, "step CV 35% on it (above"),
        (0.22, 0.03, "step CV 22% on the baseline (above"),
        (0.22, 0.35, "step CV 35% on it and 22% on the baseline"),
    ],
)
def test_a_speedup_resting_on_a_noisy_figure_says_so(baseline_cv, fastest_cv, said):
    snapshot = noisy_study(baseline_cv, fastest_cv)
    line = snapshot.picks.describe(snapshot.picks.fastest)
    assert "1.50x the baseline" in line
    if said is None:
        assert "noisy" not in line
    else:
        assert said in line and "measure_steps" in line
    assert snapshot.is_noisy(snapshot.picks.fastest) == (fastest_cv > 0.1)


BASELINE = {"batch_size": 8, "precision": "fp32", "optim": "adamw_torch"}


def trial(number, speed, *, cv=0.02, memory=1.0, **params):
    result = TrialResult(
        status=Status.OK, samples_per_s=speed, peak_memory_gib=memory, step_time_cv=cv
    )
    return TrialRecord(number=number, params=BASELINE | params, result=result, baseline=number == 0)


THREE = [trial(0, 100), trial(1, 110, attn_implementation="eager"),
         trial(2, 143, precision="bf16")]  # fmt: skip


def picks_of(records, confirmed=None, min_gain=1.10):
    baseline = records[0]
    return pick(
        records,
        9.0,
        baseline,
        0.1,
        changes_training=changes_training_of(baseline),
        min_gain=min_gain,
        confirmed=confirmed,
    )


def test_a_training_change_worth_3_percent_is_not_recommended_over_the_same_training():
    records = [
        trial(0, 100),
        trial(1, 150, attn_implementation="eager", memory=2.0),
        trial(2, 154.5, precision="bf16"),
    ]
    picks = picks_of(records)
    assert picks.fastest.number == 2 and picks.same_training.number == 1
    assert picks.recommended.number == 1
    assert picks.why == (
        "the fastest that keeps the training: trial 2, which changes the training, is 1.03x "
        "trial 1 below math_change_min_gain 1.10 (within their step-time CVs)"
    )


def test_a_training_change_worth_50_percent_clear_of_the_noise_is_recommended():
    records = [
        trial(0, 100),
        trial(1, 150, attn_implementation="eager"),
        trial(2, 225, precision="bf16"),
    ]
    picks = picks_of(records)
    assert picks.recommended.number == 2 and picks.same_training.number == 1
    assert "is 1.50x trial 1 (clear of both step-time CVs)" in picks.why
    changes = changes_training_of(records[0])
    assert changes(picks.recommended) and not changes(picks.same_training)
    # The same gain inside a step-time CV of 40%: not clear of the noise.
    noisy = [records[0], records[1], trial(2, 225, cv=0.4, precision="bf16")]
    assert picks_of(noisy).recommended.number == 1


def confirmation(rounds: dict[int, tuple[float, ...]], records_seen: int = 3) -> Confirmed:
    n = len(next(iter(rounds.values())))
    return Confirmed(
        rounds=n,
        samples_per_s=rounds,
        peak_memory_gib={k: (1.0,) * n for k in rounds},
        wall_s=12.0,
        records_seen=records_seen,
    )


def test_confirmed_figures_are_medians_with_the_range_of_the_rounds():
    c = confirmation({0: (100, 110, 90), 2: (150, 180, 120)})
    assert c.median(2) == 150 and c.interval(2) == (120, 180)
    assert c.ratio(2, 0) == pytest.approx((1.5, 1.33333, 1.63636), rel=1e-4)
    assert c.clearly_faster(2, 0) and not c.tied(2, 0)
    mixed = confirmation({0: (100, 110, 90), 2: (105, 100, 95)})
    assert mixed.tied(2, 0) and mixed.tied(0, 2)
    single = confirmation({0: (100,), 2: (200,)})
    assert not single.clearly_faster(2, 0)  # one round proves nothing about the noise


def test_a_pick_that_won_by_drift_is_not_recommended_once_confirmed_and_ties_are_said():
    # By its own figure trial 2 (bf16) is 1.3x the same-training trial 1; measured again,
    # interleaved, the rounds disagree on which is faster.
    records = THREE
    assert picks_of(records).recommended.number == 2
    confirmed = confirmation({0: (100, 98, 101), 1: (119, 120, 122), 2: (125, 117, 123)})
    picks = picks_of(records, confirmed)
    assert picks.recommended.number == 1 and picks.fastest.number == 2
    assert "not faster in every round" in picks.why
    assert [r.number for r in picks.ties(picks.fastest)] == [1]
    line = picks.describe(picks.fastest)
    assert "confirmed: median of 3 rounds, 117.00-125.00" in line
    assert "1.22x [1.19-1.25] the baseline" in line and "tied with trial 1" in line
    assert picks.speedup(picks.recommended) == pytest.approx(122 / 101)  # median of 3 ratios
    assert picks.speedup_interval(picks.recommended) == pytest.approx((1.19, 1.2245), rel=1e-3)


def test_a_confirmed_gain_beyond_every_round_and_the_minimum_is_recommended():
    records = THREE
    confirmed = confirmation({0: (100, 98, 101), 1: (110, 108, 111), 2: (140, 150, 139)})
    picks = picks_of(records, confirmed)
    assert picks.recommended.number == 2
    assert "1.27x trial 1 (faster in every confirmed round)" in picks.why
    assert picks_of(records, confirmed, min_gain=1.5).recommended.number == 1


def test_a_confirmation_of_other_picks_is_not_used():
    records = THREE
    stale = confirmation({0: (100, 98, 101), 1: (110, 108, 111)})  # trial 2 not measured
    picks = picks_of(records, stale)
    assert picks.confirmed is None and picks.recommended.number == 2


def test_rounds_alternate_their_order_so_a_drift_favours_each_pick_in_turn():
    a, b, c = (trial(n, 100) for n in range(3))
    assert [[r.number for r in order([a, b, c], k)] for k in (1, 2, 3)] == [
        [0, 1, 2],
        [2, 1, 0],
        [0, 1, 2],
    ]


def test_a_baseline_that_beat_every_trial_is_confirmed_against_the_runner_up():
    # Measured once, first, the baseline beat everything: by drift, perhaps. The confirmation
    # measures it against the fastest other trial, and the rounds decide.
    records = [
        trial(0, 120),
        trial(1, 100, batch_size=16),
        trial(2, 90, attn_implementation="eager"),
    ]
    baseline = records[0]
    chosen = candidates(records, 9.0, baseline, changes_training_of(baseline))
    assert [r.number for r in chosen] == [0, 1]
    assert picks_of(records).recommended.number == 0
    confirmed = confirmation({0: (100, 98, 101), 1: (130, 125, 128)})
    picks = picks_of(records, confirmed)
    assert picks.confirmed is confirmed
    assert picks.recommended.number == 1 and "faster in every confirmed round" in picks.why
    assert picks.saver.number == 1, "the baseline is not within 10% of the confirmed pick"
    # Confirmed slower: the baseline stays, and its figure is the confirmed one.
    slower = confirmation({0: (100, 98, 101), 1: (90, 95, 92)})
    picks = picks_of(records, slower)
    assert picks.recommended.number == 0 and picks.samples_per_s(picks.recommended) == 100


def test_a_baseline_far_ahead_is_still_confirmed_against_the_runner_up_under_the_limit():
    # On a busy machine the trials after a quiet baseline measured at 0.05-0.31 of it: however
    # far behind, the fastest other trial under the limit runs again beside the baseline.
    records = [
        trial(0, 120),
        trial(1, 200, memory=10.0, batch_size=64),  # over the 9 GiB limit: not a candidate
        trial(2, 30, precision="bf16"),
        trial(3, 20, attn_implementation="eager"),
    ]
    baseline = records[0]
    chosen = candidates(records, 9.0, baseline, changes_training_of(baseline))
    assert [r.number for r in chosen] == [0, 2]
    alone = [trial(0, 120), trial(1, 200, memory=10.0, batch_size=64)]
    assert [r.number for r in candidates(alone, 9.0, alone[0], changes_training_of(alone[0]))] == [
        0
    ]


def test_a_baseline_that_ran_out_of_memory_is_not_confirmed_nor_compared():
    oom = TrialRecord(
        number=0,
        params=BASELINE,
        baseline=True,
        result=TrialResult(status=Status.OOM, reason="out of memory"),
    )
    feasible = [trial(1, 100, batch_size=4)]  # what `picks_to_confirm` passes: ok, in budget
    assert [r.number for r in candidates(feasible, 9.0, oom, changes_training_of(oom))] == [1]
    assert candidates([], 9.0, oom, changes_training_of(oom)) == []


def test_rounds_of_one_pick_far_apart_are_said_to_be_unsteady():
    steady = confirmation({0: (100, 110, 90), 2: (150, 180, 120)})
    assert steady.unsteady() is None
    apart = confirmation({0: (100, 110, 90), 5: (31.0, 5.65, 40.0)})  # 7.1x: the probe's case
    said = apart.unsteady()
    assert said.startswith(
        "the confirmation's rounds disagree: highest over lowest round trial 5's 7.1x (5.65-40.00)"
    )
    assert "trial 0" not in said and "confirm again on a quiet machine" in said


def test_one_speedup_a_trial_the_confirmed_one_where_the_rounds_measured_it():
    """A trial's own figure and its confirmed one are never two speedups side by side: the
    confirmed where it exists, else the trial's own, marked as one short trial's."""
    records = [*THREE, trial(3, 104, memory=0.5, optim="adafactor")]  # not a pick
    unconfirmed = picks_of(records)
    assert unconfirmed.speedup_note(records[2]) == "1.43x the baseline in one short trial"
    assert "1.43x the baseline in one short trial" in unconfirmed.describe(records[2])
    rounds = {0: (100, 98, 101), 1: (110, 108, 111), 2: (120, 119, 122)}
    confirmed = picks_of(records, confirmation(rounds, records_seen=4))
    assert confirmed.is_confirmed(records[2]) and not confirmed.is_confirmed(records[3])
    assert confirmed.speedup_note(records[2]) == (
        "one short trial; confirmed 1.21x [1.20-1.21] the baseline"
    )
    assert "1.43x" not in confirmed.describe(records[2])
    # Trial 3 was not measured again: its own figure, marked, in the line and the table.
    assert confirmed.speedup_note(records[3]) == "1.04x the baseline in one short trial"
    assert _speedup_cell(confirmed, records[3]) == "1.04x (1 trial)"
    assert _speedup_cell(confirmed, records[2]) == "1.21x [1.20-1.21]"
    assert _speedup_cell(confirmed, records[0]) == "1.00x"
    assert _speedup_cell(unconfirmed, records[3]) == "1.04x"  # every figure is one trial's


def test_a_trial_far_slower_for_a_few_kib_less_is_no_memory_saver():
    """Peaks within 1% are the same memory (a CPU's resident memory varies by MiBs between
    runs of one setting): a 3x slower trial stays off the front for 0.3 MiB less."""
    study = study_with([(100, 0.5), (33, 0.5 - 0.3 / 1024), (40, 0.25)])
    assert [r.number for r in pareto_front(study)] == [0, 2]
    far = study_with([(100, 0.5), (33, 0.48)])  # 4% less: a real saving, on the front
    assert [r.number for r in pareto_front(far)] == [0, 1]


def test_the_picks_are_ranked_by_the_speedup_they_show_when_the_load_drifts():
    """Rounds under a changing load: trial 1 (bf16) was 2.12x, 1.72x and 0.48x the baseline
    round by round (its speedup: 1.72x), yet its median (43.27) is under the baseline's
    (72.68). Ranked by medians the baseline was `fastest` beside trial 1's 1.72x."""
    records = [trial(0, 63.74), trial(1, 126.59, precision="bf16")]
    confirmed = confirmation({0: (12.64, 72.68, 89.52), 1: (26.83, 124.99, 43.27)})
    picks = picks_of(records, confirmed)
    assert picks.fastest.number == 1
    assert picks.speedup(picks.fastest) == pytest.approx(124.99 / 72.68)
    # Not faster in every round: the same training stays recommended, and says why.
    assert picks.recommended.number == 0
    assert "trial 1, which changes the training, is 1.72x trial 0 (not faster in every" in (
        picks.why
    )
