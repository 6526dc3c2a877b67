"""What a study keeps about its searches as a whole: how a search ended."""

from autotune.store.outcomes import Ending, Stop


def test_loops_that_stopped_together_say_each_reason_once_and_a_timeout_wins():
    done = Stop("6 of 6 trials finished")
    late = Stop("timeout: 5 of 6 trials finished", Ending.TIMEOUT)
    assert Stop.of_all([done, done]) == done
    assert Stop.of_all([done, late]) == Stop(
        "6 of 6 trials finished; timeout: 5 of 6 trials finished", Ending.TIMEOUT
    )
