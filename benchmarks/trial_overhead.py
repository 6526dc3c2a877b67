"""Where a trial's time goes besides its timed steps: the parts trials.csv records, for one
model's trial forked from the fork server and started cold.

    python benchmarks/trial_overhead.py [--model bert-large-uncased] [--seq-len 32]
        [--batch-size 2] [--repeats 2]

Each row is one trial of `--repeats` per launcher, through the search's own runner and worker
(fp32, SGD, 1 warm-up and 2 timed steps: short steps, so that what is not training shows).
wall_s = overhead_s (process_s + imports_s + cuda_init_s + finish_s) + build_s (model_build_s
+ data_s + trainer_init_s) + train_s (warmup_s + the timed steps). On a GPU (the probe says)
the trial trains there.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from autotune.common.models import resolve_model
from autotune.common.trial import TrialSpec
from autotune.execute.launchers import WORKER_COMMAND, CommandLauncher, ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.hardware import probe

PARTS = ("wall_s", "overhead_s", "process_s", "imports_s", "cuda_init_s", "finish_s", "build_s",
         "model_build_s", "data_s", "trainer_init_s", "train_s", "warmup_s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large-uncased")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    model = resolve_model(args.model)
    device = "cuda" if probe().cuda_available else "cpu"
    spec = TrialSpec(
        trial_number=0,
        model_name=model.name,
        model_config=model.config,
        task=model.default_task,
        seq_len=args.seq_len,
        device=device,
        params={"batch_size": args.batch_size, "precision": "fp32", "optim": "sgd"},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
    )
    print(f"{args.model}, seq {args.seq_len}, batch {args.batch_size}, {device}: seconds")
    print(" | ".join(["launcher", *PARTS, "timed steps"]))
    launchers = {"forked": ForkserverLauncher(), "cold": CommandLauncher(WORKER_COMMAND)}
    with tempfile.TemporaryDirectory(prefix="overhead-") as work:
        for name, launcher in launchers.items():
            for number in range(args.repeats):
                trial = dataclasses.replace(spec, trial_number=number)
                result = launch_trial(
                    trial, Path(work) / f"{name}{number}", timeout_s=900, launcher=launcher
                )
                if result.train_s is None:
                    print(f"{name} | {result.status.value}: {result.reason}")
                    continue
                parts = [getattr(result, p) for p in PARTS]
                shown = ["-" if v is None else f"{v:.2f}" for v in parts]
                timed_s = sum(result.step_times_ms) / 1e3
                print(" | ".join([name, *shown, f"{timed_s:.2f}"]), flush=True)


if __name__ == "__main__":
    main()
