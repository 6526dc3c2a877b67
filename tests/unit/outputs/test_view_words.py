"""The terminal's lines in their command's words: a search's key for a search, the command's
own for `autotune confirm`, and counts with their nouns."""

from autotune.common.units import plural
from autotune.outputs.view import TerminalView


def said(view: TerminalView) -> list[str]:
    lines: list[str] = []
    view.report.line = lambda markup, **_: lines.append(markup)  # type: ignore[method-assign]
    view.confirming(picks=2, rounds=1, expected_s=30.0)
    return lines


def test_autotune_confirm_names_its_own_setting_and_counts_one_round():
    (line,) = said(TerminalView(quiet=False))
    assert "run again, 1 round interleaved: 2 runs, about 30 s (rounds= sets how many)" in line
    assert "confirm_rounds" not in line and "1 rounds" not in line


def test_a_search_names_its_key():
    view = TerminalView(quiet=False)
    view.searching = True  # as `planned` sets it
    (line,) = said(view)
    assert line.endswith("(confirm_rounds=0 skips this)")


def test_plural():
    assert (plural(1, "round"), plural(0, "run"), plural(3, "time")) == (
        "1 round",
        "0 runs",
        "3 times",
    )
