"""The one mapping from knobs to `TrainingArguments`, and the files a user takes away.

The worker trains with `training_args(...)` and records the kwargs it used in its result; the
exporter writes those recorded kwargs. So what is recommended is exactly what was measured.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from autotune.trial import write_json_atomic

# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name
# warns); older 5.x releases have only the old one. The worker passes the installed fields.
_CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")


def training_args(
    params: dict[str, Any], *, device: str, fields: Collection[str]
) -> dict[str, Any]:
    """Tuned `TrainingArguments` kwargs for a knob dict; `fields` are the installed ones."""
    kwargs: dict[str, Any] = {}
    if "batch_size" in params:
        kwargs["per_device_train_batch_size"] = params["batch_size"]
    if "grad_accum" in params:
        kwargs["gradient_accumulation_steps"] = params["grad_accum"]
    if "gradient_checkpointing" in params:
        name = next(f for f in _CHECKPOINTING_FIELDS if f in fields)
        kwargs[name] = params["gradient_checkpointing"]
    precision = params.get("precision", "fp32").split("+")  # e.g. bf16+tf32
    kwargs["bf16"] = "bf16" in precision
    kwargs["fp16"] = "fp16" in precision
    if "tf32" in precision:
        kwargs["tf32"] = True
    for name in ("optim", "dataloader_num_workers", "dataloader_pin_memory"):
        if name in params:
            kwargs[name] = params[name]
    backend = params.get("torch_compile", "off")
    if backend != "off":
        kwargs["torch_compile"] = True
        kwargs["torch_compile_backend"] = backend
        kwargs["torch_compile_mode"] = params.get("compile_mode", "default")
    if device == "cpu":
        # Without it the Trainer picks a GPU when one exists, and refuses bf16 on CPU.
        kwargs["use_cpu"] = True
    return kwargs


def model_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """`from_config`/`from_pretrained` kwargs the knobs set (the attention kernel)."""
    return (
        {"attn_implementation": params["attn_implementation"]}
        if "attn_implementation" in params
        else {}
    )


def write_recommendation(study_dir: Path, recommendation: dict[str, Any]) -> list[Path]:
    """recommended.json and recommended.py; returns the paths written."""
    json_path = study_dir / "recommended.json"
    py_path = study_dir / "recommended.py"
    write_json_atomic(json_path, recommendation)
    py_path.write_text(render_py(recommendation))
    return [json_path, py_path]


def render_py(recommendation: dict[str, Any]) -> str:
    """A runnable snippet that builds the recommended `TrainingArguments`."""
    args = recommendation["training_args"]
    metrics = recommendation["metrics"]
    lines = [
        f'"""TrainingArguments recommended by autotune for {recommendation["model"]}',
        f"(task {recommendation['task']}, seq_len {recommendation['seq_len']}, "
        f"{recommendation['device']}).",
        "",
        f"Measured in trial {recommendation['trial']} of study {recommendation['study']}: "
        f"{metrics['samples_per_s']:.2f} samples/s, {metrics['peak_memory_gib']:.2f} GiB peak.",
        '"""',
        "",
        "from transformers import TrainingArguments",
        "",
    ]
    if recommendation["model_kwargs"]:
        lines += [f"model_kwargs = {recommendation['model_kwargs']!r}  # for from_pretrained", ""]
    lines.append("training_args = TrainingArguments(")
    lines.append('    output_dir="output",')
    lines += [f"    {key}={_py_literal(value)}," for key, value in args.items()]
    lines += [")", "", 'if __name__ == "__main__":']
    lines += ["    print(training_args.to_json_string())", ""]
    return "\n".join(lines)


def _py_literal(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else json.dumps(value)
