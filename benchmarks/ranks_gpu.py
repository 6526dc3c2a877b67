"""Trials on several GPUs: each strategy trains one trial on N GPUs through the search's own
worker and ranks, checked as applied by each rank, with every rank's peak and held parameters.

    python benchmarks/ranks_gpu.py [--devices 2] [--model google/bert_uncased_L-4_H-256_A-4]
        [--seq-len 128] [--out ranks_gpu.json]

Needs `--devices` GPUs (a one-GPU machine exits saying so). Expected: every strategy `ok`;
`ddp`, `zero1`, `zero2` hold every parameter on each rank, the sharded ones about 1/N each;
the per-rank peaks ordered roughly as `knobs.MEMORY_ORDER` says (the offloaded ones least);
samples/s of `ddp` near N times `single`'s (its scaling efficiency); `dp` (one process, the
Trainer's DataParallel) below `ddp`, its peak GPU 0's; `tp` (tensor parallelism, on a
2-block Llama: BERT has no tensor-parallel plan) `ok` beside `ddp` on the same model, each rank
holding about 1/N of the split weights. A strategy whose NCCL
group cannot form, or whose ranks share one GPU, shows here as `error` or as every rank's
peak on one device.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from autotune.common.models import resolve_model
from autotune.common.trial import TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.hardware import probe

STRATEGIES = ("single", "ddp", "dp", "fsdp", "fsdp_offload", "zero1", "zero2", "zero3")
LLAMA = str(Path(__file__).resolve().parents[1] / "examples" / "tiny-llama")
"""A model with a tensor-parallel plan: `tp` and `ddp` beside it, as causal LMs."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--model", default="google/bert_uncased_L-4_H-256_A-4")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--timeout-s", type=float, default=180)
    parser.add_argument("--out", type=Path, default=Path("ranks_gpu.json"))
    args = parser.parse_args()

    info = probe()
    gpus = len(info.cuda_device_names) if info.cuda_available else 0
    if gpus < args.devices:
        raise SystemExit(f"{args.devices} ranks need {args.devices} GPUs; this machine has {gpus}")
    # What a worker owning the first N GPUs sets before its fork server starts.
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(args.devices)))
    launcher = ForkserverLauncher()
    rows = []
    runs = [(s, args.model, "sequence-classification") for s in STRATEGIES]
    runs += [("ddp", LLAMA, "causal-lm"), ("tp", LLAMA, "causal-lm")]
    with tempfile.TemporaryDirectory(prefix="ranks-gpu-") as work:
        for number, (strategy, model_name, task) in enumerate(runs):
            model = resolve_model(model_name)
            params = {
                "batch_size": 16,
                "precision": "bf16",
                "optim": "adamw_torch",
                "strategy": strategy,
            }
            spec = TrialSpec(
                trial_number=number,
                model_name=model.name,
                model_config=model.config,
                task=task,
                seq_len=args.seq_len,
                device="cuda",
                params=params,
                warmup_steps=3,
                measure_steps=10,
                seed=0,
                devices=args.devices,
            )
            result = launch_trial(
                spec, Path(work) / str(number), timeout_s=args.timeout_s, launcher=launcher
            )
            rows.append(
                {
                    "strategy": strategy,
                    "model": model_name,
                    "status": result.status.value,
                    "reason": result.reason,
                    "samples_per_s": result.samples_per_s,
                    "peak_memory_gib": result.peak_memory_gib,
                    "rank_peak_memory_gib": result.rank_peak_memory_gib,
                    "rank_params": result.rank_params,
                    "n_params": result.n_params,
                    "rank_model_state_bytes": result.rank_model_state_bytes,
                    "stderr_tail": result.stderr_tail[-1500:],
                }
            )
            print(
                f"{strategy}: {result.status.value} {result.samples_per_s} samples/s, rank "
                f"peaks {result.rank_peak_memory_gib} GiB, params {result.rank_params} "
                f"{result.reason}",
                flush=True,
            )
    summary = {
        "devices": args.devices,
        "device": info.name,
        "gpu_link": (link := info.link_between(range(args.devices))) and link.describe(),
        "gpu_links_error": info.gpu_links_error,
        "model": args.model,
        "seq_len": args.seq_len,
        "trials": rows,
    }
    args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
