"""Reproduce the HF guide's bert-large table ("Efficient training on a single GPU") on this machine.

Runs the guide's eight configurations as autotune trials (same worker, same timing, same
memory figures as a search) and writes a table with samples/s, peak memory and both as ratios
to the vanilla configuration. The guide's figures (V100, seq 512) are printed beside them.

    python benchmarks/guide_table.py [--model bert-large-uncased] [--seq-len 512]
        [--warmup-steps 3] [--measure-steps 10] [--out guide_table.md]

On CPU fp16 is a no-op in the Trainer, so the fp16 rows measure fp32 there: the table says so.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.hardware import probe

# (label, knobs, guide samples/s, guide GB) from the guide's V100 table.
GUIDE = [
    ("bs 4, fp32, AdamW (vanilla)", {"batch_size": 4}, 8.86, 14.9),
    ("bs 1, grad accum 4", {"batch_size": 1, "grad_accum": 4}, 7.75, 8.7),
    ("bs 1, GA 4, grad checkpointing", {"batch_size": 1, "grad_accum": 4, "gc": True}, 5.99, 6.8),
    ("bs 4, fp16", {"batch_size": 4, "precision": "fp16"}, 18.64, 13.9),
    ("bs 1, GA 4, GC, fp16", {"batch_size": 1, "grad_accum": 4, "gc": True, "precision": "fp16"},
     10.09, 7.3),
    ("bs 4, adafactor", {"batch_size": 4, "optim": "adafactor"}, 7.96, 12.3),
    ("bs 1, GA 4, GC, fp16, adafactor", {"batch_size": 1, "grad_accum": 4, "gc": True,
                                         "precision": "fp16", "optim": "adafactor"}, 9.06, 4.8),
    ("bs 1, GA 4, GC, fp16, bnb 8-bit Adam", {"batch_size": 1, "grad_accum": 4, "gc": True,
                                              "precision": "fp16", "optim": "adamw_bnb_8bit"},
     10.35, 5.4),
]  # fmt: skip


def params(knobs: dict) -> dict:
    return {
        "batch_size": knobs["batch_size"],
        "grad_accum": knobs.get("grad_accum", 1),
        "gradient_checkpointing": knobs.get("gc", False),
        "precision": knobs.get("precision", "fp32"),
        "optim": knobs.get("optim", "adamw_torch"),
        "attn_implementation": "sdpa",
        "dataloader_num_workers": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large-uncased")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--measure-steps", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out", type=Path, default=Path("guide_table.md"))
    args = parser.parse_args()

    info = probe()
    device = "cuda" if info.cuda_available else "cpu"
    model = resolve_model(args.model)
    launcher = ForkserverLauncher()
    rows = []
    with tempfile.TemporaryDirectory(prefix="guide-") as work:
        for number, (label, knobs, guide_speed, guide_gb) in enumerate(GUIDE):
            spec = TrialSpec(
                trial_number=number,
                model_name=model.name,
                model_config=model.config,
                task="sequence-classification",
                seq_len=args.seq_len,
                device=device,
                params=params(knobs),
                warmup_steps=args.warmup_steps,
                measure_steps=args.measure_steps,
                seed=0,
            )
            result = launch_trial(
                spec, Path(work) / str(number), timeout_s=args.timeout_s, launcher=launcher
            )
            rows.append((label, guide_speed, guide_gb, result))
            print(
                f"{label}: {result.status.value} {result.samples_per_s} samples/s "
                f"{result.peak_memory_gib} GiB {result.reason}",
                flush=True,
            )

    vanilla = rows[0][3]
    lines = [
        f"# The HF guide's table on {info.name if device == 'cuda' else info.cpu_name}",
        "",
        f"{args.model}, seq_len {args.seq_len}, {args.warmup_steps} warm-up + "
        f"{args.measure_steps} timed steps per row; torch {info.torch_version}, "
        f"transformers {info.transformers_version}. Guide figures: V100.",
        "",
        "| config | samples/s | x vanilla | peak GiB | x vanilla | guide samples/s | guide x | "
        "guide GB | guide x |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, guide_speed, guide_gb, r in rows:
        ok = r.status is Status.OK and vanilla.status is Status.OK
        cells = (
            [
                f"{r.samples_per_s:.2f}",
                f"{r.samples_per_s / vanilla.samples_per_s:.2f}",
                f"{r.peak_memory_gib:.2f}",
                f"{r.peak_memory_gib / vanilla.peak_memory_gib:.2f}",
            ]
            if ok
            else [r.status.value, "", r.reason[:60], ""]
        )
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {guide_speed} | "
            f"{guide_speed / GUIDE[0][2]:.2f} | {guide_gb} | {guide_gb / GUIDE[0][3]:.2f} |"
        )
    if device == "cpu":
        lines += ["", "On CPU the Trainer ignores fp16: the fp16 rows ran in fp32."]
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps([{"config": label, **r.to_dict()} for label, _, _, r in rows], indent=2)
    )


if __name__ == "__main__":
    main()
