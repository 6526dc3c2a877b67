"""What `autotune verify` says of its long run against the search's figure."""

import dataclasses

from autotune.store.outcomes import Verification


def verification(samples_per_s: float, rounds: int = 3) -> Verification:
    return Verification(
        trial=5,
        steps=200,
        status="ok",
        reason="",
        samples_per_s=samples_per_s,
        peak_memory_gib=1.0,
        peak_allocated_gib=None,
        step_time_cv=0.02,
        searched_samples_per_s=39.3,
        searched_peak_memory_gib=1.0,
        searched_rounds=rounds,
        searched_interval=(36.0, 41.0) if rounds else None,
    )


def test_a_long_run_within_the_confirmed_rounds_is_as_searched():
    said = verification(40.5).describe()
    assert said.endswith(
        "as searched: 40.5 samples/s lies in the confirmed rounds' range widened to 36.0-41.3"
    )


def test_a_long_run_outside_the_confirmed_rounds_is_named_with_its_causes_and_what_to_do():
    said = verification(118.2).describe()  # 3.01x the confirmed median: the probe's case
    assert "(3.01x its confirmed median of 3 rounds, 39.3)" in said
    verdict = said.split("; ", 1)[1]
    assert verdict.startswith("not as searched: 118.2 samples/s is faster than the confirmed")
    assert "load changed between the search and this run" in verdict
    assert "Verify again on a quiet machine" in verdict and "measure_steps=" in verdict
    assert "is slower than" in verification(20.0).verdict()


def test_an_unconfirmed_trial_agrees_within_ten_percent_of_its_one_measurement():
    assert verification(42.0, rounds=0).verdict().startswith("as searched")
    slow = verification(35.0, rounds=0).verdict()
    assert slow.startswith("not as searched: 35.0 samples/s is slower than 35.4-43.2")


def test_the_interval_survives_the_study_s_json():
    stored = verification(40.5).to_json()
    stored["searched_interval"] = list(stored["searched_interval"])  # as JSON gives it back
    assert Verification.from_json(stored) == verification(40.5)
    older = {k: v for k, v in stored.items() if k != "searched_interval"}
    assert Verification.from_json(older) == dataclasses.replace(
        verification(40.5), searched_interval=None
    )
    failed = dataclasses.replace(verification(40.5), status="oom", samples_per_s=None)
    assert failed.verdict() == ""
