import json
import math
import types
from pathlib import Path

import pytest
import transformers

from autotune.child import measure, worker
from autotune.child.worker import ProgressReporter, verdict
from autotune.common import knobs
from autotune.common.device import tensor_peak_tflops
from autotune.common.layout import PROGRESS_FILE
from autotune.common.trial import Progress, Stage, Status, TrialSpec, read_progress, write_progress


def test_a_full_run_with_a_finite_loss_is_ok():
    assert verdict(10, 10, 0.69) == (Status.OK, "")


def test_fewer_measured_steps_than_planned_is_never_ok():
    assert verdict(0, 10, 0.69) == (Status.ERROR, "only 0 of 10 measured steps ran")
    assert verdict(9, 10, 0.69)[0] is Status.ERROR


def test_a_nan_or_infinite_loss_is_nan_loss():
    assert verdict(10, 10, math.nan) == (Status.NAN_LOSS, "training loss is nan")
    assert verdict(10, 10, math.inf)[0] is Status.NAN_LOSS


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
        trial_number=0, model_name="tiny", model_config={}, task="sequence-classification",
        seq_len=8, device="cpu", params={}, warmup_steps=warmup_steps,
        measure_steps=measure_steps, seed=0,
    )  # fmt: skip
    timer = measure.StepTimer(warmup_steps)
    path = tmp_path / PROGRESS_FILE
    reporter = ProgressReporter(path, timer, spec=spec, baseline_rss_bytes=100, started_s=-2.0)
    written = []
    real_write = worker.write_progress
    monkeypatch.setattr(
        worker, "write_progress", lambda p, rec: (written.append(rec), real_write(p, rec))
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
    assert worker.PROGRESS_INTERVAL_S == 0.5  # 8 steps
    assert [r.step for r in written] == [0, 8, 16, 24, 32, 40]


def cuda_spec(**params) -> TrialSpec:
    return TrialSpec(
        trial_number=0, model_name="m", model_config={}, task="masked-lm", seq_len=512,
        device="cuda", params=params, warmup_steps=1, measure_steps=2, seed=0,
    )  # fmt: skip


def test_on_cuda_tf32_is_passed_off_so_that_compile_cannot_turn_it_on(tmp_path):
    # transformers turns TF32 on under torch_compile when `tf32` is None: every fp32 trial
    # under inductor ran TF32 while it was recorded and recommended as fp32.
    spec = cuda_spec(precision="fp32", torch_compile="inductor")
    tuned = knobs.training_args(spec.params, device="cuda", fields=worker._ARG_FIELDS)
    args = worker._training_arguments(spec, tuned, str(tmp_path))  # as the trial makes them
    assert args.tf32 is False and args.torch_compile is True
    assert tuned["tf32"] is False  # what the trial records and the export writes
    for precision in ("bf16", "fp16", "fp8"):  # (this CPU refuses 16-bit TrainingArguments)
        params = {"precision": precision, "torch_compile": "inductor"}
        assert (
            knobs.training_args(params, device="cuda", fields=worker._ARG_FIELDS)["tf32"] is False
        )


def test_on_cuda_a_tf32_precision_asks_for_tf32():
    for precision in ("tf32", "bf16+tf32", "fp16+tf32"):
        tuned = knobs.training_args({"precision": precision}, device="cuda",
                                    fields=worker._ARG_FIELDS)  # fmt: skip
        assert tuned["tf32"] is True, precision


class Timed:
    """A StepTimer's answers: two timed steps of 0.1 s after one warm-up step."""

    def measured_step_times_s(self):
        return [0.1, 0.1]

    def warmup_step_times_s(self):
        return [0.5]

    def measured_counts(self):
        return measure.Counts(samples=16, tokens=16 * 512, padded_tokens=16 * 512,
                              squared_lengths=16 * 512**2)  # fmt: skip

    stopped = None


# bert-large's shape: only `model.config` and the matmul parameters (patched below) are read.
BERT_LARGE = types.SimpleNamespace(
    config=transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16)
)


def test_every_trials_mfu_is_of_the_devices_16_bit_peak_whatever_its_precision(monkeypatch):
    # The fp32 HF-defaults trial on an H100 showed 0.594 of fp32's 66.9 TFLOP/s, while a bf16
    # trial 7.8x faster would show ~0.33 of 989: MFUs of different denominators do not compare.
    monkeypatch.setattr(measure, "matmul_parameters", lambda model: 300_000_000)
    results = {}
    for precision in ("fp32", "tf32", "bf16"):
        measured = {"device_name": "NVIDIA H100 80GB HBM3"}
        results[precision] = worker._result(cuda_spec(precision=precision), Timed(), BERT_LARGE,
                                            1.0, measured)  # fmt: skip
    assert {r.mfu_peak_tflops for r in results.values()} == {tensor_peak_tflops("H100")}
    assert tensor_peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4)
    assert len({r.mfu for r in results.values()}) == 1  # same steps: the same MFU
    flops = measure.training_flops(BERT_LARGE, Timed().measured_counts())
    assert results["fp32"].mfu == pytest.approx(flops / 0.2 / 989.4e12)


@pytest.mark.parametrize("depth", [1, 12])
def test_a_trials_temporary_files_and_sockets_live_in_folders_removed_with_it(
    tmp_path, depth, monkeypatch
):
    """Everything temporary goes in a folder of the trial's own; multiprocessing's sockets (a
    DataLoader worker hands tensors over one) too, unless that folder is too deep for an
    AF_UNIX path (107 bytes): then in a short one of the system's. Both go when it ends, and
    the process's settings are as before."""
    import multiprocessing.connection
    import multiprocessing.util
    import os
    import tempfile

    from autotune.child.worker import SOCKET_FOLDER_CHARS, temporary_files_in

    trial_dir = tmp_path.joinpath(*["deeper-folder"] * depth)
    trial_dir.mkdir(parents=True)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # conftest shares one
    before = tempfile.gettempdir(), os.environ.get("TMPDIR")
    with temporary_files_in(trial_dir):
        # torch.compile's cache where torch keeps it by default: reused by later trials.
        cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert cache.parent == Path(before[0]) and cache.name.startswith("torchinductor_")
        made = Path(tempfile.mkdtemp(prefix="autotune-trainer-"))
        assert made.parent.parent == trial_dir
        sockets = Path(multiprocessing.util.get_temp_dir())
        assert len(str(sockets)) <= SOCKET_FOLDER_CHARS
        assert (sockets == made.parent) == (len(str(made.parent)) <= SOCKET_FOLDER_CHARS)
        with multiprocessing.connection.Listener(family="AF_UNIX") as listener:
            assert Path(listener.address).parent == sockets  # bound: the path fits
    assert list(trial_dir.iterdir()) == [] and not sockets.exists()
    assert (tempfile.gettempdir(), os.environ.get("TMPDIR")) == before
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
