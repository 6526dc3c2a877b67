"""A replayed search scored against its simulated clock: a trial counts from the moment it ends,
one out of memory costs time and finds nothing, and a search that never comes near the optimum
says so; on a landscape measured afresh each replay, the pick is the fastest measurement, scored
at its point's noise-free figure. A landscape measured in several passes keeps each point's
mean."""

from __future__ import annotations

import pytest

from autotune.replay import Landscape, LandscapeAnswers, Trial, on_clock
from tests import benchmark_scripts

OPTIMUM = 100.0


def test_a_trial_counts_from_the_moment_it_ends_and_an_oom_only_moves_the_clock_on():
    trials = [
        Trial("ok", 50.0, 10.0),  # the baseline: ends at 10 s, on the 10 s mark
        Trial("oom", None, 30.0),  # ends at 40 s, finds nothing
        Trial("ok", 80.0, 20.0),  # ends at 60 s: crosses the 50 s mark
        Trial("ok", 99.0, 5.0),  # ends at 65 s, within 2%
        Trial("ok", 70.0, 5.0),  # slower: the best stays
    ]
    score = on_clock(trials, OPTIMUM, marks_s=[5.0, 10.0, 50.0, 60.0, 100.0], within=0.98)
    assert score.found == pytest.approx((0.0, 0.5, 0.5, 0.8, 0.99))
    assert score.within_s == pytest.approx(65.0)


def test_a_search_that_never_comes_within_2pct_says_never():
    trials = [Trial("ok", 50.0, 10.0), Trial("oom", None, 5.0), Trial("ok", 97.0, 10.0)]
    score = on_clock(trials, OPTIMUM, marks_s=[20.0, 1000.0], within=0.98)
    assert score.found == pytest.approx((0.5, 0.97)), "the last trial ends at 25 s"
    assert score.within_s is None


def test_trials_without_a_recorded_cost_have_no_clock():
    trials = [Trial("ok", 50.0, 10.0), Trial("ok", 60.0, None)]
    assert on_clock(trials, OPTIMUM, marks_s=[20.0], within=0.98) is None


def test_the_pick_is_the_fastest_measurement_and_it_is_worth_its_point_s_true_figure():
    trials = [
        Trial("ok", 90.0, 10.0, 90.0),  # ends at 10 s: measured as it is
        Trial("ok", 97.0, 10.0, 85.0),  # ends at 20 s: a lucky measurement of a slower point
        Trial("ok", 96.0, 10.0, 99.0),  # ends at 30 s: the better point, measured unluckily
        Trial("ok", 99.5, 10.0, 99.0),  # ends at 40 s: measured again near its figure
    ]
    score = on_clock(trials, OPTIMUM, marks_s=[10.0, 20.0, 30.0, 40.0], within=0.98)
    assert score.found == pytest.approx((0.90, 0.85, 0.85, 0.99)), "the pick got worse at 20 s"
    assert score.within_s == pytest.approx(40.0), "not at 30 s: the search did not pick it"


def _landscape(sigma):
    def answer(params):
        speed = 100.0 * params["batch_size"]
        return {"status": "ok", "samples_per_s": speed, "tokens_per_s": speed * 32}

    return Landscape(
        name="l", model="m", seq_len=32, device="cuda", device_name="GPU",
        memory_budget_gib=80.0, knobs={}, answer=answer, remeasure_sigma=sigma,
    )  # fmt: skip


def test_each_seed_measures_the_points_afresh_and_again_the_same_on_a_rerun():
    noisy = _landscape(0.01)
    settings = [{"batch_size": b} for b in (8, 16, 32, 64)]

    def measured(seed):
        return [LandscapeAnswers(noisy, seed).measured(p)["samples_per_s"] for p in settings]

    truth = [100.0 * s["batch_size"] for s in settings]
    assert measured(1) == measured(1), "a replay is repeatable"
    assert measured(1) != measured(2) and measured(1) != truth
    for seed in (1, 2):
        ratios = [m / t for m, t in zip(measured(seed), truth, strict=True)]
        assert all(0.95 < r < 1.05 for r in ratios), "1% noise, within 5 sigma"
    point = LandscapeAnswers(noisy, 3).measured({"batch_size": 8})
    assert point["true_samples_per_s"] == 800.0
    assert point["tokens_per_s"] == pytest.approx(point["samples_per_s"] * 32)
    recorded = LandscapeAnswers(_landscape(0.0), 3).measured({"batch_size": 8})
    assert recorded["samples_per_s"] == 800.0, "a recorded landscape's points are the measurements"


def _point(number, batch, status, speed, peak, wall):
    figures = dict.fromkeys(("tokens_per_s", "step_time_cv", "step_time_median_ms"), speed)
    return {
        "number": number,
        "params": {"batch_size": batch},
        "status": status,
        "samples_per_s": speed,
        "peak_memory_gib": peak,
        "wall_s": wall,
        "estimate_gib": 1.0,
        "reason": "" if status == "ok" else "over the budget",
        **figures,
    }


def test_a_landscape_recorded_in_two_passes_keeps_each_point_s_mean_and_any_failure():
    record = benchmark_scripts.load("landscapes/record.py")
    first = [_point(0, 8, "ok", 100.0, 1.0, 2.0), _point(1, 64, "ok", 300.0, 3.0, 6.0)]
    second = [_point(0, 64, "oom", None, 9.0, 1.0), _point(1, 8, "ok", 120.0, 1.5, 4.0)]
    small, large = record.merge([first, second])  # the passes' own orders differ
    assert small["samples_per_s"] == pytest.approx(110.0) and small["wall_s"] == pytest.approx(3.0)
    assert small["peak_memory_gib"] == 1.5, "the higher peak"
    assert [p["samples_per_s"] for p in small["passes"]] == [100.0, 120.0]
    assert large["status"] == "oom" and large["samples_per_s"] is None, "a pass that failed"
    assert [p["status"] for p in large["passes"]] == ["ok", "oom"]


def test_landscapes_recorded_once_each_combine_into_the_landscape_of_their_passes():
    record = benchmark_scripts.load("landscapes/record.py")

    def landscape(name, points, recorded, **changes):
        return {
            "name": name,
            "command": f"python benchmarks/landscapes/record.py {name}",
            "recorded": recorded,
            "model": "m",
            "task": "t",
            "seq_len": 32,
            "device": "cpu",
            "memory_budget_gib": 8.0,
            "machine": "AMD EPYC",
            "space": {"batch_size": {"choices": [8, 64]}},
            "settings": {"sampler": "grid"},
            "points": points,
            **changes,
        }

    first = landscape("a", [_point(0, 8, "ok", 100.0, 1.0, 2.0)], "2026-11-26")
    later = landscape("a-rerun", [_point(0, 8, "ok", 80.0, 1.2, 4.0)], "2026-11-27")
    combined = record.combine([first, later])
    assert combined["name"] == "a" and combined["settings"]["passes"] == 2
    assert combined["recorded"] == "2026-11-26, 2026-11-27" and len(combined["command"]) == 2
    (point,) = combined["points"]
    assert point["samples_per_s"] == pytest.approx(90.0) and point["peak_memory_gib"] == 1.2
    assert [p["samples_per_s"] for p in point["passes"]] == [100.0, 80.0]
    elsewhere = landscape("b", later["points"], "2026-11-27", machine="Intel Xeon", seq_len=64)
    with pytest.raises(ValueError, match="machine 'Intel Xeon', not 'AMD EPYC'") as refused:
        record.combine([first, elsewhere])
    assert "seq_len 64, not 32" in str(refused.value)
    with pytest.raises(ValueError, match="recorded in 2 passes"):
        record.combine([first, combined])
