"""Facts about a trial's settings as a whole (knob -> value): whether they can train together,
the baseline's, which differences change the training itself, whether they are at least as
memory-hungry as settings that ran out of memory, and how they read in one line. Shared by
both sides: imports neither optuna nor torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune.common.knob_values import (
    BNB_OPTIMIZERS,
    FLASH_ATTENTION,
    FSDP,
    OFFLOADED,
    UNSHARDABLE_OPTIMIZERS,
    ZERO_STAGES,
    optimizer_family,
    sixteen_bit,
)
from autotune.common.knobs import KNOBS, active, left_out, value_of


def conflict(params: dict[str, Any]) -> str | None:
    """Why these settings cannot train together (an optimizer that cannot update sharded
    parameters), or None: asked before a trial runs, and by the worker itself."""
    strategy, optim = params.get("strategy"), params.get("optim")
    if (strategy in FSDP or strategy == "tp") and optim in UNSHARDABLE_OPTIMIZERS:
        return f"{optim} cannot update {strategy}'s sharded parameters (DTensors)"
    if (
        strategy in OFFLOADED
        and strategy in ZERO_STAGES
        and optim is not None
        and not optimizer_family(optim).startswith("AdamW")
    ):
        return f"{strategy} updates the weights with DeepSpeed's host AdamW, not {optim}"
    quantization = value_of(params, "quantization")
    if quantization != "none" and (strategy in FSDP or strategy in ZERO_STAGES or strategy == "tp"):
        return (
            f"a {quantization} base holds bitsandbytes' packed weights, which {strategy} does not "
            "shard here: quantize a base on one device"
        )
    attention, precision = params.get("attn_implementation"), value_of(params, "precision")
    if attention in FLASH_ATTENTION and not sixteen_bit(precision):
        return f"{attention} runs in fp16 or bf16, not {precision}"
    if strategy == "fsdp_offload" and optim in BNB_OPTIMIZERS:
        return f"fsdp_offload steps the optimizer on the host, where {optim}'s kernels cannot run"
    if strategy == "ddp" and params.get("ddp_static_graph") and value_of(params, "grad_accum") > 1:
        # pytorch/pytorch#143580: the accumulation steps' no_sync() trips an internal assert
        # in DDP's reducer on the first backward (accelerate#3679 is the Trainer's case).
        return (
            "ddp_static_graph with grad_accum > 1: DDP's reducer fails under the "
            "accumulation steps' no_sync() (pytorch/pytorch#143580)"
        )
    return None


def baseline_params(
    default_optim: str,
    effective_batch_size: int | None,
    *,
    own_data: bool = False,
    own_collator: bool = True,
    devices: int = 1,
) -> dict[str, Any]:
    """What `TrainingArguments(output_dir=...)` trains with: batch 8, fp32, the default
    optimizer, no checkpointing, SDPA attention, no compile; on the user's data (`own_data`)
    also no loader workers, no length grouping and padding to the longest sample (with
    autotune's collator); at the fixed effective batch when there is one (batch 8 when it
    divides it); on several devices a trial (`devices`), DDP, as torchrun runs them."""
    params = {
        k: knob.baseline
        for k, knob in KNOBS.items()
        if knob.baseline is not None
        and (own_data or not knob.data_only)
        and (own_collator or not knob.collator)
    }
    params["optim"] = default_optim
    if devices > 1:
        params["strategy"] = "ddp"
    if effective_batch_size:
        params["batch_size"] = math.gcd(params["batch_size"], effective_batch_size)
        params["grad_accum"] = effective_batch_size // params["batch_size"]
    return {k: params[k] for k in KNOBS if k in params}


@dataclass(frozen=True, kw_only=True, slots=True)
class MathChange:
    """A difference from the baseline that changes the training itself, not only its speed:
    results then differ from the HF defaults' (loss curve, tuned learning rate)."""

    setting: str
    """A knob, or `effective_batch_size` (batch_size x grad_accum)."""
    baseline: Any
    value: Any
    why: str

    def describe(self) -> str:
        return f"{self.setting} {self.baseline} -> {self.value}: {self.why}"


def effective_batch(params: dict[str, Any]) -> int:
    return value_of(params, "batch_size") * value_of(params, "grad_accum")


def replicas(params: dict[str, Any], devices: int) -> int:
    """The data-parallel copies a trial of `devices` trains, each on samples of its own: every
    device, but under `tp` one a tensor-parallel group (its ranks share each batch)."""
    return devices // value_of(params, "tp_size", devices=devices)


def math_changes(
    params: dict[str, Any], baseline: dict[str, Any], devices: int = 1
) -> list[MathChange]:
    """Every difference from the baseline's settings that changes what training computes:
    another effective batch (over a trial's `devices`' replicas), precision or optimizer.
    Kernels, checkpointing, compiling, loader settings and the strategy that shares the
    training between devices change speed and memory only, and are not listed."""
    changes = []
    before = effective_batch(baseline) * replicas(baseline, devices)
    after = effective_batch(params) * replicas(params, devices)
    if before != after:
        why = "another number of samples per optimizer update: retune the learning rate, "
        why += f"or keep it with effective_batch_size={before}"
        changes.append(
            MathChange(setting="effective_batch_size", baseline=before, value=after, why=why)
        )
    for name, knob in KNOBS.items():
        # A knob one of them leaves out trains as it would unset (a base not quantized).
        before, after = baseline.get(name, left_out(name)), params.get(name, left_out(name))
        if before is None or after is None or before == after:
            continue
        why = knob.math(before, after)
        if why is not None:
            changes.append(MathChange(setting=name, baseline=before, value=after, why=why))
    return changes


def describe_params(params: dict[str, Any]) -> str:
    """`bs=16 ga=2 gc=on bf16 adamw_torch`: a trial's settings in one short line."""
    return " ".join(KNOBS[k].show(v) for k, v in params.items())


def at_least_as_hungry(candidate: dict[str, Any], oom: dict[str, Any]) -> bool:
    """Every knob at least as memory-hungry as in a config that ran out of memory: a batch at
    least as large, checkpointing off where it was on. Knobs without a safe memory order
    (mixed precision keeps fp32 master weights) must match. A knob one of them leaves unset
    counts at its HF default (the baseline sets knobs a space may fix or leave out: its OOM
    stands for the proposals after it); one without effect in either (reentrant checkpointing
    with checkpointing off) is not compared."""
    for name, knob in KNOBS.items():
        if not (active(name, candidate) and active(name, oom)):
            continue
        value, limit = candidate.get(name, knob.baseline), oom.get(name, knob.baseline)
        if value == limit:
            continue
        if value is None or limit is None or knob.memory == "unordered":
            return False
        if knob.memory == "larger is hungrier" and value < limit:
            return False
        if knob.memory == "off is hungrier" and value and not limit:
            return False
    return True
