"""The knob catalogue: everything autotune knows about each training setting, in one place.

Shared by both sides (the parent samples, skips, displays and exports; the worker trains), so it
imports neither optuna nor torch. A knob's entry says which values it takes, how it reads in a
short settings line, what it sets in `TrainingArguments` (or on the model), its HF default (the
baseline), and how it orders memory use (for skipping configs at least as hungry as an OOM).
Adding a knob is one entry here plus the spaces that search it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp16+tf32", "bf16+tf32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
ATTENTION = ("sdpa", "eager")

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
    """Knob -> value it needs: without it this knob has no effect and is not sampled."""
    training_args: Mapping = lambda value, params, fields: {}
    model_kwarg: bool = False
    """Set on the model (`from_config(..., name=value)`) rather than in TrainingArguments."""

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
    """Mixed precision with 16-bit matmuls (fp16 or bf16 autocast)."""
    return precision is not None and bool({"fp16", "bf16"} & precision_parts(precision))


def is_compiled(params: dict[str, Any]) -> bool:
    return params.get("torch_compile", "off") != "off"


# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name
# warns); older 5.x releases have only the old one. The worker passes the installed fields.
def _checkpointing_field(fields: Collection[str], suffix: str = "") -> str:
    return next(f + suffix for f in ("activation_checkpointing", "gradient_checkpointing")
                if f + suffix in fields)  # fmt: skip


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
        "torch_compile_mode": params.get("compile_mode", "default"),
    }


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
            training_args=lambda v, params, fields: {_checkpointing_field(fields): v},
        ),
        Knob(
            name="checkpointing_reentrant", kind=bool, check=lambda v: True,
            expected="true or false", short="reentrant",
            requires={"gradient_checkpointing": True},
            training_args=lambda v, params, fields: {
                _checkpointing_field(fields, "_kwargs"): {"use_reentrant": v}
            },
        ),
        Knob(
            name="precision", kind=str, check=lambda v: v in PRECISIONS,
            expected="one of " + ", ".join(PRECISIONS), baseline="fp32",
            training_args=_precision_args,
        ),
        Knob(
            name="optim", kind=str, check=bool, expected="a TrainingArguments.optim name",
            training_args=_same_name("optim"),
        ),  # its baseline is the installed transformers' default: see baseline_params
        Knob(
            name="torch_compile", kind=str, check=bool,
            expected="off or a torch.compile backend", short="compile",
            training_args=_compile_args,
        ),
        Knob(
            name="compile_mode", kind=str, check=lambda v: v in COMPILE_MODES,
            expected="one of " + ", ".join(COMPILE_MODES), short="mode",
        ),  # read by torch_compile's mapping
        Knob(
            name="attn_implementation", kind=str, check=lambda v: v in ATTENTION,
            expected="one of " + ", ".join(ATTENTION), short="attn", baseline="sdpa",
            model_kwarg=True,
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
            training_args=_same_name("dataloader_num_workers"),
        ),
        Knob(
            name="dataloader_pin_memory", kind=bool, check=lambda v: True,
            expected="true or false", short="pin",
            training_args=_same_name("dataloader_pin_memory"),
        ),
    )
}  # fmt: skip
# Sampling order: precision before batch_size (the 64 rule depends on it), batch_size before
# grad_accum, and each knob after those it requires.
SAMPLE_ORDER = (
    "precision", "optim", "gradient_checkpointing", "checkpointing_reentrant",
    "attn_implementation", "torch_compile", "compile_mode", "batch_size", "grad_accum",
    "torch_empty_cache_steps", "dataloader_num_workers", "dataloader_pin_memory",
)  # fmt: skip
assert set(SAMPLE_ORDER) == set(KNOBS)


def active(name: str, params: dict[str, Any]) -> bool:
    """Whether the knob's requirements hold among the settings chosen so far."""
    return all(params.get(k) == v for k, v in KNOBS[name].requires.items())


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
    return kwargs


def model_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """`from_config`/`from_pretrained` kwargs the knobs set (the attention kernel)."""
    return {k: v for k, v in params.items() if KNOBS[k].model_kwarg}


def baseline_params(default_optim: str, effective_batch_size: int | None) -> dict[str, Any]:
    """What `TrainingArguments(output_dir=...)` trains with: batch 8, fp32, the default
    optimizer, no checkpointing, SDPA attention, no compile; at the fixed effective batch
    when there is one (batch 8 when it divides it)."""
    params = {k: knob.baseline for k, knob in KNOBS.items() if knob.baseline is not None}
    params["optim"] = default_optim
    if effective_batch_size:
        params["batch_size"] = math.gcd(params["batch_size"], effective_batch_size)
        params["grad_accum"] = effective_batch_size // params["batch_size"]
    return {k: params[k] for k in KNOBS if k in params}


def describe_params(params: dict[str, Any]) -> str:
    """`bs=16 ga=2 gc=on bf16 adamw_torch`: a trial's settings in one short line."""
    return " ".join(KNOBS[k].show(v) for k, v in params.items())


def at_least_as_hungry(candidate: dict[str, Any], oom: dict[str, Any]) -> bool:
    """Every knob at least as memory-hungry as in a config that ran out of memory: a batch at
    least as large, checkpointing off where it was on. Knobs without a safe memory order
    (mixed precision keeps fp32 master weights) must match."""
    if set(candidate) != set(oom):
        return False
    for name, value in candidate.items():
        order = KNOBS[name].memory
        if order == "larger is hungrier" and value < oom[name]:
            return False
        if order == "off is hungrier" and value and not oom[name]:
            return False
        if order == "unordered" and value != oom[name]:
            return False
    return True
