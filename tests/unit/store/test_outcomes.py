"""What a study keeps about its searches as a whole: how a search ended."""

from dataclasses import replace

from autotune.store.outcomes import Ending, RunEnd, Stop


def test_loops_that_stopped_together_say_each_reason_once_and_a_timeout_wins():
    done = Stop("6 of 6 trials finished")
    late = Stop("timeout: 5 of 6 trials finished", Ending.TIMEOUT)
    assert Stop.of_all([done, done]) == done
    assert Stop.of_all([done, late]) == Stop(
        "6 of 6 trials finished; timeout: 5 of 6 trials finished", Ending.TIMEOUT
    )


def test_what_ran_after_the_loops_is_said_however_they_ended():
    look = "trial 1's settings ran again to the end as trial 4, at 310.00 samples/s"
    done = RunEnd(how=Ending.COMPLETE, done=5, planned=4, stopped="4 of 4 trials finished")
    assert done.describe() == "4 of 4 trials finished"
    assert replace(done, then=look).describe() == f"4 of 4 trials finished; {look}"
    timed_out = RunEnd(how=Ending.TIMEOUT, done=5, planned=9, then=look)
    assert timed_out.describe() == f"stopped by timeout after 5 of 9 trials; {look}"
