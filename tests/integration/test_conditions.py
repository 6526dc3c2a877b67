"""Measurement conditions are part of a study: a resume (or a worker) that would measure under
other ones is refused, trials measured under other versions are kept out of the front, and
the outputs say where the study came from. Fake workers: a search takes seconds."""

from __future__ import annotations

import csv
import json
import os
import sqlite3

import pytest

from autotune import __version__, cli
from autotune.store.records import RUN_ATTR, VERSIONS_ATTR
from tests.conftest import TINY_MODEL, fake_executor


def search(out, study: str, *settings: str, command: str = "search") -> int:
    argv = [command, f"out={out}", f"study={study}", *settings]
    if command == "search":
        argv += [f"model={TINY_MODEL}", "confirm_rounds=0"]
        argv += [] if any(s.startswith("seq_len=") for s in settings) else ["seq_len=32"]
    return cli.main(argv, executor=fake_executor("ok"))


def flat(text: str) -> str:
    """Terminal output as one line: rich wraps long lines."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("conditions")
    assert search(out, "made", "n_trials=2", "measure_steps=6", "warmup_steps=2") == 0
    return out


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("measure_steps=5", "measure_steps: the study's 6, this run's 5"),
        ("warmup_steps=1", "warmup_steps: the study's 2, this run's 1"),
        ("seq_len=64", "seq_len: the study's 32, this run's 64"),
    ],
)
def test_a_resume_under_other_conditions_is_refused_naming_them(made, capsys, setting, named):
    capsys.readouterr()
    key = setting.partition("=")[0]
    kept = [s for s in ("measure_steps=6", "warmup_steps=2") if not s.startswith(key)]
    assert search(made, "made", *kept, "n_trials=3", setting) == 2
    err = flat(capsys.readouterr().err)
    assert named in err, err
    assert "another study= name" in err
    # Nothing ran: the study still has its two trials.
    rows = list(csv.DictReader((made / "made" / "trials.csv").open()))
    assert len(rows) == 2


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


@needs_two_cores
def test_a_resume_with_other_cores_per_trial_is_refused(made, capsys):
    cores = len(os.sched_getaffinity(0))  # workers=1: one trial on all of them
    capsys.readouterr()
    assert search(made, "made", "measure_steps=6", "warmup_steps=2", "workers=2") == 2
    err = flat(capsys.readouterr().err)
    assert "cores_per_trial" in err and f"the study's {cores}, this run's {cores // 2}" in err
    assert "workers=" in err


@needs_two_cores
def test_a_worker_with_other_cores_per_trial_is_refused(made, capsys):
    """`autotune worker` takes the study's settings but its own workers=: it would measure
    on fewer cores than the study's trials had."""
    capsys.readouterr()
    assert search(made, "made", "workers=2", command="worker") == 2
    assert "cores_per_trial" in flat(capsys.readouterr().err)


def test_the_same_conditions_resume(made):
    assert search(made, "made", "measure_steps=6", "warmup_steps=2", "n_trials=3") == 0
    rows = list(csv.DictReader((made / "made" / "trials.csv").open()))
    assert len(rows) == 3 and not any(r["other_versions"] for r in rows)


def set_stored_versions(db, versions: dict[str, str]) -> None:
    """As if the study and its trials so far had been measured under `versions`."""
    with sqlite3.connect(db) as conn:
        (run,) = conn.execute(
            "SELECT value_json FROM study_user_attributes WHERE key = ?", (RUN_ATTR,)
        ).fetchone()
        conn.execute(
            "UPDATE study_user_attributes SET value_json = ? WHERE key = ?",
            (json.dumps(json.loads(run) | {"versions": versions}), RUN_ATTR),
        )
        conn.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key = ?",
            (json.dumps(versions), VERSIONS_ATTR),
        )


def test_trials_under_new_versions_are_marked_and_kept_out_of_the_front(tmp_path, capsys):
    assert search(tmp_path, "upgraded", "n_trials=2") == 0
    recommended = json.loads((tmp_path / "upgraded" / "recommended.json").read_text())
    old = recommended["provenance"]["runs"][0]["versions"]
    older = {k: old[k] for k in ("torch", "transformers", "autotune")} | {"torch": "1.0.0"}
    set_stored_versions(tmp_path / "upgraded" / "study.db", older)
    capsys.readouterr()

    assert search(tmp_path, "upgraded", "n_trials=4") == 0
    out = flat(capsys.readouterr().out)
    assert out.count("was measured under other versions") == 1, out  # said once
    assert f"torch {old['torch']} (the study's 1.0.0)" in out
    rows = list(csv.DictReader((tmp_path / "upgraded" / "trials.csv").open()))
    marked = {int(r["number"]) for r in rows if r["other_versions"]}
    assert marked == {2, 3}, rows  # the trials run after the upgrade
    pareto = csv.DictReader((tmp_path / "upgraded" / "pareto.csv").open())
    front = {int(r["number"]) for r in pareto}
    assert front and not front & marked
    recommended = json.loads((tmp_path / "upgraded" / "recommended.json").read_text())
    assert recommended["trial"] not in marked
    assert [r["versions"]["torch"] for r in recommended["provenance"]["runs"]] == [old["torch"]] * 2
    report = (tmp_path / "upgraded" / "report.html").read_text()
    assert "provenance: other versions" in report and "trial(s) 2, 3 measured under" in report


def test_recommended_json_and_the_report_say_where_the_study_came_from(tmp_path):
    assert search(tmp_path, "origin", "n_trials=2", "seed=5") == 0
    assert search(tmp_path, "origin", "n_trials=3", "seed=5") == 0  # resumed: a second run
    recommended = json.loads((tmp_path / "origin" / "recommended.json").read_text())
    provenance = recommended["provenance"]
    command = (
        f"autotune search out={tmp_path} study=origin n_trials=2 seed=5 "
        f"model={TINY_MODEL} confirm_rounds=0 seq_len=32"
    )
    assert provenance["command"] == command
    first, second = provenance["runs"]
    assert second["command"] == command.replace("n_trials=2", "n_trials=3")
    assert first["settings"]["n_trials"] == 2 and first["settings"]["measure_steps"] == 10
    assert first["seed"] == 5 and first["versions"]["autotune"] == __version__
    assert first["device"] == "cpu" and first["host"] and first["cores_per_trial"]
    assert first["started"] <= first["ended"] <= second["started"] <= second["ended"]
    assert provenance["started"] == first["started"] and provenance["ended"] == second["ended"]
    report = (tmp_path / "origin" / "report.html").read_text()
    assert "provenance: command" in report and "study=origin n_trials=2 seed=5" in report


def test_a_resume_after_the_space_file_changed_a_knobs_values_is_refused_naming_it(
    tmp_path, capsys
):
    """Optuna keeps one set of values per parameter: an edited space used to crash the first
    trial that asked (ValueError, exit 1, a trial left RUNNING)."""
    import optuna

    space = tmp_path / "space.yaml"
    space.write_text("device: any\nknobs:\n  batch_size: {choices: [8, 16]}\n  optim: sgd\n")
    assert search(tmp_path, "edited", f"space={space}", "n_trials=2") == 0
    space.write_text("device: any\nknobs:\n  batch_size: {choices: [8, 16, 32]}\n  optim: sgd\n")
    capsys.readouterr()
    assert search(tmp_path, "edited", f"space={space}", "n_trials=4") == 2
    err = flat(capsys.readouterr().err)
    assert (
        "study=edited was searched with other values of batch_size ([8, 16] in the study, "
        "[8, 16, 32] now)" in err
    )
    assert "Traceback" not in err
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'edited/study.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2


@pytest.mark.parametrize("command", ["search", "worker", "report", "confirm"])
def test_a_study_a_later_autotune_wrote_is_refused_in_one_message(tmp_path, capsys, command):
    import optuna

    assert search(tmp_path, "later", "n_trials=1") == 0
    url = f"sqlite:///{tmp_path / 'later/study.db'}"
    study = optuna.load_study(study_name=None, storage=url)
    info = study.user_attrs[RUN_ATTR]
    study.set_user_attr(RUN_ATTR, info | {"versions": {"autotune": "9.0"}, "quantum": True})
    capsys.readouterr()
    where = [str(tmp_path / "later")] if command in ("report", "confirm") else []
    argv = [command, *where, *([] if where else [f"out={tmp_path}", "study=later"])]
    if command == "search":
        argv += [f"model={TINY_MODEL}", "seq_len=32", "confirm_rounds=0", "n_trials=2"]
    assert cli.main(argv, executor=fake_executor("ok")) == 2
    err = flat(capsys.readouterr().err)
    assert (
        "study=later was made by autotune 9.0, and stores settings this autotune "
        f"({__version__}) does not know: quantum"
    ) in err, err
    assert "Traceback" not in err
