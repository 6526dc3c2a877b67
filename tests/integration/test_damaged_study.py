"""A study changed outside autotune, or recorded by a later one: `report` and `export` end in
one line naming the trial (exit 2), not a traceback."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune import api
from autotune.execute.simulated import SimulatedExecutor
from autotune.plan import software_cache
from autotune.plan.overrides import make_config
from autotune.store.records import RESULT_ATTR
from autotune.twin import answer as twin_answer
from autotune.twin.answer import TwinAnswer


@pytest.fixture
def study_dir(tmp_path):
    # As `executor=twin gpu=H100` runs: the H100 with this host's software (its transformers'
    # TrainingArguments fields among them).
    device = twin_answer.device_info("H100", software_cache.probe_device())
    settings = {"model": "bert-large-uncased", "seq_len": 512, "n_trials": 3, "confirm_rounds": 0}
    config = make_config({**settings, "out": str(tmp_path), "study": "s", "quiet": True})
    api.run(config, executor=SimulatedExecutor(TwinAnswer("H100", seed=0)), device_info=device)
    return tmp_path / "s"


def set_result(study_dir: Path, number: int, value_json: str) -> None:
    """Trial `number`'s stored result, written into the file as another program would."""
    database = sqlite3.connect(study_dir / "study.db")
    with database:
        database.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key = ? AND trial_id = "
            "(SELECT trial_id FROM trials WHERE number = ?)",
            (value_json, RESULT_ATTR, number),
        )
    database.close()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=300
    )


def refused_by_report_and_export(study_dir: Path, says: str) -> None:
    """`report` and `export` each end in the one line that starts with `says`, exit 2."""
    for command in (("report", str(study_dir)), ("export", str(study_dir), "format=json")):
        proc = cli(*command)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(says), proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_result_of_a_later_schema_is_named_with_its_trial(study_dir):
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}")
    stored = {**study.trials[1].user_attrs[RESULT_ATTR], "schema_version": 2}
    set_result(study_dir, 1, json.dumps(stored))
    refused_by_report_and_export(
        study_dir,
        f"error: study=s in {study_dir / 'study.db'}: trial 1 was recorded by a later autotune "
        "(result schema 2",
    )


def test_a_result_changed_outside_autotune_is_named_with_its_trial(study_dir):
    set_result(study_dir, 1, json.dumps({"status": "ok"}))
    proc = cli("report", str(study_dir))
    assert proc.returncode == 2, proc.stderr
    assert f"study=s in {study_dir / 'study.db'}: trial 1's stored result cannot be read" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    set_result(study_dir, 1, "{not json")
    # Optuna decodes every attribute at once; the study file says which one is not JSON.
    refused_by_report_and_export(
        study_dir,
        f"error: sqlite:///{study_dir.resolve() / 'study.db'}: study s trial 1's 'result' is "
        "not JSON (",
    )


def test_training_arguments_changed_outside_autotune_are_not_exported(study_dir):
    """The exports write each trial's TrainingArguments as its settings give them; a recorded
    set that is not that (here one that would point the user's training at a file of the
    writer's choosing) is refused, naming the trial and the argument."""
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}")
    stored = study.trials[1].user_attrs[RESULT_ATTR]
    assert stored["training_args"]["per_device_train_batch_size"]  # the twin records them
    planted = stored["training_args"] | {"deepspeed": "/tmp/theirs.json"}
    set_result(study_dir, 1, json.dumps(stored | {"training_args": planted}))
    for command in (("report", str(study_dir)), ("export", str(study_dir), "format=json")):
        proc = cli(*command)
        assert proc.returncode == 2, proc.stderr
        assert "trial 1's recorded TrainingArguments are not what its settings give" in proc.stderr
        assert "'deepspeed'" in proc.stderr and "Traceback" not in proc.stderr
