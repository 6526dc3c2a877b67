"""Every fault a trial can meet, in one search: each gets its status, the search goes on."""

import csv

import pytest

from autotune import cli
from tests.conftest import TINY_MODEL, fake_executor

EXPECTED = {
    "ok": ("ok", ""),
    "raise": ("crashed", "worker exited with code 1 and no result"),
    "error": ("error", "ValueError: bad things"),
    "nan": ("nan_loss", "training loss is nan"),
    "zero": ("error", "only 0 of 10 measured steps ran"),
    "exit3": ("crashed", "worker exited with code 3 and no result"),
    "segfault": ("crashed", "worker killed by SIGSEGV"),
    "sigkill": ("crashed", "worker killed by SIGKILL from outside the search"),
    "sleep": ("timeout", "no result before trial_timeout"),
    "garbage": ("crashed", "unreadable result file"),
    "alloc": ("oom", "exceeded memory_budget"),
}


@pytest.fixture
def launcher(tmp_path):
    return fake_executor(f"sequence:{tmp_path}:{','.join(EXPECTED)}")


def test_each_fault_is_named_and_the_search_continues(launcher, tmp_path, capsys):
    out = tmp_path / "reports"
    code = cli.main(
        [
            "search",
            f"model={TINY_MODEL}",
            f"n_trials={len(EXPECTED)}",
            "seq_len=32",
            # Long enough for any fake's start on a loaded machine (`sleep` sleeps 60 s).
            "trial_timeout=15s",
            "memory_budget=256MiB",
            f"out={out}",
            "study=faults",
            "confirm_rounds=0",
        ],
        executor=launcher,
    )
    terminal = capsys.readouterr().out
    assert code == 0
    with open(out / "faults" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(EXPECTED)
    for row, (mode, (status, reason)) in zip(rows, EXPECTED.items(), strict=True):
        assert row["status"] == status, mode
        assert reason in row["reason"], mode
        if reason:
            assert reason in terminal, mode
    assert "recommended (*)" in terminal  # the ok trial still makes a recommendation


def test_a_failed_trial_is_not_exported(launcher, tmp_path, capsys):
    out = tmp_path / "reports"
    args = [
        f"model={TINY_MODEL}",
        "n_trials=2",
        "seq_len=32",
        f"out={out}",
        "study=f",
        "confirm_rounds=0",
    ]
    assert cli.main(["search", *args], executor=launcher) == 0
    capsys.readouterr()
    assert cli.main(["export", str(out / "f"), "trial=1"]) == 2  # the second fake raised
    assert "trial=1 is crashed (worker exited with code 1 and no result)" in capsys.readouterr().err


def test_quiet_prints_only_the_paths_and_the_log_keeps_everything(launcher, tmp_path, capsys):
    out = tmp_path / "reports"
    args = [
        f"model={TINY_MODEL}",
        "n_trials=2",
        "seq_len=32",
        f"out={out}",
        "study=q",
        "quiet=true",
    ]
    assert cli.main(["search", *args], executor=launcher) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("wrote ") and "trial" not in printed.split("wrote ")[0]
    log = (out / "q" / "search.log").read_text()
    assert "[1/2] trial   0 ok" in log and "search ended: 2 of 2 trials finished" in log
