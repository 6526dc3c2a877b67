"""sampler=grid through the command line, with a stand-in worker."""

import csv

from autotune import cli
from tests.conftest import TINY_MODEL, fake_executor

TWO_POINT_SPACE = """
description: a grid of two points
device: any
knobs:
  batch_size: {choices: [8, 16]}
  precision: fp32
  optim: sgd
"""


def test_a_grid_search_runs_every_point_then_stops(tmp_path, capsys):
    launcher = fake_executor("ok")
    space = tmp_path / "two.yaml"
    space.write_text(TWO_POINT_SPACE)
    args = [
        f"model={TINY_MODEL}",
        "seq_len=32",
        "sampler=grid",
        "n_trials=6",
        "confirm_rounds=0",
        f"space={space}",
        f"out={tmp_path}",
        "study=g",
    ]
    assert cli.main(["search", *args], executor=launcher) == 0
    assert "search ended: every grid point has run: 3 trials finished" in capsys.readouterr().out
    with open(tmp_path / "g" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    # The baseline takes no grid point: both points run after it, once each.
    assert [r["baseline"] for r in rows] == ["True", "False", "False"]
    assert sorted(int(r["batch_size"]) for r in rows[1:]) == [8, 16]
    assert cli.main(["search", *args], executor=launcher) == 0  # resumed: nothing is left to run
    assert "every grid point has run: 3 trials finished" in capsys.readouterr().out
