"""The adapter a job trains (`peft=lora`) and the quantized bases it can train on: facts both
sides share, as JSON-ready dicts. Imports neither torch nor peft: the worker turns them into
peft's `LoraConfig` and transformers' `BitsAndBytesConfig`, the exports write them as the
kwargs of those.

Like the effective batch, the adapter is part of the job (`RunInfo.adapter`): the same in every
trial, the baseline's too, and checked on resume. The base's dtype and its quantization are
knobs (`torch_dtype`, `quantization`), searched where an adapter trains.
"""

from __future__ import annotations

import re
from typing import Any

ALL_LINEAR = "all-linear"
"""peft's name for every linear layer of the model but its output head."""

PEFT_TASK_TYPES = {
    "causal-lm": "CAUSAL_LM",
    "sequence-classification": "SEQ_CLS",
    "seq2seq": "SEQ_2_SEQ_LM",
    "masked-lm": None,
}
"""autotune's task -> peft's `TaskType` name (SEQ_CLS also trains the new classifier head)."""

QUANTIZATIONS = ("none", "nf4", "int8")
"""The base's weights: as loaded (`none`); bitsandbytes 4-bit NormalFloat with double
quantization (QLoRA, Dettmers et al. 2023); bitsandbytes LLM.int8 (8-bit rows with fp16
outliers). Adapters train in fp32 on either."""

BASE_DTYPES = ("fp32", "bf16")
"""The dtype the base's weights are loaded in (`torch_dtype`); peft keeps adapters in fp32."""

TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def parse_targets(text: str) -> str | list[str]:
    """`all-linear`, or module names separated by commas (`q_proj,v_proj`): what peft's
    `target_modules` takes. Raises ValueError naming what is not a module name."""
    text = text.strip()
    if text == ALL_LINEAR:
        return ALL_LINEAR
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not _MODULE_NAME.fullmatch(n)]
    if not names or bad:
        shown = ", ".join(repr(n) for n in bad) or "nothing"
        raise ValueError(
            f"{shown} is not a module name: give {ALL_LINEAR}, or module names such as "
            "q_proj,v_proj (letters, digits, _ and .)"
        )
    return sorted(set(names))


def lora_config(
    *, r: int, alpha: int, dropout: float, targets: str | list[str], task: str
) -> dict[str, Any]:
    """peft's `LoraConfig(**kwargs)` for the job: JSON-ready, stored with the study."""
    kwargs: dict[str, Any] = {
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": targets,
    }
    if (task_type := PEFT_TASK_TYPES.get(task)) is not None:
        kwargs["task_type"] = task_type
    return kwargs


def describe(adapter: dict[str, Any] | None) -> str:
    """`LoRA r=16 alpha=32 dropout 0.05 on all-linear`, or `full fine-tune`."""
    if adapter is None:
        return "full fine-tune"
    targets = adapter["target_modules"]
    on = targets if isinstance(targets, str) else ",".join(targets)
    r, alpha, dropout = adapter["r"], adapter["lora_alpha"], adapter["lora_dropout"]
    return f"LoRA r={r} alpha={alpha} dropout {dropout} on {on}"


def quantization_config(quantization: str, compute: str) -> dict[str, Any] | None:
    """transformers' `BitsAndBytesConfig(**kwargs)` for a quantized base, computing in
    `compute` (`bfloat16`, `float16`, `float32`: the trial's 16-bit precision, else the
    base's dtype); None for `none`. JSON-ready: the dtype by its torch name."""
    if quantization == "none":
        return None
    if quantization == "nf4":
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": compute,
        }
    if quantization == "int8":
        return {"load_in_8bit": True}
    raise ValueError(f"quantization={quantization}: one of {', '.join(QUANTIZATIONS)}")
