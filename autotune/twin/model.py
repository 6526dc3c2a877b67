"""The GPU twin's performance model: what one trial of a setting would measure on a named GPU,
from the model's shape, the GPU's datasheet and constants fitted on this project's own GPU
measurements (`constants.json`, each constant with its source).

Parent side and pure, like the memory estimate it builds on: no torch, no GPU. A step
(one optimizer step of `grad_accum` micro-batches of b samples of s tokens) is

- on the device, per micro-batch: the model's FLOPs (`estimate.flops_per_sample`, times the
  forward recomputed under checkpointing) at the precision's datasheet peak times an efficiency
  that grows with the tokens of the micro-batch and saturates (E x T / (T + tokens_half), both
  the GPU architecture's own where measurements fitted them: `per_architecture`), plus
  the memory-bound parts at the card's bandwidth: the elementwise traffic of each layer (2 bytes
  an element in 16-bit, 4 in fp32/tf32) and, with eager attention, the scores it writes and reads;
  then the optimizer step, memory-bound, at its bytes per parameter;
- on the host, per micro-batch: launching the kernels (eager PyTorch is launch-bound at small
  batches: a bf16 step at batch 8 took longer than a tf32 one on the H100), more of them under
  autocast and checkpointing, fewer compiled; per step the optimizer's launches (per tensor for
  the unfused ones) and the Trainer's own work;
- the step takes the longer of the two (the host runs ahead of the device), plus the Trainer's
  serial part per step.

Memory is the project's estimate (`plan.estimate`, which holds the CUDA context and compiled
activations, the terms the H100 showed it missed) times the allocator's overhead fitted on the
measured peaks. A trial's wall time: start (process, imports, CUDA), build (model, data,
Trainer; per parameter), compile (per layer, by mode), warm-up and timed steps. A setting past the
memory budget ends `oom` after its first step, a compiled one partway through its compile.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from autotune.common.device import bare_name, gpu_memory_bytes, peak_tflops
from autotune.common.knob_values import (
    FSDP,
    OFFLOADED,
    ZERO_STAGES,
    optimizer_family,
    precision_parts,
    sixteen_bit,
)
from autotune.common.knobs import is_compiled, value_of
from autotune.common.links import GpuLink
from autotune.common.trial import Status
from autotune.common.trial_settings import effective_batch, replicas
from autotune.common.units import GIB
from autotune.plan.estimate import CUDA_CONTEXT_BYTES, Shape, estimate, flops_per_sample, shape_of

CONSTANTS_FILE = "constants.json"

ARCHITECTURES = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell"}
"""A compute capability's major version -> its architecture (7.5 is Turing, 8.9 Ada: `Gpu`)."""

BORROWED_FROM = "hopper"
"""The architecture whose shares another borrows where it has none of its own: the only one
measured at every precision (this project's H100 and H200 runs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """The machine around the GPU: how fast its CPU launches kernels and starts a trial."""

    layer_host_ms: float
    """Host time to launch one transformer layer's kernels (forward and backward, eager, fp32)
    for one micro-batch, through the Trainer."""
    start_s: float
    """A trial's process start, imports, CUDA init and finish."""
    build_s_per_gparam: float
    """Building the model, data and Trainer, per billion parameters."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    key: str
    """The short name `gpu=` takes: H100, H200, A100-80GB, L4."""
    name: str
    """The name NVML reports: the peak table (`common.device.PEAK_TFLOPS`) is read by it."""
    memory_bytes: int
    bandwidth_gb_s: float
    link: GpuLink
    """Between two GPUs of the host (NVLink, else PCIe), as the probe would find it there."""
    compute_capability: str
    host: Host
    calibrated: bool = False
    """Whether measurements on this GPU (this project's, or published ones its points name)
    fitted its constants; otherwise its datasheet with the constants fitted on others."""

    @property
    def architecture(self) -> str:
        """hopper, ada, ampere, turing, volta: its matmul constants' key (`per_architecture`)."""
        major, minor = (int(part) for part in self.compute_capability.split("."))
        if (major, minor) == (7, 5):
            return "turing"
        if (major, minor) == (8, 9):
            return "ada"
        return ARCHITECTURES.get(major, BORROWED_FROM)

    @property
    def link_gb_s(self) -> float:
        """One direction of `link`: what DDP's all-reduce moves the gradients over."""
        assert self.link.gb_s is not None, f"the {self.key}'s link has no rate"
        return self.link.gb_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One optimizer step of a setting, in its parts (seconds)."""

    device_s: float
    host_s: float
    serial_s: float
    """The Trainer's per-step work the device waits for."""

    @property
    def seconds(self) -> float:
        return max(self.device_s, self.host_s) + self.serial_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What a trial of the setting would measure, and what it would cost."""

    status: Status
    """ok or oom (a timeout is the executor's call, from `wall_s` and its limit)."""
    samples_per_s: float | None
    step_s: float
    peak_gib: float
    """Peak reserved by PyTorch's allocator (what a trial reports), the context not included."""
    start_s: float
    build_s: float
    compile_s: float
    warmup_s: float
    """Warm-up steps (compile not included)."""
    timed_s: float
    wall_s: float


@cache
def constants() -> dict[str, Any]:
    return json.loads(resources.files("autotune.twin").joinpath(CONSTANTS_FILE).read_text())


def model_constant(name: str) -> Any:
    return constants()["model"][name]["value"]


def gpu_names() -> list[str]:
    return list(constants()["gpus"])


def gpu(key: str) -> Gpu:
    """A GPU the twin models, by its short name or its NVML name, whatever the case, spaces and
    hyphens (`H100`, `NVIDIA H100 80GB HBM3`, `titan rtx`); KeyError for one it does not model."""
    table = constants()["gpus"]
    wanted = bare_name(key)
    found = next(
        (k for k, g in table.items() if wanted in (bare_name(k), bare_name(g["name"]))), None
    )
    if found is None:
        raise KeyError(f"no GPU {key!r} in the twin (it models: {', '.join(table)})")
    entry = table[found]
    host = {k: v["value"] for k, v in constants()["hosts"][entry["host"]].items()}
    memory = gpu_memory_bytes(entry["name"])
    assert memory is not None, f"{entry['name']} is not in common.device.GPU_MEMORY_MIB"
    return Gpu(
        key=found,
        name=entry["name"],
        memory_bytes=memory,
        bandwidth_gb_s=entry["bandwidth_gb_s"],
        link=GpuLink(a=0, b=1, **entry["link"]),
        compute_capability=entry["compute_capability"],
        host=Host(**host),
        calibrated=entry["calibrated"],
    )


def per_architecture(v: dict[str, Any], name: str, g: Gpu, cls: str) -> float:
    """A matmul constant (`efficiency`, `tokens_half`) of `g`'s architecture at a precision
    class: its own where measurements fitted one, else `BORROWED_FROM`'s."""
    own = v[name].get(g.architecture, {})
    return own[cls] if cls in own else v[name][BORROWED_FROM][cls]


def link_bytes_per_s(g: Gpu, v: dict[str, Any]) -> float:
    """What NCCL moves between two of `g`'s GPUs each second, one direction: the link's rate,
    a share of it where the copies cross host memory (no P2P: NCCL_P2P_DISABLE=1, or a board
    that does not allow it)."""
    rate = g.link_gb_s * 1e9
    return rate if g.link.p2p else rate * v["staged_link_share"]


def _precision_class(precision: str) -> str:
    if sixteen_bit(precision):
        return "16bit"
    return "tf32" if "tf32" in precision_parts(precision) else "fp32"


def _checkpointed_share(params: dict[str, Any], shape: Shape) -> float:
    if not value_of(params, "gradient_checkpointing"):
        return 0.0
    every = value_of(params, "checkpointing_every_n_layers")
    return -(-shape.layers // every) / shape.layers


def step(
    g: Gpu,
    shape: Shape,
    *,
    task: str,
    seq_len: int,
    params: dict[str, Any],
    trainer: bool = True,
    devices: int = 1,
) -> Step:
    """One optimizer step of `params` on `g` (`trainer`: through the HF Trainer, as a trial
    runs; False: a plain PyTorch loop, as the calibration's headroom points ran), on each of
    `devices` GPUs under its strategy: DataParallel's copies (`_data_parallel_s`), or the
    collectives of DDP, FSDP and ZeRO over the link and the host traffic of the offloading
    ones (`_sharding_s`)."""
    v = {k: e["value"] for k, e in constants()["model"].items()}
    precision = value_of(params, "precision")
    cls = _precision_class(precision)
    compiled = is_compiled(params)
    share = _checkpointed_share(params, shape)
    t = value_of(params, "tp_size", devices=devices)  # 1 but under tensor parallelism
    micro_device_s = _micro_device_s(g, shape, v, task=task, seq_len=seq_len, params=params, t=t)
    if compiled:
        micro_device_s /= v["compiled_speed"]
    host_ms = g.host.layer_host_ms * shape.layers * (1 + v["checkpointing_host"] * share)
    if cls == "16bit":
        host_ms *= v["autocast_host"]
    if compiled:
        host_ms *= v["compiled_host"]
    if trainer:
        host_ms += v["trainer_micro_ms"]
    else:
        host_ms *= v["loop_host"]
    optimizer_device_s, optimizer_host_s = _optimizer_s(g, shape, v, params)
    accumulation, batch = value_of(params, "grad_accum"), value_of(params, "batch_size")
    strategy = value_of(params, "strategy", devices=devices)
    sharded = Sharding()
    if devices > 1 and strategy == "dp":
        logits = batch * seq_len * shape.vocab if task == "causal-lm" else 0
        micro_device_s += _data_parallel_s(g, shape, v, logits, devices)
        host_ms *= devices  # one process launches every replica's kernels, under one GIL
    elif devices > 1 and strategy == "tp":
        micro_device_s += _tensor_parallel_s(
            g, shape, v, task=task, seq_len=seq_len, params=params, t=t
        )
        host_ms *= v["tensor_parallel_host"]
        mine = shape.tensor_parallel_share(t)
        optimizer_device_s *= mine / shape.parameters
        groups = devices // t  # FSDP2 over the groups (accelerate's dp_shard), on each share
        sharded = _sharding_s(g, replace(shape, parameters=mine), v, "fsdp", groups, accumulation)
    else:
        sharded = _sharding_s(g, shape, v, strategy, devices, accumulation)
    if sharded.host_optimizer_s:  # the optimizer steps on the host, not on the GPU
        optimizer_device_s = optimizer_host_s = 0.0
    return Step(
        device_s=accumulation * micro_device_s
        + optimizer_device_s * sharded.optimizer_share
        + sharded.collectives_s,
        host_s=accumulation * host_ms / 1e3 + optimizer_host_s,
        serial_s=(v["trainer_step_ms"] / 1e3 if trainer else 0.0)
        + sharded.host_traffic_s
        + sharded.host_optimizer_s,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Sharding:
    """What a strategy adds to a step on each GPU, and what of the optimizer's it keeps."""

    collectives_s: float = 0.0
    """The collectives over the link the backward and forward do not hide."""
    optimizer_share: float = 1.0
    """The share of the optimizer's step each GPU makes (1/N where its states are sharded)."""
    host_traffic_s: float = 0.0
    """Offloaded: weights to the GPU and gradients back to the host, over its PCIe link."""
    host_optimizer_s: float = 0.0
    """Offloaded: the optimizer's step on the host's CPU, which the GPU waits for."""


def _sharding_s(
    g: Gpu, shape: Shape, v: dict[str, Any], strategy: str, devices: int, accumulation: int
) -> Sharding:
    """Ring collectives move (N - 1) / N of a tensor's bytes per GPU for a reduce-scatter or an
    all-gather, twice that for an all-reduce. DDP all-reduces the fp32 gradients once a step;
    ZeRO-1 and -2 reduce-scatter them and all-gather the updated weights (the same bytes);
    FSDP and ZeRO-3 all-gather each block's fp32 weights in the forward and again in the
    backward of every micro-batch (`fsdp_grad_op` keeps the forward's), and reduce-scatter the
    gradients. A share of it (`all_reduce_hidden`) overlaps the compute. Each GPU steps the
    optimizer on its 1/N of the states where they are sharded. The offloading strategies move
    the weights to the GPU and the gradients back over PCIe each step and run the optimizer on
    the host (`host_adam_s_per_gparam`)."""
    n = devices
    link = link_bytes_per_s(g, v) if n > 1 else 1.0
    weights, gradients = 4 * shape.parameters, 4 * shape.trained
    ring = (n - 1) / n
    if n == 1:
        moved = 0.0
    elif strategy in FSDP or strategy in ("zero3", "zero3_offload"):
        gathers = 1 if strategy == "fsdp_grad_op" else 2
        moved = ring * (gathers * accumulation * weights + gradients)
    else:  # ddp, single's reference, zero1, zero2, zero2_offload
        moved = 2 * ring * gradients
    sharded = strategy in FSDP or strategy in ZERO_STAGES
    offloaded = strategy in OFFLOADED
    host_traffic_s = (weights + gradients) / (v["host_link_gb_s"] * 1e9) if offloaded else 0.0
    host_optimizer_s = 0.0
    if offloaded:
        host_optimizer_s = v["host_adam_s_per_gparam"] * shape.trained / 1e9 / n
    return Sharding(
        collectives_s=moved / link * (1 - v["all_reduce_hidden"]),
        optimizer_share=1 / n if sharded else 1.0,
        host_traffic_s=host_traffic_s,
        host_optimizer_s=host_optimizer_s,
    )


def _tensor_parallel_s(
    g: Gpu, shape: Shape, v: dict[str, Any], *, task: str, seq_len: int, params: dict[str, Any],
    t: int,
) -> float:  # fmt: skip
    """What splitting the blocks `t` ways adds to a micro-batch on each GPU, none of it hidden
    (each block waits for it): the all-reduce of a block's b x s x h output after its attention
    and its MLP in the forward, and of their inputs' gradients in the backward (4 a block, as
    Megatron-LM's layout does; again in a checkpointed block's recompute), and at the LM head
    the logits gathered whole on every rank (`colwise_gather_output`) and its input's gradient
    all-reduced. An all-reduce moves 2 (t - 1) / t of its bytes per GPU on a ring, a gather
    (t - 1) / t."""
    batch = value_of(params, "batch_size")
    element = 2 if _precision_class(value_of(params, "precision")) == "16bit" else 4
    activation = batch * seq_len * shape.hidden * element
    ring = (t - 1) / t
    recomputed = _checkpointed_share(params, shape)
    moved = 2 * ring * activation * shape.layers * (4 + 2 * recomputed)
    if task == "causal-lm":
        moved += ring * batch * seq_len * shape.vocab * element + 2 * ring * activation
    return moved / link_bytes_per_s(g, v)


def _data_parallel_s(g: Gpu, shape: Shape, v: dict[str, Any], logits: int, devices: int) -> float:
    """What DataParallel adds to each micro-batch on GPU 0's side of the link, none of it
    hidden (the next step cannot start before it): copying the model's fp32 weights to the
    other GPUs (`replicate`, every forward) and summing their gradients onto GPU 0
    (`reduce_add`), each once over the link (NCCL's broadcast and reduce pipeline the others),
    and gathering their outputs (`logits`: a language model's, elements per replica, fp32):
    each other GPU's crosses it. Nothing of it is fitted: the guide's DataParallel row is
    predicted from the constants its DDP rows fitted (benchmarks/results/twin-calibration.md)."""
    gathered = 4 * logits * (devices - 1)
    return (4 * shape.parameters + 4 * shape.trained + gathered) / link_bytes_per_s(g, v)


def _micro_device_s(
    g: Gpu,
    shape: Shape,
    v: dict[str, Any],
    *,
    task: str,
    seq_len: int,
    params: dict[str, Any],
    t: int = 1,
) -> float:
    """The GPU's time for one micro-batch, eager: its matmuls at the precision's efficiency
    for this many tokens, and its memory traffic (eager attention's scores included); split
    `t` ways (tensor parallelism), a rank's 1/t of the matmuls and of the heads' and the MLP's
    elementwise traffic, the residual stream's whole (per layer 4 h-wide tensors whole, 4 h
    and 2 i split, as `estimate._layer_activations` keeps them)."""
    precision = value_of(params, "precision")
    cls = _precision_class(precision)
    batch = value_of(params, "batch_size")
    share = _checkpointed_share(params, shape)
    # The forward is 2 of training's 6 FLOPs per weight and token; of 4 on a frozen base.
    recompute = 1 + share / (3 if shape.adapter_parameters is None else 2)
    tokens = batch * seq_len
    peak = (peak_tflops(g.name, precision) or 0.0) * 1e12
    efficiency = per_architecture(v, "efficiency", g, cls)
    efficiency *= tokens / (tokens + per_architecture(v, "tokens_half", g, cls))
    matmul_s = batch * flops_per_sample(shape, seq_len, task) * recompute / (peak * efficiency) / t
    element = 2 if cls == "16bit" else 4
    h, i = shape.hidden, shape.intermediate
    split = (4 * h + (4 * h + 2 * i) / t) / (8 * h + 2 * i)
    traffic = v["traffic_bytes"] * shape.layers * shape.hidden * tokens * element * split
    if value_of(params, "attn_implementation") == "eager":
        scores = shape.layers * (shape.heads // t) * batch * seq_len**2
        traffic += v["eager_score_bytes"] * scores * element
    if value_of(params, "quantization") != "none":
        # bitsandbytes dequantizes each quantized weight to 16 bits in the forward and again in
        # the backward: read its packed bytes, write and read the 16-bit copy.
        quantized = shape.layers * shape.block_linear
        traffic += 2 * quantized * v["dequantize_bytes"]
    return matmul_s + traffic * recompute / (g.bandwidth_gb_s * 1e9)


def _optimizer_s(
    g: Gpu, shape: Shape, v: dict[str, Any], params: dict[str, Any]
) -> tuple[float, float]:
    """(GPU seconds, host seconds) of one optimizer step: its states' traffic (and fp16's
    gradient scaler), and a launch per parameter tensor."""
    precision = value_of(params, "precision")
    optimizer = v["optimizers"][_optimizer_kind(value_of(params, "optim"))]
    bandwidth = g.bandwidth_gb_s * 1e9
    device_s = optimizer["bytes"] * shape.trained / bandwidth
    if precision == "fp16" or "fp16" in precision_parts(precision):
        device_s += v["grad_scaler_bytes"] * shape.trained / bandwidth
    host_s = optimizer["host_us_per_tensor"] * _parameter_tensors(shape) * 1e-6
    return device_s, host_s


def _optimizer_kind(optim: str) -> str:
    """The optimizer's kernel kind, which its step time depends on: the rule and its kernels."""
    family = optimizer_family(optim)
    if family.startswith("Adafactor"):
        return "adafactor"
    if "torch_8bit" in optim or "torch_4bit" in optim:
        return "torchao_lowbit"
    if "8-bit" in family or "4-bit" in family:
        return "bnb_8bit"
    if "fused" in optim:
        return "fused"
    return "foreach"


def _parameter_tensors(shape: Shape) -> int:
    """Weights, biases and LayerNorms: about two tensors per matrix and two LayerNorms a layer."""
    return 2 * len(shape.matrices) + 4 * shape.layers


def compile_s(shape: Shape, params: dict[str, Any]) -> float:
    """The compile a compiled trial waits for in its first step: per layer, by mode."""
    if not is_compiled(params):
        return 0.0
    per_layer = model_constant("compile_s_per_layer")
    factor = (
        model_constant("max_autotune_compile")
        if "max-autotune" in str(value_of(params, "compile_mode"))
        else 1.0
    )
    return per_layer * shape.layers * factor


def peak_gib(
    config: dict[str, Any],
    shape: Shape,
    *,
    task: str,
    seq_len: int,
    params: dict[str, Any],
    devices: int = 1,
    adapter: dict[str, Any] | None = None,
) -> float:
    """The allocator's peak (one rank's): the project's estimate (context not included) times
    its overhead (fragmentation, cached blocks) fitted on measured peaks."""
    e = estimate(
        config,
        task=task,
        seq_len=seq_len,
        params=params,
        device="cuda",
        parameters=shape.parameters,
        devices=devices,
        adapter=adapter,
    )
    return e.budgeted * model_constant("reserved_over_estimate") / GIB


def predict(
    g: Gpu,
    config: dict[str, Any],
    *,
    task: str,
    seq_len: int,
    params: dict[str, Any],
    warmup_steps: int,
    measure_steps: int,
    parameters: int | None = None,
    memory_budget_bytes: int | None = None,
    trainer: bool = True,
    devices: int = 1,
    adapter: dict[str, Any] | None = None,
) -> Prediction:
    """One trial of `params` on `g` (on each of `devices` under DDP: `samples_per_s` is
    theirs together): ok with its figures, or oom past the budget (the card's memory less its
    CUDA context when no budget is given)."""
    shape = shape_of(config, parameters, adapter)
    s = step(g, shape, task=task, seq_len=seq_len, params=params, trainer=trainer, devices=devices)
    peak = peak_gib(
        config, shape, task=task, seq_len=seq_len, params=params, devices=devices, adapter=adapter
    )
    budget = memory_budget_bytes or g.memory_bytes - CUDA_CONTEXT_BYTES
    start_s = g.host.start_s
    build_s = g.host.build_s_per_gparam * shape.parameters / 1e9
    compiling_s = compile_s(shape, params)
    samples = effective_batch(params) * replicas(params, devices)
    if peak * GIB > budget:
        # The first step runs out of memory; compiled, when its forward graph has compiled.
        spent = compiling_s * model_constant("compile_before_oom") if compiling_s else s.seconds
        return Prediction(
            status=Status.OOM,
            samples_per_s=None,
            step_s=s.seconds,
            peak_gib=peak,
            start_s=start_s,
            build_s=build_s,
            compile_s=spent,
            warmup_s=0.0,
            timed_s=0.0,
            wall_s=start_s + build_s + spent,
        )
    warmup_s = warmup_steps * s.seconds
    timed_s = measure_steps * s.seconds
    return Prediction(
        status=Status.OK,
        samples_per_s=samples / s.seconds,
        step_s=s.seconds,
        peak_gib=peak,
        start_s=start_s,
        build_s=build_s,
        compile_s=compiling_s,
        warmup_s=warmup_s,
        timed_s=timed_s,
        wall_s=start_s + build_s + compiling_s + warmup_s + timed_s,
    )


def lognormal_factor(sigma: float, u1: float, u2: float) -> float:
    """exp(sigma x N(0, 1)) from two uniforms in (0, 1] (Box-Muller): the twin's noise."""
    return math.exp(sigma * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2))
