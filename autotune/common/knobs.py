"""The knob catalogue: everything autotune knows about each training setting, in one place.

Shared by both sides (the parent samples, skips, displays and exports; the worker trains), so it
imports neither optuna nor torch. A knob's entry says which values it takes, how it reads in a
short settings line, what it sets in `TrainingArguments` (or on the model), its HF default (the
baseline), and how it orders memory use (for skipping configs at least as hungry as an OOM).
Adding a knob is one entry here plus the spaces that search it. The values knobs take are in
`knob_values`; facts about a trial's settings as a whole (conflicts, the baseline, changes to
the training itself, memory order against an OOM) in `trial_settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.common.adapter import BASE_DTYPES, QUANTIZATIONS, TORCH_DTYPE_NAMES
from autotune.common.adapter import quantization_config as _quantization_kwargs
from autotune.common.knob_values import (
    ATTENTION,
    COMPILE_MODES,
    FLASH_ATTENTION,
    FP8_ENVIRONMENT,
    FSDP,
    PRECISIONS,
    STRATEGIES,
    TRANSFORMERS_DEFAULT_OPTIM,
    ZERO_STAGES,
    deepspeed_config,
    optimizer_family,
    precision_parts,
    sixteen_bit,
)

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
    model_args: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """(value, all params) -> the model kwargs a `model_kwarg` knob sets, where they are not
    `{name: value}` (the base's dtype is `dtype=`; a quantized base is a config of its own,
    `quantization_config`)."""
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
    first: the expert's guess (`study/sampling/guess.py`) takes the first one the space holds;
    a knob without one keeps its baseline there. `batch_size` has none: the guess takes the
    largest batch that fits."""
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


def is_compiled(params: dict[str, Any]) -> bool:
    return value_of(params, "torch_compile") != "off"


NAMING_FIELDS = (
    "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "train_sampling_strategy", "tf32",
)  # fmt: skip
"""The installed `TrainingArguments` fields `training_args` asks about (which name a release
has); the others it names as they are. A study stores those of them installed
(`RunInfo.training_fields`), so that its outputs derive each trial's arguments as it trained."""


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


def _compile_args(value: str, params: dict[str, Any], fields: Collection[str]) -> dict:
    if value == "off":
        return {}
    return {
        "torch_compile": True,
        "torch_compile_backend": value,
        "torch_compile_mode": value_of(params, "compile_mode"),
    }


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


def _base_dtype_math(baseline: str, value: str) -> str | None:
    if value == "bf16" and baseline != "bf16":
        return (
            "the frozen base's weights in bf16 (8-bit mantissa, not fp32's 23): its forward "
            "rounds as they do"
        )
    return "another dtype of the frozen base's weights"


def _quantization_math(baseline: str, value: str) -> str | None:
    if value == "nf4":
        return "a 4-bit NormalFloat base (QLoRA): the frozen weights are approximated in 4 bits"
    if value == "int8":
        return "an 8-bit base (LLM.int8): the frozen weights are approximated in 8 bits"
    return "the base's weights as loaded, not quantized"


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
            prior={"cuda": ("flash_attention_3", "flash_attention_2", "sdpa"), "cpu": ("eager",)},
            prior_source="CUDA: HF GPU inference/training guides: FlashAttention where "
            "installed, else PyTorch's SDPA (which picks a fused kernel itself). CPU: measured "
            "(benchmarks/results/cpu-advice.md): in bf16, eager attention trained faster than SDPA "
            "in 22 of 28 pairs on an AMD EPYC and an AMX Xeon (median 1.16x); in fp32 the two "
            "are level (median 1.00)",
        ),
        Knob(
            name="torch_dtype", kind=str, check=lambda v: v in BASE_DTYPES,
            expected="one of " + ", ".join(BASE_DTYPES), short="base", unset="fp32",
            model_kwarg=True, math=_base_dtype_math,
            model_args=lambda v, params: {"dtype": TORCH_DTYPE_NAMES[v]} if v != "fp32" else {},
            prior={"cuda": ("bf16",)},
            prior_source="PEFT and TRL LoRA guides: load the frozen base in bf16, adapters in "
            "fp32; half the base's bytes",
        ),  # the dtype the base is built (loaded) in; with an adapter only (`peft=`)
        Knob(
            name="quantization", kind=str, check=lambda v: v in QUANTIZATIONS,
            expected="one of " + ", ".join(QUANTIZATIONS), short="quant", unset="none",
            model_kwarg=True, math=_quantization_math, model_args=lambda v, params: {},
        ),  # bitsandbytes' quantized base (`quantization_config`); with an adapter only
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
            training_args=_same_name("ddp_bucket_cap_mb"), unset=25,
        ),  # unset: the Trainer passes none, and DDP takes 25 MiB
        Knob(
            name="ddp_static_graph", kind=bool, check=lambda v: True, expected="true or false",
            short="static_graph", requires={"strategy": "ddp"},
            training_args=_same_name("ddp_static_graph"), unset=False,
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
            name="tp_size", kind=int, check=lambda v: v >= 2,
            expected="an integer >= 2 (ranks a tensor-parallel group, dividing the devices)",
            short="tp", requires={"strategy": "tp"},
        ),  # applied where the ranks build the model (child/models.py): left out, every device
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
    "gradient_as_bucket_view", "fsdp_prefetch", "zero_overlap_comm", "tp_size",
    "precision", "optim", "gradient_checkpointing", "checkpointing_reentrant",
    "checkpointing_every_n_layers", "activation_offload", "use_liger_kernel",
    "attn_implementation", "torch_dtype", "quantization", "packing", "torch_compile",
    "compile_mode", "compile_dynamic", "compile_fullgraph", "compile_regional", "batch_size",
    "grad_accum",
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
    """`from_config`/`from_pretrained` kwargs the knobs set (the attention kernel, the base's
    dtype); a quantized base's config is `quantization_config(params)`."""
    kwargs: dict[str, Any] = {}
    for name, value in params.items():
        knob = KNOBS[name]
        if knob.model_kwarg:
            kwargs |= {name: value} if knob.model_args is None else knob.model_args(value, params)
    return kwargs


def quantization_config(params: dict[str, Any]) -> dict[str, Any] | None:
    """`BitsAndBytesConfig` kwargs of a quantized base (`adapter.quantization_config`),
    computing in the trial's 16-bit precision, else in the base's dtype; None: not quantized."""
    precision = precision_parts(value_of(params, "precision"))
    compute = (
        "bfloat16" if {"bf16", "fp8"} & precision
        else "float16" if "fp16" in precision
        else TORCH_DTYPE_NAMES[value_of(params, "torch_dtype")]
    )  # fmt: skip
    return _quantization_kwargs(value_of(params, "quantization"), compute)


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
    device alone on one, for `ddp_find_unused_parameters` the Trainer's choice (on unless
    checkpointing), for `tp_size` every one of the `devices` under `tp` (1 under any other).
    None where leaving it out is no value of the knob."""
    if name in params:
        return params[name]
    if name == "optim":
        return default_optim
    if name == "strategy":
        return "single" if devices == 1 else "ddp"
    if name == "ddp_find_unused_parameters":
        return not value_of(params, "gradient_checkpointing")
    if name == "tp_size":  # not in params: under tp, one group of every device
        return devices if params.get("strategy") == "tp" else 1
    return left_out(name)
