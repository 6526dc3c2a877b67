"""The executor each worker thread of `workers=N` (simulated trials) runs its trials through."""

import threading

import pytest

from autotune.worker_threads import _Stopped, _UntilStopped


class Broken:
    """An executor whose trials raise (a bug in a performance model, say)."""

    def __init__(self) -> None:
        self.submitted = 0

    def ready(self) -> None:
        pass

    def submit(self, submission):
        self.submitted += 1
        raise RuntimeError("the GPU model broke")


def test_a_trial_that_raises_stops_every_thread_before_its_next_trial():
    # Set as the exception passes, not once it has left the thread: the others would go on
    # taking trials while this thread's loop records the failed one.
    stop, broken = threading.Event(), Broken()
    mine, other = _UntilStopped(broken, stop), _UntilStopped(broken, stop)
    mine.ready()
    with pytest.raises(RuntimeError, match="the GPU model broke"):
        mine.submit(object())
    assert stop.is_set()
    with pytest.raises(_Stopped):
        other.ready()
    assert broken.submitted == 1
