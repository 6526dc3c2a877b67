"""A memory figure said against a limit reads differently from the limit when they differ."""

from __future__ import annotations

from autotune.common.units import GIB, MIB, format_bytes, format_bytes_apart, format_gib


def test_an_oom_reason_shows_enough_digits_that_peak_and_budget_differ() -> None:
    budget = 0.15 * GIB
    peak, limit = format_bytes_apart(budget + 100 * 1024, budget)
    assert peak != limit
    assert (peak, limit) == ("0.1501 GiB", "0.1500 GiB")


def test_figures_far_apart_keep_two_digits() -> None:
    assert format_bytes_apart(3 * GIB, 2 * GIB) == ("3.00 GiB", "2.00 GiB")


def test_figures_one_byte_apart_still_differ() -> None:
    peak, limit = format_bytes_apart(20 * GIB + 1, 20 * GIB)
    assert peak != limit


def test_small_figures_apart_differ_too() -> None:
    peak, limit = format_bytes_apart(5 * MIB + 1024, 5 * MIB)
    assert peak != limit


def test_small_memory_figures_are_written_in_mib():
    assert format_gib(5 / 1024) == "5.0 MiB"
    assert format_bytes(20 * 2**20) == "0.02 GiB"
    assert format_gib(0.0) == "0.0 MiB"
    assert format_gib(1.5) == "1.50 GiB"
    assert format_gib(0.1234, 3) == "0.123 GiB"
