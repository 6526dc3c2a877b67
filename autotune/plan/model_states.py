"""What one rank holds of the model states at the training peak: the weights, their gradients
and the optimizer's states, by the strategy that shares them between a trial's ranks
(`autotune.plan.estimate` adds the activations, the temporary buffers and the context).

On several devices a trial (`devices`), per rank, by the strategy (ZeRO's accounting,
Rajbhandari et al. 2020, with Psi parameters and N ranks; mixed-precision AdamW holds 16 B a
parameter: 4 fp32 weights, 4 gradients, 8 states):
- ddp: every rank holds all of it (16 Psi), and DDP's gradient buckets copy the gradients
  once more (4 Psi; PyTorch's default: none with `gradient_as_bucket_view`, where the
  gradients are views into the buckets);
- fsdp (FSDP2 full shard, ZeRO-3): 16 Psi / N, plus the gathered weights of the block that
  computes and the next one it prefetches, and one block's gradients before they are
  reduce-scattered;
- fsdp_grad_op (ZeRO-2-like): the same shards, but a block's gathered weights stay from its
  forward to its backward: at the peak, every block's.
- fsdp_offload: the 16 Psi / N of shards in host memory (`offloaded`); the device holds the
  gathered blocks and one block's gradients.
- zero1/zero2/zero3 (DeepSpeed): the model is trained in its precision's own bytes b (2 under
  fp16/bf16, which DeepSpeed casts the model to; 4 in fp32) and the optimizer holds an fp32
  copy of its partition besides its states: ZeRO-1 holds b Psi weights + b Psi gradients +
  12 Psi / N (4 Psi mixed precision + 12 Psi / N), ZeRO-2 b Psi + (b + 12) Psi / N, ZeRO-3
  (2 b + 12) Psi / N (16 Psi / N) plus two gathered blocks and one block's gradients;
- zero2_offload/zero3_offload: the optimizer's copy, its states and (ZeRO-2) the gradients'
  fp32 partition are in host memory (`offloaded`), ZeRO-3's weights too.
- tp (tensor parallelism, t ranks a group): the blocks' linear layers and the LM head are
  split t ways by the model's tensor-parallel plan (Llama's, Qwen2's: q/k/v/gate/up by
  column, o/down by row, the head by column), the rest (the norms; an untied input
  embedding) replicated; each rank holds 16 B of its share as one device would. With several
  groups (accelerate's `dp_shard`), FSDP2 shards each rank's share between the groups.
- pp (pipeline parallelism, never trained here: `knob_values.PIPELINE_REFUSAL`; estimated so
  that `autotune estimate` can say what it would need): the last stage, the one holding the
  LM head, holds its ceil(layers / N) blocks and the head, 16 B a parameter of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.common.knob_values import FSDP, OFFLOADED, ZERO_STAGES, sixteen_bit
from autotune.common.knobs import value_of

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
"""A bitsandbytes NF4 weight with double quantization (QLoRA, Dettmers et al. 2023, sec. 3):
4 bits, an 8-bit scale per block of 64 and an fp32 scale per 256 of those blocks (0.127 bits
a parameter for the constants): 0.516 bytes. bitsandbytes' `quantize_4bit` defaults to the
same blocks (64; `compress_statistics` quantizes their scales in blocks of 256)."""
INT8_BYTES = 1.0
"""A bitsandbytes LLM.int8 weight: a byte, and an fp32 scale per output row (4 / in_features
bytes a weight, under 0.2% of it for a 4096-wide layer: left out)."""
QUANTIZED_BYTES = {"none": None, "nf4": NF4_BYTES, "int8": INT8_BYTES}
BASE_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class RankStates:
    """Bytes of the model states one rank holds at the peak: on the device its weights (the
    gathered blocks and 16-bit copies included), gradients, optimizer states and DDP's gradient
    buckets; in host memory what offload keeps there."""

    weights: int
    gradients: int
    optimizer: int
    buckets: int = 0
    """DDP's gradient buckets: allocated with the wrapper, live throughout."""
    offloaded: int = 0
    counted: int
    """The strategy's formula for them, wherever they are (`Estimate.model_states`)."""


def rank_states(
    parameters: int,
    layers: int,
    optimizer: int,
    params: dict[str, Any],
    devices: int,
    split: int = 0,
    head: int = 0,
) -> RankStates:
    """What a rank of `devices` holds under `params["strategy"]` of a model of `parameters`
    in `layers` blocks, whose optimizer keeps `optimizer` bytes of states for all of them;
    `split`: the parameters a tensor-parallel plan splits (the blocks' linears, the head);
    `head`: the LM head's (a pipeline's last stage holds it)."""
    strategy = value_of(params, "strategy", devices=devices)
    mixed = sixteen_bit(value_of(params, "precision"))
    if strategy == "pp":
        stage = min(
            -(-layers // devices) * (parameters - head) // max(layers, 1) + head, parameters
        )
        optimizer = int(optimizer * stage / max(parameters, 1))
        return _replicated(stage, optimizer, mixed=mixed, ddp_buckets=False)
    if strategy == "tp":
        t = value_of(params, "tp_size", devices=devices)
        share = split // t + (parameters - split)  # as `Shape.tensor_parallel_share`
        optimizer = int(optimizer * share / max(parameters, 1))
        if devices > t:  # the groups shard each rank's share as FSDP2 does
            block = share // max(layers, 1)
            return _fsdp("fsdp", share, block, devices // t, optimizer, mixed=mixed)
        return _replicated(share, optimizer, mixed=mixed, ddp_buckets=False)
    block = parameters // max(layers, 1)  # one transformer block's parameters, about
    if strategy in FSDP:
        return _fsdp(strategy, parameters, block, devices, optimizer, mixed=mixed)
    if strategy in ZERO_STAGES:
        return _zero(strategy, parameters, block, devices, optimizer, mixed=mixed)
    bucket_view = value_of(params, "gradient_as_bucket_view")
    return _replicated(
        parameters, optimizer, mixed=mixed, ddp_buckets=strategy == "ddp" and not bucket_view
    )


def adapter_states(
    parameters: int, trained: int, quantized: int, optimizer: int, params: dict[str, Any]
) -> RankStates:
    """An adapter on a frozen base of `parameters` (`quantized` of them in the blocks' linear
    layers, which a quantized base stores in its own bytes): the base in `torch_dtype`'s bytes
    with no gradients and no optimizer states; the `trained` adapter parameters in fp32 (as
    peft keeps them, with autocast's 16-bit copies under mixed precision), their gradients and
    `optimizer`'s states. The same on every rank (an adapter's job is not sharded here)."""
    base = BASE_BYTES[value_of(params, "torch_dtype")]
    per_weight = QUANTIZED_BYTES[value_of(params, "quantization")]
    frozen = base * parameters
    if per_weight is not None:
        frozen = int(per_weight * quantized + base * (parameters - quantized))
    mixed = sixteen_bit(value_of(params, "precision"))
    weights = frozen + 4 * trained + (2 * trained if mixed else 0)
    return RankStates(
        weights=weights,
        gradients=4 * trained,
        optimizer=optimizer,
        counted=frozen + 8 * trained + optimizer,
    )


def _replicated(p: int, optimizer: int, *, mixed: bool, ddp_buckets: bool) -> RankStates:
    """One device, or DDP: every rank holds all of it, with the 16-bit copies autocast keeps
    under mixed precision and, with `ddp_buckets`, DDP's copy of the gradients."""
    return RankStates(
        weights=4 * p + (2 * p if mixed else 0),
        gradients=4 * p,
        optimizer=optimizer,
        buckets=4 * p if ddp_buckets else 0,
        counted=8 * p + optimizer,
    )


def _fsdp(
    strategy: str, p: int, block: int, devices: int, optimizer: int, *, mixed: bool
) -> RankStates:
    """FSDP2's shards, the gathered weights of the blocks that compute (every block's under
    fsdp_grad_op) and one block's gradients before they are reduce-scattered; under
    fsdp_offload every shard is in host memory."""
    gathered = 4 * (p if strategy == "fsdp_grad_op" else 2 * block)
    weights = 4 * p // devices + gathered + (2 * block if mixed else 0)
    gradients = 4 * p // devices + 4 * block
    optimizer //= devices
    counted = 8 * p // devices + optimizer
    if strategy == "fsdp_offload":  # every shard on the host; the blocks that compute here
        weights, gradients = weights - 4 * p // devices, 4 * block
        return RankStates(
            weights=weights, gradients=gradients, optimizer=0, offloaded=counted, counted=counted
        )
    return RankStates(weights=weights, gradients=gradients, optimizer=optimizer, counted=counted)


def _zero(
    strategy: str, p: int, block: int, devices: int, optimizer: int, *, mixed: bool
) -> RankStates:
    """DeepSpeed's: the model in b bytes a parameter, the optimizer's fp32 copy of its
    partition with its states; ZeRO-3's rank holds two blocks gathered (the one that computes,
    the one prefetched) and one block's gradients before they are reduced."""
    b = 2 if mixed else 4
    stage = ZERO_STAGES[strategy]
    weights = b * p if stage < 3 else b * p // devices + 2 * b * block
    gradients = b * p if stage == 1 else b * p // devices + (b * block if stage == 3 else 0)
    optimizer = 4 * p // devices + optimizer // devices
    host = 0
    if strategy in OFFLOADED:
        # On the host: the optimizer's copy and states, the gradients' fp32 partition it
        # updates from, and under ZeRO-3 the weights' partition (only gathered blocks stay).
        host = optimizer + 4 * p // devices
        optimizer = 0
        if stage == 3:
            host += weights - 2 * b * block
            weights = 2 * b * block
    # Not in the formula: ZeRO-3's two gathered blocks and one block's unreduced gradients.
    transient = 3 * b * block if stage == 3 else 0
    return RankStates(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        offloaded=host,
        counted=weights + gradients + optimizer + host - transient,
    )
