"""Training on ranks: what a rank does with the strategy its trial names, whoever started it
(`ranks.run` forks them on this host; torchrun or a cluster's scheduler would start them
elsewhere, each learning who it is from its environment: `ranks.Rank.from_torchrun`).

FSDP2 shards the model block by block (`shard`), DDP's own settings go on the Trainer's
accelerator (`set_ddp`), each rank counts the model states it holds (`ModelStates`), and the
ranks' figures are gathered on every rank (`gather`), where a strategy that did not apply (a
silent fallback of the framework) raises `StrategyNotApplied`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainingArguments

from autotune.child.measure import Counts, numel
from autotune.child.ranks import Rank
from autotune.common.knob_values import OFFLOADED, SHARDED, ZERO_STAGES
from autotune.common.units import GIB


class StrategyNotApplied(Exception):
    """The framework trained with another strategy than the trial's (a silent fallback)."""


def check_data_parallel(trainer: Any, devices: int) -> None:
    """A `dp` trial trained through `torch.nn.DataParallel` over its `devices` GPUs, as the
    Trainer wraps the model where one process sees several (`args.n_gpu`); anything else is a
    silent fallback to fewer GPUs (StrategyNotApplied)."""
    wrapped, n_gpu = trainer.model_wrapped, trainer.args.n_gpu
    if isinstance(wrapped, torch.nn.DataParallel) and n_gpu == devices:
        return
    raise StrategyNotApplied(
        f"dp asked, but the Trainer trained {type(wrapped).__name__} on n_gpu={n_gpu} of the "
        f"trial's {devices} GPUs"
    )


class ShardedArguments(TrainingArguments):
    """The TrainingArguments of a rank whose model FSDP2 shards, with the Trainer left
    undistributed: the model stays where it was built (the host) until `fully_shard` moves
    each block's shard to the rank's device, one block at a time (so no rank ever holds the
    whole model there; offloaded, the shards stay on the host), and the Trainer trains on its
    one device, never DataParallel over its worker's others."""

    @property
    def place_model_on_device(self) -> bool:
        return False

    @property
    def n_gpu(self) -> int:
        return 0 if self.use_cpu else 1


def set_ddp(rank: Rank, trainer: Any) -> None:
    """DDP's settings that TrainingArguments has no field for, on the Trainer's accelerator
    before it wraps the model (at `train()`)."""
    if rank.strategy == "ddp" and rank.bucket_view:
        trainer.accelerator.ddp_handler.gradient_as_bucket_view = True


def shard(rank: Rank, model: torch.nn.Module, prefetch: bool = False) -> None:
    """FSDP2 on each transformer block (the model's `_no_split_modules`), then on the model;
    with `prefetch` (the `fsdp_prefetch` knob) each block also starts gathering the next
    one's parameters in its forward and the previous one's in its backward (FSDP2 otherwise
    prefetches in the backward only)."""
    if not rank.fsdp:
        return
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    reshard = rank.strategy != "fsdp_grad_op"
    # Offloaded, each shard lives in pinned host memory and the optimizer steps there.
    offload = {"offload_policy": CPUOffloadPolicy()} if rank.strategy == "fsdp_offload" else {}
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in list(model.modules())[1:] if type(m).__name__ in names]
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, **offload)
    fully_shard(model, reshard_after_forward=reshard, **offload)
    if prefetch:
        for before, after in itertools.pairwise(blocks):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a parameter: FSDP2's local shard of a DTensor, ZeRO-3's
    partition (`ds_tensor`), or the tensor itself."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def local_parameters(model: torch.nn.Module) -> int:
    """The parameters this rank holds: a shard's local part for sharded ones."""
    return sum(_local(p).numel() for p in model.parameters())


def full_parameters(model: torch.nn.Module) -> int:
    """The model's parameters, however they are sharded."""
    return sum(numel(p) for p in model.parameters())


def trainable_parameters(model: torch.nn.Module) -> int:
    """The parameters that train (an adapter's alone on a frozen base), however sharded."""
    return sum(numel(p) for p in model.parameters() if p.requires_grad)


def _bytes(tensors: Any) -> int:
    """What this rank holds of these tensors (of each sharded one, its local part)."""
    local = [_local(t) for t in tensors if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in local)


class ModelStates(TrainerCallback):
    """Counts what this rank holds of the weights, their gradients and the optimizer's states,
    tensor by tensor (its local part of a sharded one); DDP's gradient buckets, DeepSpeed's
    reduce buffers and autocast's 16-bit copies are not model states. The gradients are counted
    once, in the first (warm-up) step, where they are all held: before the optimizer step, and
    under ZeRO-1 at the end of the backward (its full gradients, before they are reduced to
    this rank's partition); the rest after training (the optimizer makes its states at its
    first step). Under DeepSpeed, the optimizer's fp32 partition of the weights counts too."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.gradient_bytes: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = self.trainer.model_wrapped
        if type(engine).__name__ != "DeepSpeedEngine":
            return
        # DeepSpeed's engine steps inside the Trainer's backward: the Trainer's optimizer
        # callbacks come after it. Its own calls are wrapped instead, for the first step only.
        if engine.zero_optimization_stage() == 1:
            self._count_before(engine, "allreduce_gradients", self._parameter_gradients)
        else:
            self._count_before(engine.optimizer, "step", self._deepspeed_partition)

    def _count_before(self, owner: Any, name: str, count: Callable[[], int]) -> None:
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.gradient_bytes is None:
                self.gradient_bytes = count()
            return original(*args, **kwargs)

        setattr(owner, name, counted)

    def _parameter_gradients(self) -> int:
        model = self.trainer.model
        return _bytes(p.grad for p in model.parameters() if p.grad is not None)

    def _deepspeed_partition(self) -> int:
        optimizer = self.trainer.model_wrapped.optimizer
        flat = getattr(optimizer, "grad_partitions_flat_buffer", None)  # ZeRO-3
        if flat is not None:
            return _bytes([flat])
        averaged = getattr(optimizer, "averaged_gradients", {})  # ZeRO-2: group -> partition
        return _bytes(t for group in averaged.values() for t in group or ())

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.gradient_bytes is None:
            self.gradient_bytes = self._parameter_gradients()

    def total_bytes(self) -> int | None:
        """None where the optimizer's holdings are not known (DeepSpeed's BF16_Optimizer)."""
        model = self.trainer.model
        optimizer = self.trainer.optimizer
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
        master: list[torch.Tensor] = []
        if type(self.trainer.model_wrapped).__name__ == "DeepSpeedEngine":
            inner = self.trainer.model_wrapped.optimizer  # its ZeRO optimizer
            master = _master_weights(inner)
            if not master:
                return None
            inner = inner.optimizer  # the torch optimizer that updates the partition
        states = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
        # ZeRO-3 keeps small parameters whole on every rank besides their partition.
        whole = [p.data for p in model.parameters() if getattr(p, "ds_persist", False)]
        return (
            _bytes(model.parameters())
            + _bytes(whole)
            + (self.gradient_bytes or 0)
            + _bytes(master)
            + _bytes(states)
        )


@dataclass(frozen=True, slots=True)
class Gathered:
    counts: Counts
    """What every rank's loader gave the timed steps, summed."""
    peak_memory_gib: list[float]
    params: list[int]
    model_state_bytes: list[int | None]


def gather(
    rank: Rank, trainer: Any, counts: Counts, peak_memory_gib: float, states: ModelStates
) -> Gathered:
    """Every rank's figures, on every rank; raises StrategyNotApplied when the training was
    not the strategy asked."""
    mine = (
        counts.astuple(),
        peak_memory_gib,
        local_parameters(trainer.model),
        full_parameters(trainer.model),
        _applied(trainer, rank.on_cuda),
        states.total_bytes(),
    )
    everyone: list[Any] = [None] * rank.world_size
    dist.all_gather_object(everyone, mine)
    params = [theirs[2] for theirs in everyone]
    full = everyone[0][3]
    _check_applied(rank, params, full, [theirs[4] for theirs in everyone])
    # A tensor-parallel group's ranks train on the same samples (accelerate hands rank r the
    # batch of r // tp_size): one rank a group counts them.
    counted = everyone[:: rank.tensor_parallel[0]] if rank.tensor_parallel else everyone
    return Gathered(
        counts=Counts(*(sum(c) for c in zip(*(theirs[0] for theirs in counted), strict=True))),
        peak_memory_gib=[theirs[1] for theirs in everyone],
        params=params,
        model_state_bytes=[theirs[5] for theirs in everyone],
    )


def _applied(trainer: Any, on_cuda: bool) -> str:
    """What the Trainer trained: its wrapper, with DeepSpeed's ZeRO stage and, training on a
    GPU, which model states it kept in host memory (where they are, not what was asked)."""
    wrapped = trainer.model_wrapped
    name = type(wrapped).__name__
    if getattr(wrapped, "gradient_as_bucket_view", False):  # DDP's
        return f"{name} gradients as bucket views"
    if name != "DeepSpeedEngine":
        sharded = [p for p in trainer.model.parameters() if hasattr(p, "to_local")]
        if on_cuda and sharded and all(_local(p).device.type == "cpu" for p in sharded):
            name += " parameters on host"  # FSDP2's offload
        return name
    applied = f"{name} ZeRO-{wrapped.zero_optimization_stage()}"
    if not on_cuda:
        return applied
    master = _master_weights(wrapped.optimizer)
    if master and master[0].device.type == "cpu":
        applied += " optimizer on host"
    if any(
        p.ds_tensor.device.type == "cpu"
        for p in trainer.model.parameters()
        if hasattr(p, "ds_tensor")
    ):
        applied += " parameters on host"
    return applied


def _master_weights(optimizer: Any) -> list[torch.Tensor]:
    """DeepSpeed's fp32 partition of the weights, which its optimizer updates."""
    return (
        getattr(optimizer, "single_partition_of_fp32_groups", None)  # ZeRO-1/2
        or getattr(optimizer, "fp32_partitioned_groups_flat", None)
        or []
    )


def _expected_wrapper(strategy: str, on_cuda: bool, bucket_view: bool = False) -> str | None:
    """The wrapper a strategy trains under; None: the model itself (FSDP2 turns the model's
    own class into a sharded one)."""
    if strategy == "ddp":
        return "DistributedDataParallel" + " gradients as bucket views" * bucket_view
    if strategy not in ZERO_STAGES:
        return None
    expected = f"DeepSpeedEngine ZeRO-{ZERO_STAGES[strategy]}"
    if on_cuda and strategy in OFFLOADED:
        expected += " optimizer on host"
    if on_cuda and strategy == "zero3_offload":
        expected += " parameters on host"
    return expected


def _check_applied(rank: Rank, params: list[int], full: int, applied: list[str]) -> None:
    """The strategy asked is the strategy run: every rank under its wrapper (none where the
    strategy has none), its shards on the host where it offloads them, holding all the
    parameters or, sharded, a part of them (ZeRO-3 pads its partitions: they may add up to a
    little more)."""
    expected = _expected_wrapper(rank.strategy, rank.on_cuda, rank.bucket_view)
    if expected is None:
        host = rank.on_cuda and rank.strategy == "fsdp_offload"
        wrapped = any(
            a.startswith(("DistributedDataParallel", "DeepSpeed"))
            or a.endswith(" parameters on host") != host
            for a in applied
        )
    else:
        wrapped = any(a != expected for a in applied)
    if rank.strategy in SHARDED:  # of one rank (offloading on one GPU): every parameter
        held = sum(params) >= full and (len(params) == 1 or max(params) < full)
    else:
        held = all(p == full for p in params)
    if wrapped or not held:
        raise StrategyNotApplied(
            f"{rank.strategy} asked, but the ranks trained {applied} "
            f"holding {params} of {full} parameters"
        )


def barrier_sync(on_cuda: bool) -> Callable[[], None]:
    """Before a clock read: the device's work done, on every rank."""

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()
        dist.barrier()

    return sync


def peak_rss_gib_since(baseline_bytes: int) -> float:
    return (_vm_hwm_bytes() - baseline_bytes) / GIB


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (VmHWM) to its current size, which it returns: a forked
    rank starts with its parent's peak."""
    Path("/proc/self/clear_refs").write_text("5")
    return _vm_hwm_bytes()


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")
