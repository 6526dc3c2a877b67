"""Stop signals while a search runs (autotune.study.interrupts), sent to this process itself."""

import os
import signal

import pytest

from autotune.study.interrupts import SearchInterrupted, stop_signals


def test_sigterm_during_a_search_raises_an_interrupt_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SearchInterrupted) as raised, stop_signals():
        os.kill(os.getpid(), signal.SIGTERM)
    assert isinstance(raised.value, KeyboardInterrupt)
    assert raised.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_while_the_outputs_are_written_stops_the_search_after_them():
    written = []
    with pytest.raises(SearchInterrupted) as raised, stop_signals() as signals:
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one is not a second interrupt
            written.append("report.html")
    assert written == ["report.html"]
    assert raised.value.exit_code == 129
