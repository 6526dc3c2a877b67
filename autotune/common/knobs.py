"""The knob catalogue: everything autotune knows about each training setting, in one place.

Shared by both sides (the parent samples, skips, displays and exports; the worker trains), so it
imports neither optuna nor torch. A knob's entry says which values it takes, how it reads in a
short settings line, what it sets in `TrainingArguments` (or on the model), its HF default (the
baseline), and how it orders memory use (for skipping configs at least as hungry as an OOM).
Adding a knob is one entry here plus the spaces that search it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp16+tf32", "bf16+tf32", "fp8")
"""`fp8`: accelerate's fp8 training (torchao's Float8Linear for the linear layers' matmuls,
bf16 autocast for the rest), set through its environment: GPUs of compute capability 8.9+."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
FLASH_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
"""The `flash-attn` package's kernels (FlashAttention 2; 3 on Hopper): CUDA, fp16/bf16."""
STRATEGIES = (
    "single", "ddp", "fsdp", "fsdp_grad_op", "fsdp_offload", "zero1", "zero2", "zero3",
    "zero2_offload", "zero3_offload",
)  # fmt: skip
"""How a trial's ranks share the training (`devices_per_trial`): `single` is one device;
`ddp` replicates the model and averages gradients (what torchrun + the HF defaults do);
`fsdp` shards parameters, gradients and optimizer states across the ranks (FSDP2
`fully_shard`), gathering each block's parameters for its forward and backward;
`fsdp_grad_op` keeps the gathered parameters from the forward to the backward (one gather
fewer a step, more memory: ZeRO-2-like); `fsdp_offload` is `fsdp` with every shard (weights,
gradients, optimizer states) in host memory and the optimizer stepping there (FSDP2's
`CPUOffloadPolicy`): the device holds only the blocks that compute. `zero1`/`zero2`/`zero3`
are DeepSpeed's ZeRO stages (optimizer states; and gradients; and parameters sharded),
`zero2_offload`/`zero3_offload` the same with the optimizer (and ZeRO-3's parameters) kept in
host memory."""
FSDP = frozenset({"fsdp", "fsdp_grad_op", "fsdp_offload"})
"""Strategies applied by FSDP2's `fully_shard`."""
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3, "zero2_offload": 2, "zero3_offload": 3}
"""DeepSpeed's strategies and their ZeRO stage (DeepSpeed is an optional extra)."""
OFFLOADED = frozenset({"fsdp_offload", "zero2_offload", "zero3_offload"})
"""Strategies that keep model states in host memory: for a GPU that cannot hold them."""
SHARDED = FSDP | {"zero3", "zero3_offload"}
"""Strategies under which each rank holds 1/N of the parameters."""
MEMORY_ORDER = (
    "ddp", "zero1", "zero2", "fsdp_grad_op", "fsdp", "zero3", "zero2_offload", "fsdp_offload",
    "zero3_offload",
)  # fmt: skip
"""The strategies on several devices from the most model states a rank holds in device memory
to the least: DDP all of them; ZeRO-1 the optimizer's share; ZeRO-2 the gradients' too; full
sharding (FSDP's two modes, ZeRO-3) the weights' too; offload moves them to the host. At the
peak FSDP's grad-op mode also holds every block's gathered weights, from forward to backward;
FSDP's offload gathers its blocks in fp32, ZeRO-3's in the training precision."""
BNB_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})  # fmt: skip
"""TrainingArguments.optim values backed by bitsandbytes: their kernels update tensors on a
GPU."""
TORCHAO_OPTIMIZERS = frozenset({"adamw_torch_8bit", "adamw_torch_4bit"})
"""TrainingArguments.optim values backed by torchao's low-bit AdamW (an optional extra): its
states quantised to 8 or 4 bits, on CPU and GPU."""
UNSHARDABLE_OPTIMIZERS = frozenset({"adafactor"})
"""Optimizers whose update cannot run on FSDP2's sharded parameters (DTensors): transformers'
Adafactor mixes them with plain tensors ("got mixed torch.Tensor and DTensor")."""


def deepspeed_config(strategy: str, overlap_comm: bool | None = None) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO strategy, as the Trainer takes it (`deepspeed=`): the
    batch, accumulation, clipping and precision follow the TrainingArguments ("auto");
    `overlap_comm` (the `zero_overlap_comm` knob; None: DeepSpeed's default, on for ZeRO-3
    only) overlaps the gradients' reduction with the backward."""
    zero: dict[str, Any] = {"stage": ZERO_STAGES[strategy]}
    if overlap_comm is not None:
        zero["overlap_comm"] = overlap_comm
    if ZERO_STAGES[strategy] == 3:  # the sizes HF's ZeRO-3 example derives from the model
        zero |= {
            "stage3_param_persistence_threshold": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "reduce_bucket_size": "auto",
        }
    optimizer = {}
    if strategy in OFFLOADED:  # DeepSpeed's own AdamW, which it runs on the host (CPU Adam)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        optimizer["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    if strategy == "zero3_offload":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return optimizer | {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
    }


TRANSFORMERS_DEFAULT_OPTIM = "adamw_torch_fused"
"""transformers 5's `TrainingArguments().optim`: stands only where the probe did not read the
installed one (a `DeviceInfo` made by hand, a software cache without it)."""

MemoryOrder = Literal["larger is hungrier", "off is hungrier", "unordered"]
Mapping = Callable[[Any, dict[str, Any], Collection[str]], dict[str, Any]]
"""(value, all params, installed TrainingArguments fields) -> TrainingArguments kwargs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    name: str
    kind: type
    check: Callable[[Any], bool]
    expected: str
    """What a valid value is, for error messages."""
    ranges: bool = False
    """Whether a space may give its values as `low:`/`high:` (integer knobs)."""
    short: str | None = None
    """Its name in a settings line (`bs=16`); None shows the value alone (`bf16`)."""
    baseline: Any = None
    """What `TrainingArguments(output_dir=...)` trains with; None: not set in the baseline."""
    memory: MemoryOrder = "unordered"
    requires: dict[str, Any] = field(default_factory=dict)
    """Knob -> the value it needs, or a test of that value (`positive`): without it this knob
    has no effect and is not sampled."""
    training_args: Mapping = lambda value, params, fields: {}
    model_kwarg: bool = False
    """Set on the model (`from_config(..., name=value)`) rather than in TrainingArguments."""
    collator: bool = False
    """Set on autotune's batch collator (`data.PaddingCollator`) rather than in
    TrainingArguments: a user's own Trainer (`trainer=`) brings its own collator."""
    data_only: bool = False
    """Matters only on the user's data: synthetic samples are in memory and of one length, so
    loader and padding settings are fixed there (and not part of the baseline)."""
    environment: Callable[[Any, dict[str, Any]], dict[str, str]] | None = None
    """(value, all params) -> the environment variables that set it, which accelerate reads
    when the Trainer builds its accelerator: no TrainingArguments field carries them."""
    unset: Any = None
    """The value a setting that leaves this knob out trains with, where it is one of the
    knob's values (`torch_compile` off, Liger off); None: `baseline`, or none."""
    prior: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Device kind (`cuda`, `cpu`) -> the values the tuning guides advise for it, most advised
    first: the expert's guess (`study/guess.py`) takes the first one the space holds; a knob
    without one keeps its baseline there. `batch_size` has none: the guess takes the largest
    batch that fits."""
    prior_source: str = ""
    """Where `prior` comes from."""
    math: Callable[[Any, Any], str | None] = lambda baseline, value: None
    """(baseline value, value) -> how the change alters what training computes, in words; None
    when it changes only speed and memory (checkpointing recomputes the same activations)."""

    def show(self, value: Any) -> str:
        if self.short is None:
            return str(value)
        if isinstance(value, bool):
            return f"{self.short}={'on' if value else 'off'}"
        return f"{self.short}={value}"


# ---- facts about values, asked by several stages ----


def precision_parts(precision: str) -> set[str]:
    """`bf16+tf32` -> {"bf16", "tf32"}."""
    return set(precision.split("+"))


def sixteen_bit(precision: str | None) -> bool:
    """Mixed precision with 16-bit matmuls (fp16 or bf16 autocast); fp8 counts too (its
    activations and the matmuls outside the linear layers are bf16)."""
    return precision is not None and bool({"fp16", "bf16", "fp8"} & precision_parts(precision))


def is_compiled(params: dict[str, Any]) -> bool:
    return value_of(params, "torch_compile") != "off"


# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name
# warns); older 5.x releases have only the old one. The worker passes the installed fields.
def _checkpointing_field(fields: Collection[str], suffix: str = "") -> str:
    return next(
        f + suffix
        for f in ("activation_checkpointing", "gradient_checkpointing")
        if f + suffix in fields
    )


def _group_args(value: bool, params: dict[str, Any], fields: Collection[str]) -> dict:
    # Recent transformers made group_by_length one of several train_sampling_strategy values.
    if "train_sampling_strategy" in fields:
        return {"train_sampling_strategy": "group_by_length" if value else "random"}
    return {"group_by_length": value}


def _precision_args(value: str, params: dict[str, Any], fields: Collection[str]) -> dict:
    parts = precision_parts(value)
    return {"bf16": "bf16" in parts, "fp16": "fp16" in parts} | (
        {"tf32": True} if "tf32" in parts else {}
    )


FP8_ENVIRONMENT = {"ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "AO"}
"""accelerate's fp8 training on torchao's Float8Linear: TrainingArguments has no fp8 field and
takes the mixed precision from this environment when fp16 and bf16 are off."""


def _compile_args(value: str, params: dict[str, Any], fields: Collection[str]) -> dict:
    if value == "off":
        return {}
    return {
        "torch_compile": True,
        "torch_compile_backend": value,
        "torch_compile_mode": value_of(params, "compile_mode"),
    }


def optimizer_family(optim: str) -> str:
    """`adamw_torch_fused` -> `AdamW`, `adamw_bnb_8bit` -> `AdamW (8-bit states)`: the update
    rule and the precision of its states, which kernels (torch, fused, apex) do not change."""
    name = optim.lower()
    rule = next(
        (rule for key, rule in _OPTIMIZER_RULES if key in name),
        "AdamW" if "adam" in name else optim,
    )
    bits = next((f" ({b}-bit states)" for b in ("8", "4") if f"{b}bit" in name), "")
    return rule + bits


# Checked in order: `ademamix` and `lion` before `adam`; names from TrainingArguments.optim.
_OPTIMIZER_RULES = (
    ("adafactor", "Adafactor"), ("ademamix", "AdEMAMix"), ("lion", "Lion"), ("lomo", "LOMO"),
    ("galore", "GaLore"), ("apollo", "APOLLO"), ("schedule_free", "schedule-free"),
    ("grokadamw", "GrokAdamW"), ("rmsprop", "RMSprop"), ("sgd", "SGD"), ("adagrad", "Adagrad"),
)  # fmt: skip


def _optim_math(baseline: str, value: str) -> str | None:
    old, new = optimizer_family(baseline), optimizer_family(value)
    if old == new:
        return None
    if old.split()[0] == new.split()[0]:
        return f"{new}: quantised optimizer states approximate {old}'s"
    return f"another optimizer ({new}, not {old}): retune its learning rate"


def _precision_math(baseline: str, value: str) -> str | None:
    added = precision_parts(value) - precision_parts(baseline)
    if value == "fp8" and baseline != "fp8":
        return "fp8 matmuls in the linear layers (e4m3, dynamically scaled), bf16 elsewhere"
    if sixteen_bit(value) and not sixteen_bit(baseline):
        return "16-bit mixed precision: fp32 master weights, 16-bit matmuls and activations"
    if added == {"tf32"}:
        return "TF32 matmuls: 10-bit mantissa instead of fp32's 23"
    return "another numeric precision"


def conflict(params: dict[str, Any]) -> str | None:
    """Why these settings cannot train together (an optimizer that cannot update sharded
    parameters), or None: asked before a trial runs, and by the worker itself."""
    strategy, optim = params.get("strategy"), params.get("optim")
    if strategy in FSDP and optim in UNSHARDABLE_OPTIMIZERS:
        return f"{optim} cannot update {strategy}'s sharded parameters (DTensors)"
    if (
        strategy in OFFLOADED
        and strategy in ZERO_STAGES
        and optim is not None
        and not optimizer_family(optim).startswith("AdamW")
    ):
        return f"{strategy} updates the weights with DeepSpeed's host AdamW, not {optim}"
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


def _flag(variable: str) -> Callable[[Any, dict[str, Any]], dict[str, str]]:
    """A boolean knob set by one environment variable, `true` or `false`."""
    return lambda value, params: {variable: str(bool(value)).lower()}


@dataclass(frozen=True, slots=True)
class Needs:
    """A `requires` test of another knob's value, with the words a message says it in
    (`takes effect only with strategy fsdp, fsdp_grad_op or fsdp_offload`)."""

    words: str
    test: Callable[[Any], bool]

    def __call__(self, value: Any) -> bool:
        return self.test(value)


def one_of(values: Iterable[str]) -> Needs:
    names = sorted(values)
    return Needs(", ".join(names[:-1]) + f" or {names[-1]}", lambda value: value in names)


_on = Needs("other than off", lambda value: value != "off")
"""torch_compile names a backend."""
positive = Needs("above 0", lambda value: value > 0)
"""Loader workers: some."""


def _strategy_args(value: str, params: dict[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """DeepSpeed's strategies are the Trainer's `deepspeed=` config; the others are set up by
    the ranks themselves."""
    if value not in ZERO_STAGES:
        return {}
    overlap = params.get("zero_overlap_comm") if active("zero_overlap_comm", params) else None
    return {"deepspeed": deepspeed_config(value, overlap)}


def _checkpointing_args(
    on: bool, params: dict[str, Any], fields: Collection[str]
) -> dict[str, Any]:
    """Checkpointing on or off, and its kwargs from the knobs that shape it: re-entrant or not
    (torch's `use_reentrant`), `every_n_layers` (transformers checkpoints the blocks whose
    index is a multiple of n; the others keep their activations) and `offload` (the inputs
    the checkpointed blocks keep go to pinned host memory)."""
    args: dict[str, Any] = {_checkpointing_field(fields): on}
    kwargs = {}
    if on and "checkpointing_reentrant" in params:
        kwargs["use_reentrant"] = params["checkpointing_reentrant"]
    if on and (every := value_of(params, "checkpointing_every_n_layers")) != 1:
        kwargs["every_n_layers"] = every
    if on and params.get("activation_offload"):
        kwargs["offload"] = True
    if kwargs:
        args[_checkpointing_field(fields, "_kwargs")] = kwargs
    return args


def _same_name(field_name: str) -> Mapping:
    return lambda value, params, fields: {field_name: value}


# Display order (tables, exports, settings lines).
KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            name="batch_size", kind=int, check=lambda v: v > 0, expected="a positive integer",
            ranges=True, short="bs", baseline=8, memory="larger is hungrier",
            training_args=_same_name("per_device_train_batch_size"),
        ),
        Knob(
            name="grad_accum", kind=int, check=lambda v: v > 0, expected="a positive integer",
            ranges=True, short="ga", baseline=1,
            training_args=_same_name("gradient_accumulation_steps"),
        ),
        Knob(
            name="gradient_checkpointing", kind=bool, check=lambda v: True,
            expected="true or false", short="gc", baseline=False, memory="off is hungrier",
            prior={"cuda": (False,), "cpu": (False,)},
            prior_source="HF single-GPU guide: checkpointing recomputes activations at about "
            "20% of the speed; only when the batch does not fit without it",
            training_args=_checkpointing_args,
        ),
        Knob(
            name="checkpointing_reentrant", kind=bool, check=lambda v: True,
            expected="true or false", short="reentrant",
            requires={"gradient_checkpointing": True},
        ),  # in the checkpointing kwargs (`_checkpointing_args`)
        Knob(
            name="checkpointing_every_n_layers", kind=int, check=lambda v: v >= 1,
            expected="an integer >= 1 (1: every layer; n: every n-th, the others keep their "
            "activations)", ranges=True, short="gc_every", memory="larger is hungrier",
            requires={"gradient_checkpointing": True}, unset=1,
        ),  # in the checkpointing kwargs (`_checkpointing_args`)
        Knob(
            name="activation_offload", kind=bool, check=lambda v: True,
            expected="true or false", short="act_offload", memory="off is hungrier",
            requires={"gradient_checkpointing": True},
        ),  # in the checkpointing kwargs (`_checkpointing_args`); CUDA only
        Knob(
            name="use_liger_kernel", kind=bool, check=lambda v: True, expected="true or false",
            short="liger", training_args=_same_name("use_liger_kernel"), unset=False,
        ),  # Liger's Triton kernels patched into the model's modules (CUDA, some decoders)
        Knob(
            name="precision", kind=str, check=lambda v: v in PRECISIONS,
            expected="one of " + ", ".join(PRECISIONS), baseline="fp32",
            prior={"cuda": ("bf16+tf32", "bf16", "fp16+tf32", "fp16"), "cpu": ("bf16",)},
            prior_source="HF single-GPU guide and PyTorch AMP docs: bf16 mixed precision where "
            "the GPU has it (Ampere on), else fp16, with TF32 matmuls; PyTorch CPU tuning "
            "guide: bf16 autocast where the CPU computes bf16 natively (the space holds bf16 "
            "only there)",
            training_args=_precision_args, math=_precision_math,
            environment=lambda value, params: FP8_ENVIRONMENT if value == "fp8" else {},
        ),
        Knob(
            name="optim", kind=str, check=bool, expected="a TrainingArguments.optim name",
            training_args=_same_name("optim"), math=_optim_math,
            prior={"cuda": ("adamw_torch_fused",), "cpu": ("adamw_torch_fused",)},
            prior_source="HF single-GPU guide and torch.optim docs: the fused AdamW kernel, "
            "the same update in fewer launches",
        ),  # its baseline is the installed transformers' default: see baseline_params
        Knob(
            name="torch_compile", kind=str, check=bool,
            expected="off or a torch.compile backend", short="compile",
            training_args=_compile_args, unset="off",
            prior={"cuda": ("off",), "cpu": ("off",)},
            prior_source="compiling costs minutes before the first step: tried last, as a "
            "refinement of the best eager settings",
        ),
        Knob(
            name="compile_mode", kind=str, check=lambda v: v in COMPILE_MODES,
            expected="one of " + ", ".join(COMPILE_MODES), short="mode",
            requires={"torch_compile": _on}, unset="default",
        ),  # read by torch_compile's mapping
        Knob(
            name="compile_dynamic", kind=bool, check=lambda v: True, expected="true or false",
            short="dynamic", requires={"torch_compile": _on},
            environment=_flag("ACCELERATE_DYNAMO_USE_DYNAMIC"),
        ),  # dynamic shapes: one graph for every batch shape, instead of one per shape
        Knob(
            name="compile_fullgraph", kind=bool, check=lambda v: True, expected="true or false",
            short="fullgraph", requires={"torch_compile": _on},
            environment=_flag("ACCELERATE_DYNAMO_USE_FULLGRAPH"),
        ),  # one graph for the whole forward, or an error where it breaks
        Knob(
            name="compile_regional", kind=bool, check=lambda v: True, expected="true or false",
            short="regional", requires={"torch_compile": _on},
            environment=_flag("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
        ),  # compile one block and reuse it for its repeats: far shorter compiles
        Knob(
            name="attn_implementation", kind=str, check=lambda v: v in ATTENTION,
            expected="one of " + ", ".join(ATTENTION), short="attn", baseline="sdpa",
            model_kwarg=True,
            prior={"cuda": ("flash_attention_3", "flash_attention_2", "sdpa"), "cpu": ("sdpa",)},
            prior_source="HF GPU inference/training guides: FlashAttention where installed, "
            "else PyTorch's SDPA (which picks a fused kernel itself)",
        ),
        Knob(
            name="torch_empty_cache_steps", kind=int, check=lambda v: v >= 0,
            expected="an integer >= 0 (0: never)", ranges=True, short="empty_cache",
            # 0 is "never", the HF default (None), which is no value a space can write.
            training_args=lambda v, params, fields: {"torch_empty_cache_steps": v or None},
        ),
        Knob(
            name="dataloader_num_workers", kind=int, check=lambda v: v >= 0,
            expected="an integer >= 0", ranges=True, short="workers", baseline=0,
            data_only=True, training_args=_same_name("dataloader_num_workers"),
            prior={"cuda": (2, 4, 1), "cpu": (2, 4, 1)},
            prior_source="PyTorch performance tuning guide: num_workers > 0 so that loading "
            "overlaps the step",
        ),
        Knob(
            name="dataloader_prefetch_factor", kind=int, check=lambda v: v >= 1,
            expected="an integer >= 1 (batches each loader worker loads ahead)", ranges=True,
            short="prefetch", requires={"dataloader_num_workers": positive}, data_only=True,
            training_args=_same_name("dataloader_prefetch_factor"),
        ),
        Knob(
            name="dataloader_persistent_workers", kind=bool, check=lambda v: True,
            expected="true or false", short="persistent",
            requires={"dataloader_num_workers": positive}, data_only=True,
            training_args=_same_name("dataloader_persistent_workers"),
        ),
        Knob(
            name="dataloader_pin_memory", kind=bool, check=lambda v: True,
            expected="true or false", short="pin",
            training_args=_same_name("dataloader_pin_memory"), unset=True,
            prior={"cuda": (True,)},
            prior_source="PyTorch performance tuning guide: pinned memory for host-to-GPU copies",
        ),
        Knob(
            name="group_by_length", kind=bool, check=lambda v: True, expected="true or false",
            short="group", baseline=False, data_only=True, training_args=_group_args,
        ),
        Knob(
            name="strategy", kind=str, check=lambda v: v in STRATEGIES,
            expected="one of " + ", ".join(STRATEGIES), training_args=_strategy_args,
            prior={"cuda": ("ddp",), "cpu": ("ddp",)},
            prior_source="PyTorch distributed overview: DDP while the model fits one device; "
            "sharding (FSDP, ZeRO) when it does not",
        ),  # applied by the worker's ranks (child/ranks.py); DeepSpeed through the Trainer
        Knob(
            name="ddp_find_unused_parameters", kind=bool, check=lambda v: True,
            expected="true or false", short="find_unused", requires={"strategy": "ddp"},
            training_args=_same_name("ddp_find_unused_parameters"),
        ),  # the Trainer's default: on unless checkpointing (a graph walk every backward)
        Knob(
            name="ddp_bucket_cap_mb", kind=int, check=lambda v: v > 0,
            expected="a positive integer (MiB of gradients DDP reduces at a time)",
            ranges=True, short="bucket_mb", requires={"strategy": "ddp"},
            training_args=_same_name("ddp_bucket_cap_mb"),
        ),
        Knob(
            name="ddp_static_graph", kind=bool, check=lambda v: True, expected="true or false",
            short="static_graph", requires={"strategy": "ddp"},
            training_args=_same_name("ddp_static_graph"),
        ),
        Knob(
            name="gradient_as_bucket_view", kind=bool, check=lambda v: True,
            expected="true or false", short="bucket_view", memory="off is hungrier",
            requires={"strategy": "ddp"}, unset=False,
        ),  # no TrainingArguments field: set on the Trainer's DDP settings (child/ranks.py,
        # recommended.py); the gradients are views into DDP's buckets, not a second copy
        Knob(
            name="fsdp_prefetch", kind=bool, check=lambda v: True, expected="true or false",
            short="prefetch_blocks", requires={"strategy": one_of(FSDP)}, unset=False,
        ),  # applied by the ranks' fully_shard (child/ranks.py) and recommended.py
        Knob(
            name="zero_overlap_comm", kind=bool, check=lambda v: True, expected="true or false",
            short="overlap", requires={"strategy": one_of(ZERO_STAGES)},
        ),  # in the DeepSpeed config the strategy's entry writes (`deepspeed_config`)
        Knob(
            name="packing", kind=bool, check=lambda v: True, expected="true or false",
            short="packing", memory="off is hungrier", data_only=True, collator=True,
            requires={"attn_implementation": one_of(FLASH_ATTENTION)},
        ),  # DataCollatorWithFlattening: one row of every sample, no padding, exact only under
        # FlashAttention's variable-length kernel (with SDPA or eager, samples attend across)
        Knob(
            name="pad_to_multiple_of", kind=int, check=lambda v: v >= 1,
            expected="an integer >= 1 (1: pad to the longest sample of the batch)", short="pad",
            baseline=1, data_only=True, collator=True,
        ),
    )
}  # fmt: skip
# Sampling order: precision before batch_size (the 64 rule depends on it), batch_size before
# grad_accum, and each knob after those it requires.
SAMPLE_ORDER = (
    "strategy", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_static_graph",
    "gradient_as_bucket_view", "fsdp_prefetch", "zero_overlap_comm",
    "precision", "optim", "gradient_checkpointing", "checkpointing_reentrant",
    "checkpointing_every_n_layers", "activation_offload", "use_liger_kernel",
    "attn_implementation", "packing", "torch_compile", "compile_mode", "compile_dynamic",
    "compile_fullgraph", "compile_regional", "batch_size", "grad_accum",
    "torch_empty_cache_steps", "dataloader_num_workers", "dataloader_prefetch_factor",
    "dataloader_persistent_workers", "dataloader_pin_memory", "group_by_length",
    "pad_to_multiple_of",
)  # fmt: skip
assert set(SAMPLE_ORDER) == set(KNOBS)


def active(name: str, params: dict[str, Any]) -> bool:
    """Whether the knob's requirements hold among the settings chosen so far."""
    return all(
        k in params and (need(params[k]) if callable(need) else params[k] == need)
        for k, need in KNOBS[name].requires.items()
    )


def training_args(
    params: dict[str, Any], *, device: str, fields: Collection[str]
) -> dict[str, Any]:
    """Tuned `TrainingArguments` kwargs for a knob dict; `fields` are the installed ones."""
    kwargs: dict[str, Any] = {}
    if "precision" not in params:  # mixed precision off, said explicitly as before
        kwargs |= _precision_args("fp32", params, fields)
    for name, value in params.items():
        knob = KNOBS[name]
        if not knob.model_kwarg and active(name, params):
            kwargs |= knob.training_args(value, params, fields)
    if device == "cpu":
        # Without it the Trainer picks a GPU when one exists, and refuses bf16 on CPU.
        kwargs["use_cpu"] = True
    elif "tf32" in fields:
        # Left None, transformers turns TF32 on whenever torch_compile is set: an fp32 trial
        # under inductor would run (and be recorded, and recommended) as fp32 while it ran TF32.
        kwargs.setdefault("tf32", False)
    return kwargs


def environment(params: dict[str, Any]) -> dict[str, str]:
    """The environment variables the knobs set (accelerate reads them as the Trainer builds
    its accelerator): set in the trial before the Trainer, recorded, exported."""
    variables: dict[str, str] = {}
    for name, value in params.items():
        setter = KNOBS[name].environment
        if setter is not None and active(name, params):
            variables |= setter(value, params)
    return variables


def model_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """`from_config`/`from_pretrained` kwargs the knobs set (the attention kernel)."""
    return {k: v for k, v in params.items() if KNOBS[k].model_kwarg}


def left_out(name: str) -> Any:
    """What training does about a knob a setting leaves out, as one of its values (`unset`,
    else the HF default); None where that is no value of the knob."""
    knob = KNOBS[name]
    return knob.baseline if knob.unset is None else knob.unset


def value_of(
    params: dict[str, Any],
    name: str,
    *,
    devices: int = 1,
    default_optim: str = TRANSFORMERS_DEFAULT_OPTIM,
) -> Any:
    """The value a setting trains with for a knob: its own, else what training does about a
    knob it leaves out (`left_out`): for `optim` the installed transformers' default
    (`default_optim`), for `strategy` DDP on several `devices` (as torchrun runs them), one
    device alone on one. None where leaving it out is no value of the knob."""
    if name in params:
        return params[name]
    if name == "optim":
        return default_optim
    if name == "strategy":
        return "single" if devices == 1 else "ddp"
    return left_out(name)


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


def math_changes(
    params: dict[str, Any], baseline: dict[str, Any], devices: int = 1
) -> list[MathChange]:
    """Every difference from the baseline's settings that changes what training computes:
    another effective batch (over every one of a trial's `devices`), precision or optimizer.
    Kernels, checkpointing, compiling, loader settings and the strategy that shares the
    training between devices change speed and memory only, and are not listed."""
    changes = []
    before, after = effective_batch(baseline) * devices, effective_batch(params) * devices
    if before != after:
        why = "another number of samples per optimizer update: retune the learning rate, "
        why += f"or keep it with effective_batch_size={before}"
        changes.append(
            MathChange(setting="effective_batch_size", baseline=before, value=after, why=why)
        )
    for name, knob in KNOBS.items():
        if name in params and name in baseline and params[name] != baseline[name]:
            why = knob.math(baseline[name], params[name])
            if why is not None:
                changes.append(
                    MathChange(setting=name, baseline=baseline[name], value=params[name], why=why)
                )
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
