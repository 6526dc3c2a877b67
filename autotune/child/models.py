"""Building a model (in a trial) and counting the catalogue's parameters on the meta device:
`python -m autotune.child.models NAME ...` prints the counts as JSON, and
`python -m autotune.child.models --write-counts` rewrites the shipped file after a model is
added to the catalogue."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.common.models import (
    PARAMETER_COUNTS_FILE,
    TASK_CLASSES,
    ModelSpec,
    catalogue_names,
    resolve_model,
)

WRITE_COUNTS = "--write-counts"


def count_parameters(names: list[str]) -> dict[str, int]:
    """Parameter counts with the default task's head, from a subprocess (keeps torch out)."""
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.child.models", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"parameter count failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def build_model(
    spec: ModelSpec,
    task: str,
    *,
    attn_implementation: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    quantization_config: dict[str, Any] | None = None,
    adapter: dict[str, Any] | None = None,
    tensor_parallel: tuple[int, int] | None = None,
) -> Any:
    """A randomly initialised model for `task`, built on `device` (None: torch's default, or
    the surrounding `torch.device` context) in `dtype` (a torch dtype's name; None: fp32);
    weights do not change speed or memory. With `quantization_config` (`BitsAndBytesConfig`
    kwargs) its linear layers are quantized by bitsandbytes as from_pretrained quantizes a
    checkpoint; with `adapter` (`LoraConfig` kwargs) peft wraps it, the base frozen; with
    `tensor_parallel` (ranks a group, groups) each rank of the process group holds its share
    of the weights the model's tensor-parallel plan splits (`_tensor_parallel`)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**spec.config)
    if task == "sequence-classification" and config.pad_token_id is None:
        # Decoder models refuse batches > 1 without a pad id; synthetic data has no padding.
        config.pad_token_id = config.eos_token_id
    auto_class = getattr(transformers, TASK_CLASSES[task][0])
    kwargs: dict[str, Any] = (
        {"attn_implementation": attn_implementation} if attn_implementation else {}
    )
    if dtype:
        kwargs["dtype"] = dtype  # a torch dtype's name, as from_config takes it
    from transformers.integrations import is_deepspeed_zero3_enabled

    placed = torch.device(device) if device else contextlib.nullcontext()
    if tensor_parallel:
        model = _tensor_parallel(auto_class, config, kwargs, *tensor_parallel)
    elif quantization_config:
        model = _quantized(auto_class, config, kwargs, quantization_config, device or "cpu")
    elif is_deepspeed_zero3_enabled():
        # Built inside DeepSpeed's `zero.Init`, each rank holds a partition of every weight,
        # which from_config initialises gathered: the model's init cannot run again after.
        with placed:
            model = auto_class.from_config(config, **kwargs)
    else:
        with placed, _initialised_once():
            model = auto_class.from_config(config, **kwargs)
        model.init_weights()
    return with_adapter(model, adapter) if adapter else model


def _quantized(
    auto_class: Any, config: Any, kwargs: dict[str, Any], quantization: dict[str, Any], device: str
) -> Any:
    """The model with bitsandbytes' quantized linear layers on `device`: random weights made in
    host memory, then handed to from_pretrained as a checkpoint's state dict, which quantizes
    each one as it places it (transformers' own path for `quantization_config`). The device
    never holds the unquantized weights, as when a checkpoint is loaded."""
    import torch
    import transformers

    with torch.device("cpu"), _initialised_once():
        made = auto_class.from_config(config, **kwargs)
    made.init_weights()
    state_dict = made.state_dict()
    del made
    model_class = auto_class._model_mapping[type(config)]
    return model_class.from_pretrained(
        None,
        config=config,
        state_dict=state_dict,
        quantization_config=transformers.BitsAndBytesConfig(**quantization),
        device_map={"": device},
        **kwargs,
    )


def _tensor_parallel(
    auto_class: Any, config: Any, kwargs: dict[str, Any], tp: int, groups: int
) -> Any:
    """The model split by its tensor-parallel plan over groups of `tp` ranks (`groups` of them
    shard the rest by FSDP2, transformers' `fsdp_size`): from_pretrained's own distributed
    path with no checkpoint (`state_dict={}`), which builds the model on the meta device,
    shards it, and initialises each rank's share of every weight where the mesh lives (the
    rank's GPU; the host on CPU). No rank ever holds the whole model."""
    from transformers.distributed import DistributedConfig

    model_class = auto_class._model_mapping[type(config)]
    return model_class.from_pretrained(
        None,
        config=config,
        state_dict={},
        distributed_config=DistributedConfig(tp_size=tp, fsdp_size=groups),
        **kwargs,
    )


def with_adapter(model: Any, adapter: dict[str, Any]) -> Any:
    """`model` wrapped by peft with the adapter `adapter` describes (`LoraConfig` kwargs): the
    base frozen, the adapters trainable in fp32 (peft's `autocast_adapter_dtype`)."""
    import peft

    # Checkpointing needs the frozen embeddings' output to ask for a gradient: peft and the
    # Trainer's checkpointing switch both see to it (`enable_input_require_grads`).
    return peft.get_peft_model(model, peft.LoraConfig(**adapter))


@contextlib.contextmanager
def _initialised_once() -> Iterator[None]:
    """Each layer's own init (torch's default, a uniform draw per weight) left out while the
    model is built: the model's `_init_weights`, run after, sets every weight again, as it
    does for weights missing from a checkpoint. bert-large on two CPU cores: 6.6 s -> 4.1 s."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # a transformers without it: the default init, then the model's
        yield
        return
    with no_init_weights():
        yield


def _count_on_meta(names: list[str]) -> dict[str, int]:
    import torch

    counts = {}
    for name in names:
        spec = resolve_model(name)
        with torch.device("meta"):
            model = build_model(spec, spec.default_task)
        counts[name] = sum(p.numel() for p in model.parameters())
    return counts


def _write_counts() -> Path:
    """Recount every catalogue model and rewrite the shipped file (after adding a model)."""
    import transformers

    from autotune.common.trial import write_json_atomic

    path = Path(str(resources.files("autotune") / PARAMETER_COUNTS_FILE))
    write_json_atomic(
        path,
        {
            "written_by": f"python -m autotune.child.models {WRITE_COUNTS}",
            "transformers_version": transformers.__version__,
            "parameters": _count_on_meta(catalogue_names()),
        },
    )
    return path


if __name__ == "__main__":
    if sys.argv[1:] == [WRITE_COUNTS]:
        print(f"wrote {_write_counts()}")
    else:
        print(json.dumps(_count_on_meta(sys.argv[1:])))
