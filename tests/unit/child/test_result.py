"""A trial's result from what it measured: its verdict, throughput and MFU."""

import dataclasses
import math
import types

import pytest
import transformers

from autotune.child import measure, result
from autotune.child.result import verdict
from autotune.common.device import tensor_peak_tflops
from autotune.common.trial import Status
from tests.unit.child.test_trainers import cuda_spec


def test_a_full_run_with_a_finite_loss_is_ok():
    assert verdict(10, 10, 0.69) == (Status.OK, "")


def test_fewer_measured_steps_than_planned_is_never_ok():
    assert verdict(0, 10, 0.69) == (Status.ERROR, "only 0 of 10 measured steps ran")
    assert verdict(9, 10, 0.69)[0] is Status.ERROR


def test_a_nan_or_infinite_loss_is_nan_loss():
    assert verdict(10, 10, math.nan) == (Status.NAN_LOSS, "training loss is nan")
    assert verdict(10, 10, math.inf)[0] is Status.NAN_LOSS


class Timed:
    """A StepTimer's answers: two timed steps of 0.1 s after one warm-up step."""

    def measured_step_times_s(self):
        return [0.1, 0.1]

    def warmup_step_times_s(self):
        return [0.5]

    def measured_counts(self):
        return measure.Counts(
            samples=16, tokens=16 * 512, padded_tokens=16 * 512, squared_lengths=16 * 512**2
        )

    stopped = None


def measured_on(device_name: str) -> result.Measured:
    return result.Measured(
        memory=result.Memory(peak_memory_gib=10.0),
        final_loss=1.0,
        build_s=1.0,
        train_s=1.0,
        warmup_s=0.5,
        finish_s=0.1,
        n_params=335_000_000,
        device_name=device_name,
        cpu_threads=None,
        training_args={},
        model_kwargs={},
        peft_config=None,
        quantization_config=None,
        trainable_params=335_000_000,
        environment={},
        compiled_modules=None,
        step_times_ms=[100.0, 100.0],
        trained_model="bert",
        trained_seq_len=512,
    )


def test_the_result_holds_every_figure_measured_under_its_own_name(monkeypatch):
    monkeypatch.setattr(measure, "matmul_parameters", lambda model: 300_000_000)
    monkeypatch.setattr(measure, "frozen_matmul_parameters", lambda model: 0)
    measured = measured_on("cpu")
    ok = result.of_trial(cuda_spec(), Timed(), BERT_LARGE, measured)
    assert (ok.status, ok.peak_memory_gib, ok.n_params, ok.final_loss) == (
        Status.OK,
        10.0,
        335_000_000,
        1.0,
    )
    stages = dataclasses.replace(measured, stages={"model_build_s": 2.5}, final_loss=math.nan)
    failed = result.of_trial(cuda_spec(), Timed(), BERT_LARGE, stages)
    assert (failed.status, failed.model_build_s, failed.measured_steps) == (Status.NAN_LOSS, 2.5, 2)


# bert-large's shape: only `model.config` and the matmul parameters (patched below) are read.
BERT_LARGE = types.SimpleNamespace(
    config=transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16)
)


def test_every_trials_mfu_is_of_the_devices_16_bit_peak_whatever_its_precision(monkeypatch):
    # The fp32 HF-defaults trial on an H100 showed 0.594 of fp32's 66.9 TFLOP/s, while a bf16
    # trial 7.8x faster would show ~0.33 of 989: MFUs of different denominators do not compare.
    monkeypatch.setattr(measure, "matmul_parameters", lambda model: 300_000_000)
    monkeypatch.setattr(measure, "frozen_matmul_parameters", lambda model: 0)
    measured = measured_on("NVIDIA H100 80GB HBM3")
    results = {
        precision: result.of_trial(cuda_spec(precision=precision), Timed(), BERT_LARGE, measured)
        for precision in ("fp32", "tf32", "bf16")
    }
    assert {r.mfu_peak_tflops for r in results.values()} == {tensor_peak_tflops("H100")}
    assert tensor_peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4)
    assert len({r.mfu for r in results.values()}) == 1  # same steps: the same MFU
    flops = measure.training_flops(BERT_LARGE, Timed().measured_counts())
    assert results["fp32"].mfu == pytest.approx(flops / 0.2 / 989.4e12)
