"""Every bad input is one clear error with exit code 2, nothing half-written; a search with
nothing to recommend exits 3. Through the real command line, with a stand-in worker."""

import json

import pytest

from autotune import cli
from tests.conftest import TINY_MODEL, fake_executor

pytestmark = pytest.mark.usefixtures("probe_once")


def search(*overrides: str) -> int:
    """A search whose trials the stand-in worker runs."""
    return cli.main(
        ["search", f"model={TINY_MODEL}", "seq_len=32", "study=s", "confirm_rounds=0", *overrides],
        executor=fake_executor("ok"),
    )


def error_of(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err


def test_an_out_that_is_a_file_is_one_error(tmp_path, capsys):
    blocker = tmp_path / "reports"
    blocker.write_text("")
    assert search(f"out={blocker}") == 2
    assert error_of(capsys) == (
        f"error: out={blocker}: {blocker} is not a folder, so no study folder can be made in it\n"
    )


def test_an_out_that_cannot_be_created_is_one_error(capsys):
    assert search("out=/proc/autotune-reports") == 2
    assert "cannot create the study folder /proc/autotune-reports/s" in error_of(capsys)


@pytest.mark.parametrize(
    ("storage", "says"),
    [
        ("nonsense", "storage=nonsense: cannot open it: ArgumentError"),
        ("mysql://user:pw@127.0.0.1:9/db", "ModuleNotFoundError: No module named 'MySQLdb'"),
    ],
)
def test_a_bad_storage_is_one_error_and_leaves_no_study_folder(tmp_path, capsys, storage, says):
    assert search(f"out={tmp_path}", f"storage={storage}") == 2
    assert says in error_of(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_space_that_is_not_utf8_is_one_error_for_validate_and_search(tmp_path, capsys):
    space = tmp_path / "latin1.yaml"
    space.write_bytes("description: caf\xe9\ndevice: any\nknobs: {}\n".encode("latin-1"))
    assert cli.main(["validate", str(space)]) == 2
    assert f"{space}:1: not UTF-8 text (byte 0xe9" in error_of(capsys)
    assert search(f"out={tmp_path / 'r'}", f"space={space}") == 2
    assert "not UTF-8 text" in error_of(capsys)
    assert not (tmp_path / "r").exists()


def test_report_on_a_file_that_is_not_a_database_is_one_error(tmp_path, capsys):
    (tmp_path / "study.db").write_text("not a database " * 100)
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "file is not a database" in error_of(capsys)


def test_report_on_an_empty_study_db_writes_nothing_into_it(tmp_path, capsys):
    (tmp_path / "study.db").write_bytes(b"")
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not an Optuna study storage" in error_of(capsys)
    assert (tmp_path / "study.db").stat().st_size == 0, "tables were written into the file"
    assert [p.name for p in tmp_path.iterdir()] == ["study.db"]


def test_nothing_to_recommend_exits_3_and_the_report_says_so(tmp_path, capsys):
    # The stand-in's batch 8 peaks at 0.125 GiB: over a 64 MiB budget, so nothing fits.
    assert search(f"out={tmp_path}", "n_trials=2", "memory_budget=64MiB") == 3
    out = capsys.readouterr().out
    assert "nothing to recommend (exit code 3)" in out
    report = (tmp_path / "s" / "report.html").read_text()
    assert "nothing to recommend: no successful trial peaks below 0.06 GiB" in report
    assert not (tmp_path / "s" / "recommended.json").exists()


def test_peak_tflops_reaches_the_worker(tmp_path, capsys):
    assert search(f"out={tmp_path}", "n_trials=1", "peak_tflops=123.5") == 0
    spec = json.loads((tmp_path / "s" / "trials" / "0000" / "spec.json").read_text())
    assert spec["peak_tflops"] == 123.5


def test_an_error_naming_a_user_string_prints_it_as_given(tmp_path, capsys):
    # The message names the model; read as terminal markup, `[/x]` was a crash.
    args = ["search", "model=[/x]not[bold]here", f"out={tmp_path}"]
    assert cli.main(args, executor=fake_executor("ok")) == 2
    assert "model=[/x]not[bold]here: not in the catalogue" in error_of(capsys)


def test_a_search_whose_every_trial_would_time_out_is_refused_unless_forced(tmp_path, capsys):
    """bert-large at seq 512 at 0.1 TFLOP/s: even the space's smallest batch needs more compute
    than trial_timeout allows. It used to warn, then start hours of certain timeouts."""
    argv = [
        "search",
        "model=bert-large-uncased",
        "seq_len=512",
        "peak_tflops=0.1",
        f"out={tmp_path}",
        "study=big",
        "confirm_rounds=0",
        "n_trials=1",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 2
    err = " ".join(error_of(capsys).split())
    assert (
        "every trial would time out: the least work a trial of this space does (13 steps at "
        "its smallest batch) needs at least" in err
    )
    assert "over trial_timeout=10 min" in err and "force=true runs it anyway" in err
    assert not (tmp_path / "big").exists()
    assert cli.main([*argv, "force=true"], executor=fake_executor("ok")) == 0


def test_every_problem_found_without_a_probe_is_named_in_one_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_text("text,label\nhi,0\n")
    argv = [
        "search",
        f"model={TINY_MODEL}",
        "memory_budget=abc",
        "seq_len=100000",
        "data=./trian.csv",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 2
    err = " ".join(error_of(capsys).split())
    assert "3 problems in the run configuration" in err
    assert "memory_budget=abc: expected a size" in err
    assert f"seq_len=100000: {TINY_MODEL} takes at most 512 tokens" in err
    assert "data=./trian.csv: no such file or folder; did you mean train.csv?" in err


def test_a_misspelt_knob_gets_a_did_you_mean(tmp_path, capsys):
    space = tmp_path / "typo.yaml"
    space.write_text("device: any\nknobs:\n  precison: bf16\n")
    assert cli.main(["validate", str(space)]) == 2
    assert f"{space}:3: knobs.precison: unknown knob (did you mean precision?)" in error_of(capsys)
