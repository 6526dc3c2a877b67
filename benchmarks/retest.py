"""How much of a landscape survives a rerun: a landscape recorded in two passes
(`landscapes/record.py ... passes=2`) against itself, pass by pass.

    python benchmarks/retest.py LANDSCAPE.json [LANDSCAPE.json ...] [--seeds 10]

For each landscape: how far the second pass's samples/s lie from the first's (their ratio's
median and quartiles), the rank correlation of the two passes, where each pass's best point
measured in the other, and how many points of the mean lie within 2/5/10% of its best. Then
`sampler=auto` and random sampling replayed (`replay.py`'s searches and clock) on the mean and
on each pass alone: what each had found within 5 and 10 baseline-times and after 20 trials
(median over seeds; the worst seed within 10 in brackets). Where the answers move with the
pass, the goal is finer than the machine's measurements.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import replay  # noqa: E402
from twin_calibration import spearman  # noqa: E402

from autotune.replay import Landscape  # noqa: E402

POLICIES = (replay.AUTO, "random")
HEADER = (
    "| landscape | policy | baseline | found @5 base | found @10 base (worst) | found @20 trials |"
)


def agreement(data: dict) -> list[str]:
    """The two passes of every ok point, side by side."""
    points = [p for p in data["points"] if p["status"] == "ok"]
    first = [p["passes"][0]["samples_per_s"] for p in points]
    second = [p["passes"][1]["samples_per_s"] for p in points]
    ratios = [b / a for a, b in zip(first, second, strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    best_1 = max(range(len(points)), key=first.__getitem__)
    best_2 = max(range(len(points)), key=second.__getitem__)
    mean = [p["samples_per_s"] for p in points]
    top = max(mean)
    near = ", ".join(
        f"{sum(s >= (1 - d) * top for s in mean)} within {d:.0%}" for d in (0.02, 0.05, 0.1)
    )
    return [
        f"{len(points)} points; pass 2 / pass 1: median {median:.2f} "
        f"(quartiles {q1:.2f}-{q3:.2f}); rank correlation {spearman(first, second):.2f}",
        f"pass 1's best ({first[best_1]:.0f} samples/s) measured {second[best_1]:.0f} in pass 2; "
        f"pass 2's best ({second[best_2]:.0f}) measured {first[best_2]:.0f} in pass 1",
        f"the mean's best {top:.1f} samples/s: {near}",
    ]


def variants(data: dict) -> dict[str, dict]:
    """The mean of the passes, and each pass alone."""
    out = {"mean": data}
    for i in range(len(data["points"][0]["passes"])):
        one = copy.deepcopy(data)
        for point in one["points"]:
            point.update(point["passes"][i])
        out[f"pass {i + 1}"] = one
    return out


def searches(name: str, data: dict, seeds: int, folder: Path) -> list[str]:
    lines = []
    for kind, one in variants(data).items():
        path = folder / f"{name}-{kind.replace(' ', '')}.json"
        path.write_text(json.dumps(one))
        key = f"{name} ({kind})"
        replay.SOURCES[key] = functools.partial(Landscape.load, path)
        optimum = replay.landscape(key).optimum()
        for policy in POLICIES:
            runs = [replay.search(key, policy, seed, 20)[0] for seed in range(seeds)]
            clock = replay.summarise_clock(runs, optimum, key)
            at_20 = statistics.median(replay.found(r, optimum) for r in runs)
            lines.append(
                f"| {kind} | {policy} | {replay.baseline_s(key):.1f} s | "
                f"{clock['found@5x']['median']:.2f} | {clock['found@10x']['median']:.2f} "
                f"({clock['found@10x']['min']:.2f}) | {at_20:.2f} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscapes", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    replay.quiet_optuna()
    with tempfile.TemporaryDirectory() as folder:
        for path in args.landscapes:
            data = json.loads(path.read_text())
            if "passes" not in data["points"][0]:
                sys.exit(f"{path}: recorded in one pass (record.py ... passes=2)")
            print(f"## {data['name']} ({data['machine']}, {data['recorded']})\n")
            print("\n".join(f"- {line}" for line in agreement(data)))
            print(f"\n{HEADER}\n|---|---|---|---|---|---|")
            print("\n".join(searches(data["name"], data, args.seeds, Path(folder))) + "\n")


if __name__ == "__main__":
    main()
