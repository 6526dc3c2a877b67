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


def baseline(step_time_cv: float):
    from autotune.common.trial import Status, TrialResult
    from autotune.store.records import TrialRecord

    result = TrialResult(
        status=Status.OK, samples_per_s=23.0, wall_s=14.0, step_time_cv=step_time_cv
    )
    params = {"batch_size": 8, "grad_accum": 1}
    return TrialRecord(number=0, params=params, result=result, baseline=True)


def ended(view: TerminalView, record) -> list[str]:
    lines: list[str] = []
    view.report.line = lambda markup, **_: lines.append(markup)  # type: ignore[method-assign]
    view.task = view.bar.add_task("trials", total=view.total, completed=0, best="", eta="")
    view.trial_ended(record)
    return lines


def test_an_unsteady_baseline_s_pace_is_not_extrapolated_and_the_eta_waits():
    view = TerminalView(quiet=False)
    view.total, view.steps = 20, 13
    _, pace = ended(view, baseline(step_time_cv=1.07))  # the quick start's slow spell
    assert "the baseline took 14.0 s, but its steps varied by 107% (step CV)" in pace
    assert "no measure of the 19 remaining trials' time" in pace and "take about" not in pace
    assert view.bar.tasks[0].fields["eta"] == "ETA after the next trial"

    steady = TerminalView(quiet=False)
    steady.total, steady.steps = 20, 13
    _, pace = ended(steady, baseline(step_time_cv=0.03))
    assert "the 19 remaining trials (the space's median batch" in pace
    assert steady.bar.tasks[0].fields["eta"].startswith("ETA ")


def test_the_trials_left_are_never_more_than_the_space_holds():
    view = TerminalView(quiet=False)
    view.total, view.steps, view.space_settings = 1_000_000_000, 13, 16
    _, pace = ended(view, baseline(step_time_cv=0.03))
    assert "the 15 remaining trials" in pace
    assert view._left(16) == 0 and view._left(20) == 0
