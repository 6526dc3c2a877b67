"""The measurements behind the CPU's advice in the knob catalogue (`Knob.prior["cpu"]`) and
the guess's cost bound (`study/guess.GUESS_COST`): eager attention against SDPA, and
samples/s by batch, on every recorded CPU landscape.

    python benchmarks/cpu_advice.py

Reads the landscapes recorded on an AMD EPYC (`benchmarks/landscapes/*.json`) and on an AMX
Xeon (`benchmarks/results/2026-11-27-xeon/run*/`, each recorded twice:
`python benchmarks/landscapes/record.py NAME model=... seq_len=... memory_budget=8GiB
space=benchmarks/results/2026-11-27-xeon/space.yaml`) and prints markdown tables, the one in
`benchmarks/results/cpu-advice.md`. Every setting is fused AdamW, no checkpointing and no
accumulation; each cell is one trial's samples/s (the grid's, not the baseline trial's; a trial
stopped early by its first timed steps counts with what they measured).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
FILES = [
    *sorted((HERE / "landscapes").glob("*.json")),
    *sorted((HERE / "results" / "2026-11-27-xeon").glob("run*/*.json")),
]
SAME = {"optim": "adamw_torch_fused", "gradient_checkpointing": False, "grad_accum": 1}


def speeds(path: Path) -> dict[tuple[str, int, str], float]:
    """(precision, batch, attention) -> samples/s of the ok points at the fixed knobs."""
    data = json.loads(path.read_text())
    out = {}
    for point in data["points"]:
        params = point["params"]
        if point["status"] not in ("ok", "stopped") or any(
            params.get(k, v) != v for k, v in SAME.items()
        ):
            continue
        key = (params.get("precision", "fp32"), params["batch_size"], params["attn_implementation"])
        out[key] = point["samples_per_s"]  # the grid's trial comes after the baseline's
    return out


def main() -> None:
    ratios: dict[str, list[float]] = {"fp32": [], "bf16": []}
    print("| landscape | machine | precision | samples/s by batch, eager / sdpa |")
    print("|---|---|---|---|")
    for path in FILES:
        data, found = json.loads(path.read_text()), speeds(path)
        label = path.stem + ("" if path.parent.name == "landscapes" else f" ({path.parent.name})")
        for precision in ("fp32", "bf16"):
            cells = []
            for batch in sorted({b for p, b, _ in found if p == precision}):
                eager, sdpa = (found.get((precision, batch, a)) for a in ("eager", "sdpa"))
                if eager and sdpa:
                    ratios[precision].append(eager / sdpa)
                    cells.append(f"{batch}: {eager:.0f} / {sdpa:.0f}")
            if cells:
                print(f"| {label} | {data['machine']} | {precision} | {', '.join(cells)} |")
    print()
    for precision, found in ratios.items():
        quartiles = statistics.quantiles(found, n=4)
        print(
            f"- {precision}: eager / sdpa over {len(found)} pairs: median {quartiles[1]:.2f}, "
            f"quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}, eager ahead in "
            f"{sum(r > 1 for r in found)}"
        )


if __name__ == "__main__":
    main()
