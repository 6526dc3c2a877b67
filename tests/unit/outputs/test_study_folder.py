"""Outputs are written whole or not at all, never through a link, and only into a study folder
of this user's own (pure file operations: no process)."""

import errno
import os

import optuna
import pytest

from autotune.common.errors import AutotuneError
from autotune.common.trial import Status, TrialResult, write_json_atomic
from autotune.outputs.snapshot import read_snapshot
from autotune.outputs.study_folder import write_study_folder
from autotune.store.records import BASELINE_ATTR, PARAMS_ATTR, store_run_info, tell_result
from tests.unit.outputs.report.test_data import INFO
from tests.unit.stand_ins import plan_for

OUTPUTS = ("trials.csv", "pareto.csv", "recommended.json", "recommended.py", "report.html")


@pytest.fixture(scope="module")
def snapshot():
    return read_snapshot(add_trials(optuna.create_study(directions=["maximize", "minimize"])))


def add_trials(study, n_trials=2):
    """`n_trials` more measured trials, the study's first one its baseline: every output has
    something to say."""
    for _ in range(n_trials):
        i = len(study.trials)
        trial = study.ask()
        trial.set_user_attr(PARAMS_ATTR, {"batch_size": 8 * (i + 1)})
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        result = TrialResult(
            status=Status.OK,
            samples_per_s=100.0 + 80 * i,
            peak_memory_gib=2.0 + i,
            step_time_cv=0.02,
            training_args={"per_device_train_batch_size": 8 * (i + 1)},
        )
        tell_result(study, trial, result, budget_gib=INFO.memory_budget_gib, noise_cv=0.1)
    store_run_info(study, INFO)
    return study


def _a_full_disk_after(monkeypatch, n_bytes):
    """os.write takes the first `n_bytes` written, then fails as a full disk does."""
    real_write = os.write
    room = [n_bytes]

    def write(fd, data):
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real_write(fd, bytes(data[: room[0]]))
        room[0] -= written
        return written

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_full_disk_keeps_the_good_output_and_says_the_path_and_the_space(
    tmp_path, snapshot, monkeypatch, name
):
    write_study_folder(snapshot, tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in OUTPUTS}
    real_write = os.write

    # The disk fills up while this one output is written (half of it fits).
    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / f".{name}.")):
            written = real_write(fd, bytes(data[: len(data) // 2]))
            if written:
                monkeypatch.setattr(os, "write", full)
                return written
        return real_write(fd, data)

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(AutotuneError) as raised:
        write_study_folder(snapshot, tmp_path)
    monkeypatch.undo()
    message = str(raised.value)
    assert str(tmp_path / name) in message
    assert "No space left on device" in message
    assert "needs" in message and "free" in message
    assert (tmp_path / name).read_bytes() == before[name]  # the good file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)  # no temp file left


def test_a_result_that_cannot_be_written_leaves_the_old_one_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"status": "ok"})
    _a_full_disk_after(monkeypatch, 3)
    with pytest.raises(AutotuneError, match=r"result\.json: No space left on device"):
        write_json_atomic(path, {"status": "error", "reason": "x" * 1000})
    monkeypatch.undo()
    assert path.read_text() == '{\n  "status": "ok"\n}'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


@pytest.mark.parametrize("name", OUTPUTS)
def test_an_output_that_is_a_symlink_is_replaced_and_its_target_left_alone(
    tmp_path, snapshot, name
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("someone else's file\n")
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    (study_dir / name).symlink_to(elsewhere)
    write_study_folder(snapshot, study_dir)
    assert elsewhere.read_text() == "someone else's file\n"
    assert not (study_dir / name).is_symlink()
    assert (study_dir / name).stat().st_size > 0


def test_a_json_record_that_is_a_symlink_is_replaced_and_its_target_left_alone(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    link = tmp_path / "spec.json"
    link.symlink_to(elsewhere)
    write_json_atomic(link, {"trial_number": 3}, fsync=False)
    assert elsewhere.read_text() == "{}"
    assert not link.is_symlink() and '"trial_number": 3' in link.read_text()


@pytest.fixture
def someone_elses(monkeypatch):
    """Every folder reads as another user's: this process runs as uid + 1."""
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    return uid


def test_a_study_folder_owned_by_another_user_is_refused_naming_the_owner(tmp_path, someone_elses):
    study_dir = tmp_path / "s"
    study_dir.mkdir()
    with pytest.raises(AutotuneError, match=rf"{study_dir} is owned by .*uid {someone_elses}\b"):
        plan_for(tmp_path, "study=s")
    assert list(study_dir.iterdir()) == []


def test_outputs_are_not_written_into_a_study_folder_another_user_owns(
    tmp_path, snapshot, someone_elses
):
    with pytest.raises(AutotuneError, match=rf"is owned by .*uid {someone_elses}\b"):
        write_study_folder(snapshot, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_new_study_folder_is_not_refused(tmp_path):
    assert plan_for(tmp_path, "study=new").study_dir == tmp_path / "new"


def test_a_software_cache_that_cannot_be_written_is_passed_over(
    probes,
    tmp_path,
    monkeypatch,
):
    from autotune.plan import software_cache

    (tmp_path / "file").write_text("")
    monkeypatch.setenv(software_cache.CACHE_DIR_ENV, str(tmp_path / "file" / "cache"))
    assert software_cache.probe_device().name == "cpu"
    assert software_cache.probe_device().name == "cpu"
    assert len(probes) == 2  # not cached: each run probes again


def test_a_search_lock_that_is_a_symlink_is_refused_and_its_target_left_alone(tmp_path):
    from autotune.common.layout import LOCK_FILE
    from autotune.store.study_lock import StudyLock

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("someone else's file\n")
    study_dir = tmp_path / "s"
    study_dir.mkdir()
    (study_dir / LOCK_FILE).symlink_to(elsewhere)
    with pytest.raises(AutotuneError, match=rf"{study_dir / LOCK_FILE}: .*link"):
        StudyLock.acquire(study_dir, "s").release()
    assert elsewhere.read_text() == "someone else's file\n"


def test_a_knob_a_trial_leaves_out_shows_what_training_did_where_it_applies():
    """The baseline sets no loader workers: its row says 0 (what the Trainer uses), not blank;
    a knob that does not apply to a trial (re-entrant checkpointing without checkpointing)
    stays blank."""
    from autotune.outputs.study_folder import table
    from autotune.store.records import TrialRecord

    def record(number, params):
        result = TrialResult(status=Status.OK, samples_per_s=100.0, peak_memory_gib=1.0)
        return TrialRecord(number=number, params=params, result=result, baseline=number == 0)

    loader = {
        "batch_size": 8,
        "gradient_checkpointing": True,
        "checkpointing_reentrant": True,
        "dataloader_num_workers": 2,
    }
    records = [record(0, {"batch_size": 8, "gradient_checkpointing": False}), record(1, loader)]
    study = add_trials(optuna.create_study(directions=["maximize", "minimize"]))
    _, rows = table(records, read_snapshot(study))
    assert rows[0]["dataloader_num_workers"] == 0 and rows[1]["dataloader_num_workers"] == 2
    assert rows[0]["checkpointing_reentrant"] is None
