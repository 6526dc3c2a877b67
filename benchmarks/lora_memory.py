"""The estimate of an adapter's job against the peaks its trials measure on this CPU.

    python benchmarks/lora_memory.py [--out benchmarks/results/lora-memory-cpu.md]

Small Llama- and Qwen2-architecture configs (the bundled configs' shapes, shrunk: 4 blocks of
width 256, a 16k vocabulary, seq_len 256, batch 8), each setting a real trial in a process of
its own: a full fine-tune, LoRA on an fp32 and on a bf16 base, with and without checkpointing,
and on a 4-bit and an 8-bit base. The table gives each trial's measured peak (the growth of the
trial process's resident memory) beside `autotune.plan.estimate` for the same settings, and
what the estimate gives the weights, the gradients and optimizer states, the activations and
the logits.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from autotune.common.adapter import lora_config
from autotune.common.models import resolve_model
from autotune.common.trial import TrialSpec
from autotune.common.units import GIB
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.estimate import estimate

SHAPE = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 16384,
         "max_position_embeddings": 1024}  # fmt: skip
ARCHITECTURES = {"llama": "meta-llama/Llama-3.2-1B", "qwen2": "Qwen/Qwen2.5-0.5B"}
SEQ_LEN, BATCH = 256, 8
ADAPTER = lora_config(r=16, alpha=32, dropout=0.05, targets="all-linear", task="causal-lm")
SETTINGS = {
    "full fine-tune": ({}, None),
    "LoRA, fp32 base": ({}, ADAPTER),
    "LoRA, fp32 base, checkpointing": ({"gradient_checkpointing": True}, ADAPTER),
    "LoRA, bf16 base, bf16": ({"torch_dtype": "bf16", "precision": "bf16"}, ADAPTER),
    "QLoRA nf4, bf16": ({"quantization": "nf4", "precision": "bf16"}, ADAPTER),
    "LoRA int8, fp32": ({"quantization": "int8"}, ADAPTER),
}


def config_of(base: str) -> dict:
    config = resolve_model(base).config | SHAPE
    config.pop("head_dim", None)
    config.pop("rope_scaling", None)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lora-memory-cpu.md"))
    out = parser.parse_args().out
    launcher = ForkserverLauncher()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for arch, base in ARCHITECTURES.items():
            config = config_of(base)
            for number, (name, (knobs, adapter)) in enumerate(SETTINGS.items()):
                params = {"batch_size": BATCH, "optim": "adamw_torch", **knobs}
                spec = TrialSpec(
                    trial_number=number,
                    model_name=arch,
                    model_config=config,
                    task="causal-lm",
                    seq_len=SEQ_LEN,
                    device="cpu",
                    params=params,
                    warmup_steps=2,
                    measure_steps=3,
                    seed=0,
                    adapter=adapter,
                )
                result = launch_trial(
                    spec, Path(folder) / f"{arch}-{number}", timeout_s=900, launcher=launcher
                )
                e = estimate(
                    config, task="causal-lm", seq_len=SEQ_LEN, params=params, device="cpu",
                    adapter=adapter,
                )  # fmt: skip
                measured = result.peak_memory_gib
                error = f"{e.total / GIB / measured - 1:+.0%}" if measured else "-"
                states = (e.gradients + e.optimizer) / GIB
                rows.append(
                    f"| {arch} | {name} | {result.status.value} | "
                    f"{measured if measured is None else f'{measured:.3f}'} | "
                    f"{e.total / GIB:.3f} | {error} | {e.weights / GIB:.3f} | {states:.3f} | "
                    f"{e.activations / GIB:.3f} | {e.logits / GIB:.3f} |"
                )
                print(rows[-1], flush=True)
    head = (
        f"# An adapter's estimate against measured CPU peaks\n\n"
        f"`python benchmarks/lora_memory.py`: {len(ARCHITECTURES)} architectures shrunk to "
        f"{SHAPE['num_hidden_layers']} blocks of width {SHAPE['hidden_size']}, vocabulary "
        f"{SHAPE['vocab_size']}, seq_len {SEQ_LEN}, batch {BATCH}, AdamW; LoRA r=16 on "
        "all-linear, dropout 0.05. Measured: the trial process's peak resident memory over its "
        "start (GiB); estimated: `plan.estimate` with its CPU runtime term (0.125 GiB).\n\n"
        "| model | setting | status | measured GiB | estimated GiB | error | weights | "
        "gradients + optimizer | activations | logits |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    out.write_text(head + "\n".join(rows) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
