"""Before the first trial: the least time the work takes at the fastest this device computes,
and a warning when the baseline cannot fit or cannot finish in time."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.models import resolve_model
from autotune.outputs.view import expectations
from autotune.plan.estimate import flops_per_sample, shape_of
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan

GIB = 2**30


def cpu(tflops: float | None) -> DeviceInfo:
    return DeviceInfo(
        cuda_available=False,
        name="cpu",
        total_memory_bytes=64 * GIB,
        free_memory_bytes=60 * GIB,
        cpu_name="cpu",
        host_available_memory_bytes=60 * GIB,
        host_total_memory_bytes=64 * GIB,
        matmul_tflops=tflops,
    )


def plan_for(device, *settings, tmp_path):
    config = load_config(["model=bert-large-uncased", "seq_len=512", f"out={tmp_path}", *settings])
    return make_plan(config, device)


def test_the_floor_is_the_baselines_flops_at_the_devices_rate(tmp_path):
    plan = plan_for(cpu(1.0), tmp_path=tmp_path)
    seconds, rate = plan.compute_floor_s(plan.baseline)
    # bert-large at 512 tokens, classification: 1.01 TFLOP per sample; 13 steps of batch 8.
    assert rate == 1.0 and seconds == pytest.approx(13 * 8 * 1.01e12 / 1e12, rel=0.01)
    (line,) = expectations(plan)  # it fits, and within trial_timeout: no warning
    assert line.startswith("time: the baseline's 13 steps need at least 104.5 s of compute at ")
    assert "1 TFLOP/s (this CPU's fp32 matmul rate, measured;" in line
    assert plan_for(cpu(None), tmp_path=tmp_path).compute_floor_s(plan.baseline) is None
    assert (
        plan_for(cpu(None), "peak_tflops=2", tmp_path=tmp_path).compute_floor_s(plan.baseline)[1]
        == 2
    )


def test_a_baseline_that_cannot_finish_or_fit_is_said_before_it_runs(tmp_path):
    plan = plan_for(cpu(0.1), "trial_timeout=10m", "memory_budget=8GiB", tmp_path=tmp_path)
    _, slow, big = expectations(plan)
    assert slow == (
        "[yellow]warning:[/] the baseline needs at least 17.4 min of compute, over "
        "trial_timeout=10.0 min: it and every larger trial will time out; raise trial_timeout, "
        "or lower measure_steps or seq_len"
    )
    # A reference that fits is run after it: the guides' low-memory recipe on the defaults.
    assert big == (
        "the HF defaults do not fit: the baseline is estimated at 17.35 GiB, over the 8.00 GiB "
        "budget; a reference runs after it, the guides' low-memory recipe on the defaults "
        "(checkpointing, batch 1 x 8 accumulation), and speedups are told against it"
    )
    assert plan.reference().params == plan.baseline | {
        "gradient_checkpointing": True,
        "batch_size": 1,
        "grad_accum": 8,
    }


def test_a_baseline_that_cannot_fit_even_by_the_low_memory_recipe_is_warned_of(tmp_path):
    plan = plan_for(cpu(0.1), "memory_budget=1GiB", tmp_path=tmp_path)
    assert plan.reference() is None
    big = expectations(plan)[-1]
    assert big.startswith("[yellow]warning:[/] the baseline (HF defaults) is estimated at ")
    assert big.endswith("lower seq_len, or search where it fits")


def test_a_gpu_uses_its_datasheet_peak_for_the_precision():
    h100 = DeviceInfo(
        cuda_available=True,
        name="NVIDIA H100 80GB HBM3",
        total_memory_bytes=80 * GIB,
        free_memory_bytes=80 * GIB,
    )
    assert h100.compute_tflops("cuda", "fp32") == 66.9
    assert h100.compute_tflops("cuda", "bf16") == 989.4


def test_a_classifier_does_no_matmul_with_its_vocabulary():
    shape = shape_of(resolve_model("google/bert_uncased_L-2_H-128_A-2").config)
    classify = flops_per_sample(shape, 64, "sequence-classification")
    assert classify == pytest.approx(
        6 * 64 * (8 * 128 * 128 + 4 * 128 * 512) + 12 * 2 * 128 * 64**2
    )
    assert flops_per_sample(shape, 64, "masked-lm") == pytest.approx(
        classify + 6 * 64 * 30522 * 128
    )


def test_an_adapters_reference_adds_the_bases_savers_until_its_estimate_fits(tmp_path):
    # Llama-3.1-8B with LoRA at seq_len 2048: checkpointing at batch 1 in fp32 does not fit
    # 24 GiB (its fp32 base alone is 30 GiB); a bf16 base does not either; a 4-bit one does.
    device = dataclasses.replace(cpu(None), bf16_supported=True)
    config = load_config(
        [
            "model=meta-llama/Llama-3.1-8B",
            "peft=lora",
            "seq_len=2048",
            "memory_budget=20GiB",
            f"out={tmp_path}",
        ]
    )
    reference = make_plan(config, device).reference()
    assert reference is not None
    assert (
        reference.recipe
        == "checkpointing, batch 1 x 8 accumulation, a bf16 base, a 4-bit (NF4) base"
    )
    assert reference.params["quantization"] == "nf4" and reference.params["torch_dtype"] == "bf16"
