"""Offload on one GPU: a model that does not fit the memory budget trains when its optimizer
(ZeRO-2) and its weights (ZeRO-3, FSDP2) live in host memory.

Runs a trial per strategy (`single`, `fsdp_offload`, `zero2_offload`, `zero3_offload`) under
an allocator cap
(`memory_budget_bytes`, as `memory_budget=` does in a search), through the search's own worker
and ranks, and writes each trial's status, samples/s, peak GPU memory, the model states each
rank counted (host ones included) and the estimate beside them.

    python benchmarks/offload.py [--model TinyLlama/TinyLlama-1.1B-Chat-v1.0] [--seq-len 256]
        [--budget-gib 10] [--out offload.json]

Expected on a GPU: `single` is `oom` (AdamW's 16 bytes a parameter alone exceed the budget);
the offload strategies are `ok` with their peak under the budget, checked by each rank as
applied (FSDP2's shards, DeepSpeed's fp32 partition, and under ZeRO-3 the weights'
partition, on the host). The first DeepSpeed trial compiles its CPU Adam (about a minute,
cached after), so FSDP2's runs first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from autotune.common.models import resolve_model
from autotune.common.trial import TrialSpec
from autotune.common.units import GIB
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.estimate import estimate
from autotune.plan.hardware import probe

STRATEGIES = ("single", "fsdp_offload", "zero2_offload", "zero3_offload")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--budget-gib", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--out", type=Path, default=Path("offload.json"))
    args = parser.parse_args()

    info = probe()
    if not info.cuda_available:
        raise SystemExit("offload keeps model states in host memory instead of a GPU's: no GPU")
    model = resolve_model(args.model)
    launcher = ForkserverLauncher()
    rows = []
    with tempfile.TemporaryDirectory(prefix="offload-") as work:
        for number, strategy in enumerate(STRATEGIES):
            params = {
                "batch_size": args.batch_size,
                "precision": "bf16",
                "optim": "adamw_torch",
                "strategy": strategy,
            }
            spec = TrialSpec(
                trial_number=number,
                model_name=model.name,
                model_config=model.config,
                task="causal-lm",
                seq_len=args.seq_len,
                device="cuda",
                params=params,
                warmup_steps=2,
                measure_steps=4,
                seed=0,
                memory_budget_bytes=int(args.budget_gib * GIB),
            )
            result = launch_trial(
                spec, Path(work) / str(number), timeout_s=args.timeout_s, launcher=launcher
            )
            expected = estimate(
                model.config, task="causal-lm", seq_len=args.seq_len, params=params, device="cuda"
            )
            rows.append(
                {
                    "strategy": strategy,
                    "status": result.status.value,
                    "reason": result.reason,
                    "samples_per_s": result.samples_per_s,
                    "peak_memory_gib": result.peak_memory_gib,
                    "rank_model_state_bytes": result.rank_model_state_bytes,
                    "estimate_gib": expected.total / GIB,
                    "estimate_model_state_bytes": expected.model_states,
                    "estimate_offloaded_bytes": expected.offloaded,
                    "training_args": result.training_args,
                    "stderr_tail": result.stderr_tail[-1500:],
                }
            )
            print(
                f"{strategy}: {result.status.value} {result.samples_per_s} samples/s "
                f"{result.peak_memory_gib} GiB (estimate {expected.total / GIB:.2f}) "
                f"{result.reason}",
                flush=True,
            )
    summary = {
        "device": info.name,
        "model": args.model,
        "seq_len": args.seq_len,
        "budget_gib": args.budget_gib,
        "trials": rows,
    }
    args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
