"""The timing window and memory peaks of one trial (worker side).

Shape of the measurement, as in nanoGPT's bench.py: untimed warm-up steps first, the device
synchronised before each clock read, and only whole optimizer steps inside the timed window.
The Trainer's own `train_samples_per_second` includes warm-up and start-up, so it is not used.
"""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from autotune.knobs import precision_parts, sixteen_bit


class StepTimer(TrainerCallback):
    """Records the clock at the end of every optimizer step.

    Batches are fetched before `on_step_begin`, so step boundaries are taken end to end: the
    interval from the end of step k to the end of step k+1 holds everything step k+1 costs,
    data loading included. Warm-up step w's end opens the timed window.
    """

    def __init__(self, warmup_steps: int, synchronize: Callable[[], None] = lambda: None):
        if warmup_steps < 1:
            raise ValueError("warmup_steps must be >= 1: the first step's end opens the window")
        self.warmup_steps = warmup_steps
        self.synchronize = synchronize
        self.train_begin_s: float | None = None
        self.step_end_s: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.synchronize()
        self.train_begin_s = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.synchronize()
        self.step_end_s.append(time.perf_counter())

    def measured_step_times_s(self) -> list[float]:
        ends = self.step_end_s[self.warmup_steps - 1 :]
        return [later - earlier for earlier, later in itertools.pairwise(ends)]

    def warmup_step_times_s(self) -> list[float]:
        """The untimed steps; the first runs from the start of training (compile lands here)."""
        assert self.train_begin_s is not None, "on_train_begin was not called"
        ends = [self.train_begin_s, *self.step_end_s[: self.warmup_steps]]
        return [later - earlier for earlier, later in itertools.pairwise(ends)]


def eta_s(step_end_s: list[float], total_steps: int) -> float | None:
    """Seconds until step `total_steps` ends, from the clock readings at each step end so far.

    The first step runs from the start of training and holds what is paid once (compiling, the
    allocator's first growth, lazy initialisation): it would make the estimate many times too
    long, so only the steps after it count, as their median, which one slow step does not move.
    None until a step after the first has ended.
    """
    if len(step_end_s) < 2:
        return None
    typical_s = statistics.median(b - a for a, b in itertools.pairwise(step_end_s))
    return (total_steps - len(step_end_s)) * typical_s


def compile_s(warmup_step_times_s: list[float], median_step_s: float) -> float:
    """Time the warm-up spent beyond ordinary steps: graph capture and compilation."""
    return sum(max(0.0, t - median_step_s) for t in warmup_step_times_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float
    step_time_median_ms: float
    step_time_cv: float
    measured_steps: int


def throughput(step_times_s: list[float], *, samples_per_step: int, seq_len: int) -> Throughput:
    """Throughput over the timed steps; `samples_per_step` is micro batch x grad accumulation."""
    if len(step_times_s) < 2:
        raise ValueError(f"need at least 2 timed steps, got {len(step_times_s)}")
    total_s = sum(step_times_s)
    samples_per_s = samples_per_step * len(step_times_s) / total_s
    return Throughput(
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * seq_len,
        step_time_median_ms=statistics.median(step_times_s) * 1e3,
        step_time_cv=statistics.stdev(step_times_s) / statistics.fmean(step_times_s),
        measured_steps=len(step_times_s),
    )


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- model FLOPs and MFU ----


def matmul_parameters(model: Any) -> int:
    """Weights that take part in a matrix multiply per token (Linear and GPT-2's Conv1D).

    Counted per module, so a tied LM head counts: its matmul runs even though the weight is the
    embedding's. Embedding lookups, norms and biases do no matmul and are left out.
    """
    import torch
    from transformers.pytorch_utils import Conv1D

    return sum(
        module.weight.numel()
        for module in model.modules()
        if isinstance(module, torch.nn.Linear | Conv1D)
    )


def attention_layers(config: Any) -> tuple[int, int]:
    """(attention blocks over the sequence, width of Q.K^T): cross-attention counts as a block."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None)
    width = heads * head_dim if head_dim else config.hidden_size
    if config.is_encoder_decoder:
        decoder = getattr(config, "num_decoder_layers", None) or config.num_hidden_layers
        return config.num_hidden_layers + 2 * decoder, width
    return config.num_hidden_layers, width


def flops_per_sample(model: Any, seq_len: int) -> float:
    """Training FLOPs for one sample (forward + backward), after PaLM's appendix B.

    6 FLOPs per matmul weight per token (2 forward, 4 backward), plus the attention scores and
    the weighted sum, 12 x seq_len x width per token per attention block. Encoder-decoder models
    see seq_len tokens on each side. Activation checkpointing recomputes the forward but does
    not change the model's FLOPs, so MFU does not reward it.
    """
    blocks, width = attention_layers(model.config)
    return 6 * matmul_parameters(model) * seq_len + 12 * blocks * width * seq_len**2


# Dense peak TFLOP/s (no 2:4 sparsity) from NVIDIA datasheets and whitepapers, keyed by a
# piece of the NVML name; the first match wins, so specific names come first. GeForce parts
# accumulate 16-bit matmuls in fp32 at half rate: that rate is the one PyTorch gets.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "16bit": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "16bit": 835.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "16bit": 989.4}),
    ("H200", {"fp32": 66.9, "tf32": 494.7, "16bit": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "16bit": 312.0}),
    ("A10G", {"fp32": 31.2, "tf32": 62.5, "16bit": 125.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "16bit": 362.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "16bit": 121.0}),
    ("V100-PCIE", {"fp32": 14.0, "tf32": 14.0, "16bit": 112.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "16bit": 125.0}),
    ("T4", {"fp32": 8.1, "tf32": 8.1, "16bit": 65.0}),
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "16bit": 71.0}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "16bit": 165.2}),
)


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak for the precision in use, or None for a device not in the table."""
    key = (
        "16bit"
        if sixteen_bit(precision)
        else "tf32"
        if "tf32" in precision_parts(precision)
        else "fp32"
    )
    for piece, peaks in PEAK_TFLOPS:
        if piece.lower() in device_name.lower():
            return peaks[key]
    return None
