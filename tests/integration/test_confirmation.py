"""Confirmation against a machine that drifts: fake workers measure every setting at the same
true speed on a machine 10% faster with each run, so whatever the search ran last looks
fastest. Measured again, interleaved in alternating order, the picks are tied with the
baseline; the drift winner, which changes the training, is not recommended."""

from __future__ import annotations

import json

import pytest

import autotune
from autotune import cli
from autotune.outputs.confirm import picks_to_confirm
from tests.conftest import TINY_MODEL, fake_executor

SPACE = """
description: batch sizes only
device: any
knobs:
  batch_size: {choices: [16, 32, 64]}
  precision: fp32
  gradient_checkpointing: false
"""


@pytest.fixture(scope="module")
def drifted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("drift")
    (folder / "space.yaml").write_text(SPACE)
    result = autotune.search(
        model=TINY_MODEL,
        seq_len=32,
        n_trials=4,
        sampler="grid",
        out=folder / "reports",
        study="drift",
        space=str(folder / "space.yaml"),
        quiet=True,
        executor=fake_executor(f"drift:{folder}:0.1"),
    )
    return result, folder


def test_the_drift_winner_is_tied_with_the_baseline_and_not_recommended(drifted):
    result, _ = drifted
    picks = result.snapshot.picks
    # By their own figures: 100, 110, 120, 130 samples/s in the order they ran.
    by_search = {r.number: r.result.samples_per_s for r in result.snapshot.records}
    assert sorted(by_search.values()) == pytest.approx([100, 110, 120, 130])
    confirmed = picks.confirmed
    assert confirmed is not None and confirmed.rounds == 3
    winner = max(result.snapshot.records, key=lambda r: r.result.samples_per_s)
    assert winner.result.samples_per_s == pytest.approx(130)  # 1.3x the baseline, by drift
    assert confirmed.covers(winner) and confirmed.tied(winner.number, picks.baseline.number)
    # The true speedup, 1.0, lies within the confirmed interval; the search's 1.3 does not.
    low, high = confirmed.ratio(winner.number, picks.baseline.number)[1:]
    assert low < 1.0 < high < 1.3
    # Unconfirmed, the drift winner (another batch: it changes the training) would be it.
    assert picks.recommended.number == picks.baseline.number == picks.same_training.number
    assert result.recommended.number == picks.baseline.number


def test_the_confirmation_is_stored_shown_and_exported(drifted):
    result, _folder = drifted
    recommended = json.loads((result.study_dir / "recommended.json").read_text())
    confirmation = recommended["confirmation"]
    assert confirmation["rounds"] == 3 and confirmation["wall_s"] > 0
    trials = confirmation["trials"]
    records = result.snapshot.records
    winner = max(records, key=lambda r: r.result.samples_per_s).number
    # The baseline and the picks by their own figures; the memory saver is chosen again among
    # them once their confirmed figures are in.
    measured_again = {str(r.number) for r in picks_to_confirm(result.snapshot)}
    assert set(trials) == measured_again and {"0", str(winner)} <= measured_again
    assert str(result.snapshot.picks.saver.number) in trials
    assert all(len(t["samples_per_s"]) == 3 for t in trials.values())
    assert "keeps the training" in recommended["why"]
    assert recommended["same_training"]["trial"] == 0
    assert recommended["speedup_interval"] == [1.0, 1.0]  # the baseline against itself
    log = (result.study_dir / "search.log").read_text()
    assert "confirming: the baseline and the picks" in log and "[confirm 1/" in log
    # Read back from the storage alone, as `autotune report` does, the figures are the same.
    again = autotune.load(result.study_dir)
    assert again.snapshot.picks.confirmed == result.snapshot.picks.confirmed


def test_autotune_confirm_measures_a_study_again(drifted, capsys):
    result, folder = drifted
    before = result.snapshot.picks.confirmed
    code = cli.main(
        ["confirm", str(result.study_dir), "rounds=2"],
        executor=fake_executor(f"drift:{folder}:0.1"),
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "[confirm 1/" in out and "confirmed: the baseline and the picks ran again 2 times" in out
    after = autotune.load(result.study_dir).snapshot.picks.confirmed
    assert after.rounds == 2 and after != before


def test_a_finished_search_run_again_runs_nothing_and_keeps_its_confirmation(tmp_path, capsys):
    argv = [
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "n_trials=2",
        "confirm_rounds=1",
        f"out={tmp_path}",
        "study=done",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 0
    confirmed = autotune.load(tmp_path / "done").snapshot.picks.confirmed
    assert confirmed is not None
    capsys.readouterr()
    assert cli.main(argv, executor=fake_executor("ok")) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing to run: study=done has 2 trials finished and no new one ran here" in out
    assert f"`autotune confirm {tmp_path / 'done'}` measures its picks again" in out
    assert "[confirm" not in out
    assert autotune.load(tmp_path / "done").snapshot.picks.confirmed == confirmed


def test_a_renamed_study_folder_is_confirmed_and_verified_where_it_is(tmp_path, capsys):
    """`verify` and `confirm` on a copied or renamed study folder used the folder the study
    was made in (`out/STUDY_NAME`), a path the user never gave."""
    import shutil

    argv = [
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "n_trials=2",
        "confirm_rounds=0",
        f"out={tmp_path}",
        "study=made",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 0
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "made", moved)
    capsys.readouterr()
    assert cli.main(["confirm", str(moved), "rounds=1"], executor=fake_executor("ok")) == 0
    assert cli.main(["verify", str(moved), "steps=4"], executor=fake_executor("ok")) == 0
    out = capsys.readouterr().out
    assert "made/" not in out.replace(str(moved), "MOVED") and not (tmp_path / "made").exists()
    assert (moved / "confirm").is_dir() and (moved / "verify").is_dir()
    # Bounded: an absurd run is refused before it could replace a stored figure.
    assert cli.main(["verify", str(moved), "steps=1000000"]) == 2
    assert cli.main(["confirm", str(moved), "rounds=1000"]) == 2


def test_a_study_with_nothing_to_compare_does_not_ask_for_a_confirmation(tmp_path, capsys):
    argv = [
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "n_trials=1",
        "confirm_rounds=0",
        f"out={tmp_path}",
        "study=one",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not confirmed: a single trial measured ok, nothing to compare it with" in out
    assert "autotune confirm STUDY_DIR" not in out


def test_measured_and_confirmed_figures_each_have_columns_and_marks_of_their_own(drifted, capsys):
    """The front table's samples/s is each trial's own measurement and the confirmed medians
    have a column of their own; a trial has one speedup, the confirmed one where the rounds
    measured it, else its own marked as one trial's; on the chart the picks' marks stand at
    their confirmed medians."""
    from autotune.outputs.report.data import build_report_data
    from autotune.outputs.report.figures import pareto_figure

    result, _ = drifted
    capsys.readouterr()
    assert cli.main(["report", str(result.study_dir)]) in (0, 3)
    out = capsys.readouterr().out
    assert "confirmed samples/s" in out and "confirmed x baseline" not in out
    flat = " ".join(out.split())
    assert "samples/s: each trial's own short measurement; confirmed samples/s" in flat
    assert "else its own trial's (1 trial)" in flat
    found = flat.split("found: best ", 1)[1].split(" by trial")[0]
    assert found.endswith(("the baseline in one short trial)", "the baseline)")), found
    snapshot = autotune.load(result.study_dir).snapshot
    confirmed = snapshot.picks.confirmed
    data = build_report_data(snapshot)
    marked = {p.number: p.confirmed for p in data.points if p.confirmed is not None}
    assert marked and all(m[0] == confirmed.median(n) for n, m in marked.items())
    traces = {trace.name: trace for trace in pareto_figure(data).data}
    assert "confirmed: median [lowest-highest round]" in traces
    recommended = snapshot.picks.recommended
    if snapshot.picks.is_confirmed(recommended):
        assert list(traces["recommended"].y) == [confirmed.median(recommended.number)]
