"""The estimate against what one H100 80GB measured (torch 2.11, bert-large-uncased, seq 512,
random init; ../shared/gpu/h100-2026-11-26/): a plain loop's peaks eager and under
`torch.compile`, and autotune's own baseline trial, allocator's and NVML's figures."""

import pytest

from autotune.common.models import catalogue_parameter_counts, resolve_model
from autotune.common.units import GIB
from autotune.plan.estimate import CUDA_CONTEXT_BYTES, Measured, calibrated_gib, estimate

BERT_LARGE = resolve_model("bert-large-uncased")
PARAMETERS = catalogue_parameter_counts()["bert-large-uncased"]
PLAIN_LOOP = {"optim": "adamw_torch_fused", "attn_implementation": "sdpa"}
"""headroom.py's loop: fused AdamW, SDPA, gradients set to None after each step."""


def on_cuda(params: dict, device: str = "cuda"):
    return estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params=params,
        device=device,
        parameters=PARAMETERS,
    )


def test_compiled_bf16_batch_64_is_estimated_near_the_63_gib_it_peaked_at_not_the_eager_37():
    """Measured (max_memory_allocated): 36.65 GiB eager, 63.4 compiled (inductor, default
    mode). The eager estimate runs 7% low at this batch (34.1; 7.5% at batch 128): 10% is its
    honest tolerance. The compile term is fitted on this very point (62.6): 5%. A trial
    measures max_memory_reserved, a few percent over the allocated figure."""
    eager = on_cuda(PLAIN_LOOP | {"precision": "bf16", "batch_size": 64})
    compiled = on_cuda(
        PLAIN_LOOP | {"precision": "bf16", "batch_size": 64, "torch_compile": "inductor"}
    )
    assert eager.budgeted / GIB == pytest.approx(36.65, rel=0.10)
    assert compiled.budgeted / GIB == pytest.approx(63.4, rel=0.05)
    assert compiled.activations > 1.9 * eager.activations
    assert (compiled.weights, compiled.optimizer) == (eager.weights, eager.optimizer)


def test_compile_on_cpu_is_estimated_as_eager_until_its_trials_say_otherwise():
    """The compile term was measured on CUDA only; on CPU its own trials correct it."""
    params = PLAIN_LOOP | {"precision": "bf16", "batch_size": 8}
    eager = on_cuda(params, device="cpu")
    assert on_cuda(params | {"torch_compile": "inductor"}, device="cpu") == eager


def test_the_bs_72_tf32_adafactor_inductor_setting_that_oomed_is_estimated_past_the_card():
    """It ran out of memory past the 78.66 GiB budget (78.35 GiB allocated when it failed),
    after an estimate of 61.0 GiB."""
    oomed = on_cuda(
        {
            "batch_size": 72,
            "grad_accum": 4,
            "precision": "tf32",
            "optim": "adafactor",
            "torch_compile": "inductor",
            "compile_mode": "default",
            "attn_implementation": "sdpa",
        }
    )
    assert oomed.budgeted / GIB > 79.18, "more than the whole card"


def test_the_baseline_estimate_compares_with_the_allocators_peak_and_nvmls_process():
    """Trial 0 (bs 8, fp32): 10.30 GiB reserved by PyTorch's allocator (its peak_memory_gib,
    what the budget caps), 11.02 GiB for the whole process per NVML (nvml_used_gib): the 0.72
    between them is the CUDA context."""
    baseline = on_cuda(PLAIN_LOOP | {"precision": "fp32", "batch_size": 8, "grad_accum": 1})
    assert baseline.budgeted == baseline.total - CUDA_CONTEXT_BYTES
    assert baseline.budgeted / GIB == pytest.approx(10.30, rel=0.03)
    assert baseline.total / GIB == pytest.approx(11.02, rel=0.03)
    cpu = on_cuda(PLAIN_LOOP | {"batch_size": 8}, device="cpu")
    assert cpu.budgeted == cpu.total, "on CPU the measured peak holds the runtime's memory"


def test_a_compiled_setting_is_calibrated_on_compiled_trials_when_there_are_some():
    eager_trial = Measured(params={"batch_size": 8}, estimate_gib=10.0, peak_gib=10.5)
    compiled_trial = Measured(
        params={"batch_size": 8, "torch_compile": "inductor"}, estimate_gib=20.0, peak_gib=16.0
    )
    trials = [eager_trial, compiled_trial]
    other_compiled = {"batch_size": 8, "torch_compile": "inductor", "precision": "bf16"}
    assert calibrated_gib(other_compiled, 30.0, trials) == pytest.approx(26.0)
    assert calibrated_gib({"batch_size": 8, "precision": "bf16"}, 30.0, trials) == 30.5
    # No compiled trial yet: the eager ones' median gap, as before.
    assert calibrated_gib(other_compiled, 30.0, [eager_trial]) == pytest.approx(30.5)
