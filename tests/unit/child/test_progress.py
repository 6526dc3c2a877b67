"""A trial's progress: its records for the parent and its log lines."""

import json

import pytest

from autotune.child import measure, progress
from autotune.child.progress import ProgressReporter
from autotune.common.layout import PROGRESS_FILE
from autotune.common.trial import Progress, Stage, TrialSpec, read_progress, write_progress


def record(**fields) -> Progress:
    defaults = dict(
        baseline_rss_bytes=2**30, stage=Stage.WARMUP, step=2, total_steps=13, elapsed_s=1.25
    )
    return Progress(**{**defaults, **fields})


def test_a_progress_record_reads_back_as_written(tmp_path):
    path = tmp_path / PROGRESS_FILE
    written = record(stage=Stage.MEASURING, eta_s=8.4)
    write_progress(path, written)
    assert read_progress(path) == written
    assert read_progress(path).stage is Stage.MEASURING


def test_no_progress_file_or_a_half_written_one_reads_as_none(tmp_path):
    path = tmp_path / PROGRESS_FILE
    assert read_progress(path) is None
    path.write_text(json.dumps(record().to_dict())[:40])
    assert read_progress(path) is None


def test_a_progress_record_of_another_schema_is_refused(tmp_path):
    path = tmp_path / PROGRESS_FILE
    path.write_text(json.dumps({"baseline_rss_bytes": 0, "schema_version": 1}))
    with pytest.raises(ValueError, match="progress schema 1"):
        read_progress(path)


def test_the_log_line_says_step_stage_elapsed_and_eta_once_known():
    assert record().summary() == "step 2/13 (warm-up) 1.2 s elapsed"
    assert record(eta_s=7.6).summary() == "step 2/13 (warm-up) 1.2 s elapsed, ETA 8 s"


def drive(tmp_path, monkeypatch, clock_s, warmup_steps, measure_steps):
    """Run the timer and the reporter through a training without training: the clock reads
    `clock_s` in turn (train begins, then each step's end); returns every record written."""
    readings = iter(clock_s)
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(readings))
    spec = TrialSpec(
        trial_number=0,
        model_name="tiny",
        model_config={},
        task="sequence-classification",
        seq_len=8,
        device="cpu",
        params={},
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
        seed=0,
    )
    timer = measure.StepTimer(warmup_steps)
    path = tmp_path / PROGRESS_FILE
    reporter = ProgressReporter(path, timer, spec=spec, baseline_rss_bytes=100, started_s=-2.0)
    written = []
    real_write = progress.write_progress
    monkeypatch.setattr(
        progress, "write_progress", lambda p, rec: (written.append(rec), real_write(p, rec))
    )
    for callback in (timer, reporter):
        callback.on_train_begin(None, None, None)
    for _ in range(warmup_steps + measure_steps):
        for callback in (timer, reporter):
            callback.on_step_end(None, None, None)
    assert read_progress(path) == written[-1]
    return written


def test_records_follow_the_stages_and_the_last_step_says_done(tmp_path, monkeypatch):
    # Train begins at 0; the first step (compile) ends at 10 s, then 1 s steps.
    written = drive(tmp_path, monkeypatch, [0.0, 10.0, 11.0, 12.0, 13.0], 2, 2)
    assert [(r.stage, r.step) for r in written] == [
        (Stage.WARMUP, 0),
        (Stage.WARMUP, 1),
        (Stage.MEASURING, 2),
        (Stage.MEASURING, 3),
        (Stage.MEASURING, 4),
    ]
    assert [r.eta_s for r in written] == [None, None, 2.0, 1.0, 0.0]
    assert [r.elapsed_s for r in written] == [2.0, 12.0, 13.0, 14.0, 15.0]  # started at -2
    assert {r.total_steps for r in written} == {4}
    assert {r.baseline_rss_bytes for r in written} == {100}


def test_fast_steps_are_logged_every_step_but_recorded_at_most_twice_a_second(
    tmp_path, monkeypatch, capsys
):
    steps = 40
    clock = [0.0] + [k / 16 for k in range(1, steps + 1)]  # 62.5 ms steps, 2.5 s in all
    written = drive(tmp_path, monkeypatch, clock, 1, steps - 1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + steps  # training begins, then every step
    assert lines[5] == "step 5/40 (measuring) 2.3 s elapsed, ETA 2 s"
    assert progress.PROGRESS_INTERVAL_S == 0.5  # 8 steps
    assert [r.step for r in written] == [0, 8, 16, 24, 32, 40]
