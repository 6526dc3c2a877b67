"""A replayed search scored against its simulated clock: a trial counts from the moment it ends,
one out of memory costs time and finds nothing, and a search that never comes near the optimum
says so."""

from __future__ import annotations

import pytest

from autotune.replay import Trial, on_clock

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
