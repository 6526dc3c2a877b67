"""The parent's defences, in process: the study lock, other searches' trials, study names and
model types checked before any trial, stored budgets, stale results set aside."""

import json
import socket

import optuna
import psutil

from autotune.common.layout import INTERRUPTED_RESULT
from autotune.store.records import OWNER_ATTR, RETRY_OF_ATTR, SECOND_LOOK_ATTR
from autotune.study.recovery import recover


def running_trial(study, owner):
    trial = study.ask()
    if owner is not None:
        trial.set_user_attr(OWNER_ATTR, owner)
    return trial.number


def test_only_trials_of_searches_that_are_gone_count_as_interrupted(tmp_path, monkeypatch):
    study = optuna.create_study(directions=["maximize", "minimize"])
    me = psutil.Process()
    here = socket.gethostname()
    alive = running_trial(study, {"host": here, "pid": me.pid, "pid_started": me.create_time()})
    elsewhere = running_trial(study, {"host": here + "-other", "pid": 1, "pid_started": 0.0})
    dead_pid = running_trial(study, {"host": here, "pid": 2**22 + 1, "pid_started": 0.0})
    reused = running_trial(study, {"host": here, "pid": me.pid, "pid_started": 1.0})
    legacy = running_trial(study, None)
    (tmp_path / "trials" / f"{dead_pid:04d}").mkdir(parents=True)
    (tmp_path / "trials" / f"{dead_pid:04d}" / "result.json").write_text('{"status": "ok"}')

    _, queued = recover(study, tmp_path, baseline={})

    states = {t.number: t.state for t in study.trials}
    running = optuna.trial.TrialState.RUNNING
    # Another host's trial is left to its heartbeats; one that names no owner yet was asked for
    # a moment ago by a search that is about to name itself.
    assert states[alive] is running and states[elsewhere] is running
    assert states[legacy] is running
    assert queued == [dead_pid, reused]
    # Long after it started, an unowned running trial is an old search's.
    monkeypatch.setattr("autotune.study.recovery.UNOWNED_GRACE_S", 0.0)
    assert recover(study, tmp_path, baseline={})[1] == [legacy]
    dead_dir = tmp_path / "trials" / f"{dead_pid:04d}"
    assert not (dead_dir / "result.json").exists(), "an unrecorded result passes for a real one"
    assert json.loads((dead_dir / INTERRUPTED_RESULT).read_text()) == {"status": "ok"}


def test_an_interrupted_second_look_is_queued_again_as_a_second_look(tmp_path):
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({}, user_attrs={SECOND_LOOK_ATTR: 3})
    number = study.ask().number  # its search died while it ran
    study.tell(number, state=optuna.trial.TrialState.FAIL)  # interrupted: no result

    _, queued = recover(study, tmp_path, baseline={})

    assert queued == [number]
    retry = study.trials[-1]
    # It runs to its end again (no early stop), and no repeat of trial 3.
    assert retry.user_attrs[SECOND_LOOK_ATTR] == 3 and retry.user_attrs[RETRY_OF_ATTR] == number
