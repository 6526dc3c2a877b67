"""Record a landscape in one process: many settings measured back to back, no process each.

    python benchmarks/landscapes/record_inprocess.py NAME --model MODEL --seq-len N
        --space FILE [--budget-s 80] [--seed S] [--warmup-steps 2] [--measure-steps 5]
        [--out FILE]

For a GPU lease, where minutes are few: a trial process pays its start (fork, CUDA context) on
top of its steps, a landscape point needs only the steps. Each point here is the trial worker's
own `attempt_trial` (the same arguments, model, data, timing and memory figures as a search's
trial), run in this process one after another: the model built again, the allocator's cache
emptied and its peak reset between points. The points of the space (every combination of its
knobs' values) go in an order shuffled by `--seed` (default: the day's), so that each lease adds
other ones, until `--budget-s` is spent; the file is rewritten after each point, so a run cut
short keeps what it measured. Settings under torch.compile are left out: a compiled graph would
outlive its point in this process.

The format is `record.py`'s (`autotune.replay.Landscape.load` reads it), with
`"in_process": true`: a point's `wall_s` has no process start in it, and each point keeps the
parts of its cost (`model_build_s`, `warmup_s`, ...) for the GPU model to calibrate on. A space
that is not whole (the budget ran out) answers only the settings it holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import platform
import random
import shlex
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import psutil
import torch
import transformers
import yaml

import autotune
from autotune.child import worker
from autotune.common.knobs import is_compiled
from autotune.common.models import resolve_model
from autotune.common.trial import TrialResult, TrialSpec
from autotune.common.units import GIB
from autotune.plan.space_file import load_space
from autotune.replay import FIGURES

HERE = Path(__file__).parent
COST_PARTS = ("build_s", "train_s", "model_build_s", "data_s", "trainer_init_s", "cuda_init_s",
              "warmup_s", "compile_s", "mfu", "peak_allocated_gib", "final_loss")  # fmt: skip
"""What a point keeps beside `FIGURES`: where its time went, for the GPU model."""


def settings(space: Path) -> list[dict[str, Any]]:
    """Every combination of the space's knob values (read as a search reads them), but those
    under torch.compile."""
    knobs = load_space(str(space)).knobs
    combos = itertools.product(*(knob.choices for knob in knobs.values()))
    points = [dict(zip(knobs, combo, strict=True)) for combo in combos]
    return [p for p in points if not is_compiled(p)]


def measure(spec: TrialSpec, progress: Path) -> tuple[TrialResult, float]:
    """One point: the worker's trial in this process, and its wall time; then everything it
    held let go, so the next point starts from an empty allocator."""
    gc.unfreeze()  # the worker freezes what it finds on the heap: the last point's garbage
    gc.collect()
    if spec.device == "cuda":
        torch.cuda.empty_cache()
    started = time.perf_counter()
    result, _ = worker.attempt_trial(spec, progress)
    wall_s = time.perf_counter() - started
    assert result is not None  # one device: this process is rank 0
    return result, wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--model", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--space", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=80)
    parser.add_argument("--seed", type=int, default=date.today().toordinal())
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--measure-steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    argv = sys.argv[1:]
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = resolve_model(args.model)
    knobs = yaml.safe_load(args.space.read_text())["knobs"]
    order = settings(args.space)
    random.Random(args.seed).shuffle(order)
    out = args.out or HERE / f"{args.name}.json"
    # On a GPU each point's peak is its own (the allocator's, reset per point); on a CPU it is
    # this process's high-water mark, so there the file proves the mechanics, not the memory.
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
    else:
        total = psutil.virtual_memory().total
    landscape = {
        "name": args.name,
        "command": shlex.join(["python", "benchmarks/landscapes/record_inprocess.py", *argv]),
        "recorded": date.today().isoformat(),
        "machine": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "autotune": autotune.__version__,
        "model": model.name,
        "task": model.default_task,
        "seq_len": args.seq_len,
        "device": device,
        "memory_budget_gib": total / GIB,
        "in_process": True,
        "settings": {
            "warmup_steps": args.warmup_steps,
            "measure_steps": args.measure_steps,
            "seed": args.seed,
            "points_in_space": len(order),
        },
        "space": knobs,
        "points": [],
    }
    with tempfile.TemporaryDirectory(prefix="landscape-") as work:
        for number, params in enumerate(order):
            if time.perf_counter() - started > args.budget_s:
                break
            spec = TrialSpec(
                trial_number=number,
                model_name=model.name,
                model_config=model.config,
                task=model.default_task,
                seq_len=args.seq_len,
                device=device,
                params=params,
                warmup_steps=args.warmup_steps,
                measure_steps=args.measure_steps,
                seed=0,
            )
            result, wall_s = measure(spec, Path(work) / "progress.json")
            figures = dataclasses.replace(result, wall_s=wall_s)
            landscape["points"].append(
                {
                    "number": number,
                    "params": params,
                    "status": result.status.value,
                    **{k: getattr(figures, k) for k in (*FIGURES, *COST_PARTS)},
                    "reason": result.reason,
                }
            )
            out.write_text(json.dumps(landscape, indent=1) + "\n")
            speed = f"{result.samples_per_s:.1f} samples/s" if result.samples_per_s else ""
            print(
                f"{number}: {params} {result.status.value} {speed} {result.reason[:120]}",
                flush=True,
            )
    print(
        f"wrote {out}: {len(landscape['points'])} of {len(order)} points "
        f"in {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
