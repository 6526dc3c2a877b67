"""The lines a person reads: appended to the study's log never through a link planted at its
name, and the files a search wrote named relative to the working folder when inside it."""

from pathlib import Path

from autotune.outputs.terminal import Reporter, shown_paths


def test_a_search_log_that_is_a_symlink_is_not_appended_through(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("someone else's file\n")
    (tmp_path / "search.log").symlink_to(elsewhere)
    report = Reporter(quiet=True, log_path=tmp_path / "search.log")
    report.line("study s: tiny")
    report.line("trial 0 ok")
    assert elsewhere.read_text() == "someone else's file\n"
    assert capsys.readouterr().err.count("cannot append to") == 1  # said once


def test_written_paths_are_named_relative_to_the_working_folder_when_inside_it(
    tmp_path, monkeypatch
):
    """The normal end and the interrupted one (cli: `...; wrote PATHS`) say them alike."""
    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "reports" / "s" / "trials.csv", Path("/elsewhere/trials.csv")
    assert shown_paths([inside, outside]) == "reports/s/trials.csv, /elsewhere/trials.csv"
