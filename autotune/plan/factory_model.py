"""The model a `trainer=` factory trains, as the estimate needs it: known once a trial of the
factory has run and reported it (`TrialResult.trained_config`), since the factory, not `model=`
or `seq_len=`, decides what trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.common.trial import TrialResult


@dataclass(frozen=True, slots=True)
class EstimatedModel:
    """What an estimate is made of: the model `model=` names, or the one a factory trains."""

    config: dict[str, Any]
    task: str
    seq_len: int
    adapter: dict[str, Any] | None
    parameters: int | None = None
    """Its parameter count where known (the catalogue's); None: counted from the config."""


QUANTIZED_BASES = {"load_in_4bit": "nf4", "load_in_8bit": "int8"}
"""A `BitsAndBytesConfig`'s switch -> the `quantization` knob's value."""


def factory_model(
    params: dict[str, Any], factory: TrialResult
) -> tuple[dict[str, Any], EstimatedModel]:
    """The settings and the model to estimate a factory's trial by, from what a trial of it
    reported: its model's config, task and adapter, at the longest batch it trained on (an
    upper bound on data of many lengths), the base in the dtype and quantization the factory
    gave it (under an adapter, the `torch_dtype` and `quantization` knobs' say)."""
    config = factory.trained_config or {}
    base = dict(params)
    if factory.peft_config is not None:
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        # The estimate counts a base's bytes: fp16's are bf16's.
        base["torch_dtype"] = "bf16" if dtype in ("bfloat16", "float16") else "fp32"
        quantized = config.get("quantization_config") or {}
        base["quantization"] = next(
            (kind for switch, kind in QUANTIZED_BASES.items() if quantized.get(switch)), "none"
        )
    model = EstimatedModel(
        config,
        factory.trained_task,
        factory.trained_seq_len,
        factory.peft_config,
    )
    return base, model
