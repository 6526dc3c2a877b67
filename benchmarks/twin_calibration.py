"""The GPU twin against every GPU figure the repository holds: a table of point, measured, twin
and error, and (with --fit) the twin's fitted constants re-fitted on the points.

    python benchmarks/twin_calibration.py [--fit] [--out benchmarks/results/twin-calibration.md]

The points are `benchmarks/twin/points.json` (each names the file it comes from): a plain
PyTorch loop's figures and autotune's trials, on an H100 and an H200. What is compared:
samples/s and the peak of each measured point, the wall time of the trials that report one,
and how the failed trials ended (a timeout past its limit, an OOM with its time to the OOM, a
trial still compiling when the search was stopped). `--fit` minimises the squared log errors of
the speeds and walls over the constants `FITTED` names, by coordinate descent in log space
(deterministic, no dependency), and writes them back into `autotune/twin/constants.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from autotune.common.models import resolve_model
from autotune.twin import model

HERE = Path(__file__).parent
POINTS = HERE / "twin" / "points.json"
CONSTANTS = Path(model.__file__).parent / model.CONSTANTS_FILE
SPEED_LIMIT = 0.10
"""The twin's goal on measured speeds: within 10% of each."""

FITTED: list[tuple[str, ...]] = [
    ("model", "efficiency", "fp32"), ("model", "efficiency", "tf32"),
    ("model", "efficiency", "16bit"), ("model", "tokens_half", "fp32"),
    ("model", "tokens_half", "tf32"), ("model", "tokens_half", "16bit"), ("model", "traffic_bytes"),
    ("model", "checkpointing_host"), ("model", "autocast_host"), ("model", "loop_host"),
    ("model", "trainer_step_ms"), ("model", "trainer_micro_ms"),
    ("model", "optimizers", "foreach", "bytes"),
    ("model", "compiled_speed"), ("model", "compile_s_per_layer"),
    ("model", "compile_before_oom"), ("model", "reserved_over_estimate"),
    ("hosts", "h100-host", "layer_host_ms"), ("hosts", "h200-host", "layer_host_ms"),
]  # fmt: skip
"""The constants `--fit` moves: those no datasheet or single measurement gives."""


def load_points() -> list[dict[str, Any]]:
    return json.loads(POINTS.read_text())["points"]


def predict(point: dict[str, Any]) -> model.Prediction:
    spec = resolve_model(point["model"])
    budget = point.get("memory_budget_gib")
    return model.predict(
        model.gpu(point["gpu"]), spec.config, task=point["task"], seq_len=point["seq_len"],
        params=point["params"], warmup_steps=point["warmup_steps"],
        measure_steps=point["measure_steps"], trainer=point["runner"] == "trial",
        memory_budget_bytes=None if budget is None else int(budget * 2**30),
    )  # fmt: skip


def rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per compared figure: point, figure, measured, twin, error (twin / measured - 1)."""
    out = []
    for point in points:
        p = predict(point)
        m = point["measured"]

        def row(figure: str, measured: float, twin: float, kind: str = "",
                at: dict[str, Any] = point) -> None:  # fmt: skip
            out.append({"point": at["id"], "figure": figure, "measured": measured,
                        "twin": twin, "error": twin / measured - 1, "kind": kind})  # fmt: skip

        if m["status"] == "ok":
            row("samples/s", m["samples_per_s"], p.samples_per_s or 0.0, "speed")
            peak = p.peak_gib
            if m["peak_kind"] == "allocated":  # the loop's max_memory_allocated: no cache
                peak /= model.model_constant("reserved_over_estimate")
            row(f"peak GiB ({m['peak_kind']})", m["peak_gib"], peak, "memory")
            if "wall_s" in m:
                row("wall s", m["wall_s"], p.wall_s, "wall")
            if "compile_and_steps_s" in m:
                steps = (point["warmup_steps"] + point["measure_steps"]) * p.step_s
                row("compile + steps s", m["compile_and_steps_s"], p.compile_s + steps, "wall")
        else:
            out.append(_ending(point, p))
    return out


def _ending(point: dict[str, Any], p: model.Prediction) -> dict[str, Any]:
    """How a failed trial ended, measured and in the twin."""
    m = point["measured"]
    status = p.status.value
    limit = point.get("timeout_s")
    if limit is not None and p.wall_s > limit:
        status = "timeout"
    twin = f"{status} at {min(p.wall_s, limit or p.wall_s):.0f} s (needs {p.wall_s:.0f} s)"
    if m["status"] == "interrupted":
        same = p.wall_s > m["running_after_s"]
        shown = f"running after {m['running_after_s']} s"
    else:
        same = status == m["status"]
        shown = f"{m['status']} at {m['wall_s']:.0f} s"
    error = None
    if same and m["status"] == "oom":
        error = p.wall_s / m["wall_s"] - 1
    return {"point": point["id"], "figure": "ending", "measured": shown, "twin": twin,
            "error": error, "kind": "ending", "same": same}  # fmt: skip


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = rank
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def summary(table: list[dict[str, Any]]) -> dict[str, Any]:
    speeds = [r for r in table if r["kind"] == "speed"]
    return {
        "speed_max_error": max(abs(r["error"]) for r in speeds),
        "speeds_within_10pct": sum(abs(r["error"]) <= SPEED_LIMIT for r in speeds),
        "speeds": len(speeds),
        "spearman": spearman([r["measured"] for r in speeds], [r["twin"] for r in speeds]),
        "memory_max_error": max(abs(r["error"]) for r in table if r["kind"] == "memory"),
        "wall_max_error": max(abs(r["error"]) for r in table if r["kind"] == "wall"),
        "endings_reproduced": sum(r.get("same", False) for r in table if r["kind"] == "ending"),
        "endings": sum(r["kind"] == "ending" for r in table),
    }


def loss(points: list[dict[str, Any]]) -> float:
    table = rows(points)

    def log_error(r: dict[str, Any]) -> float:  # an ok point the twin calls oom: -99%
        return math.log1p(max(r["error"], -0.99)) ** 2

    total = sum(log_error(r) for r in table if r["kind"] in ("speed", "wall", "memory"))
    # An ending the twin gets wrong weighs as a 50% error.
    total += sum(0.0 if r["same"] else math.log(1.5) ** 2 for r in table if r["kind"] == "ending")
    return total + sum(log_error(r) for r in table
                       if r["kind"] == "ending" and r["error"] is not None)  # fmt: skip


def _parent(tree: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The dict holding the last key of `path`, stepping into each constant's "value"."""
    node = tree
    for key in path[:-1]:
        node = node[key]
        if "value" in node and "source" in node:
            node = node["value"]
    return node


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> float:
    held = _parent(tree, path)[path[-1]]
    return held["value"] if isinstance(held, dict) else held


def _set(tree: dict[str, Any], path: tuple[str, ...], new: float) -> None:
    parent = _parent(tree, path)
    if isinstance(parent[path[-1]], dict):
        parent[path[-1]]["value"] = new
    else:
        parent[path[-1]] = new


def fit(points: list[dict[str, Any]], rounds: int = 12) -> float:
    """Coordinate descent on the log of each FITTED constant: try x / f and x * f, keep the
    better, halve f's exponent each round. Works on the loaded constants in place."""
    tree = model.constants()
    best = loss(points)
    for round_ in range(rounds):
        step = 2 ** (0.5 / 2**round_)
        for path in FITTED:
            current = _get(tree, path)
            for candidate in (current / step, current * step):
                _set(tree, path, candidate)
                trial = loss(points)
                if trial < best:
                    best, current = trial, candidate
            _set(tree, path, current)
    for path in FITTED:
        _set(tree, path, float(f"{_get(tree, path):.4g}"))
    return loss(points)


def markdown(table: list[dict[str, Any]], s: dict[str, Any]) -> str:
    lines = ["# The GPU twin against every GPU figure the repository holds", "",
             "`python benchmarks/twin_calibration.py` (constants: `autotune/twin/constants.json`;",
             "points: `benchmarks/twin/points.json`, each with its source file).", "",
             "| point | figure | measured | twin | error |", "|---|---|---|---|---|"]  # fmt: skip
    for r in table:
        if r["kind"] == "ending":
            error = "same" if r["same"] else "differs"
            if r["error"] is not None:
                error += f" ({r['error']:+.0%} in time)"
            lines.append(f"| {r['point']} | ending | {r['measured']} | {r['twin']} | {error} |")
        else:
            lines.append(f"| {r['point']} | {r['figure']} | {r['measured']:.4g} | "
                         f"{r['twin']:.4g} | {r['error']:+.1%} |")  # fmt: skip
    lines += ["", f"Speeds within 10%: {s['speeds_within_10pct']} of {s['speeds']} "
              f"(largest error {s['speed_max_error']:.1%}); Spearman's rank correlation of the "
              f"speeds {s['spearman']:.3f}; peaks within {s['memory_max_error']:.1%}; wall "
              f"times within {s['wall_max_error']:.1%}; failed trials' endings reproduced: "
              f"{s['endings_reproduced']} of {s['endings']}.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="re-fit FITTED and write them back")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "twin-calibration.md")
    args = parser.parse_args()
    points = load_points()
    if args.fit:
        before = loss(points)
        after = fit(points)
        CONSTANTS.write_text(json.dumps(model.constants(), indent=2) + "\n")
        print(f"fitted {len(FITTED)} constants on {len(points)} points: loss {before:.4f} -> "
              f"{after:.4f}; wrote {CONSTANTS}")  # fmt: skip
    table = rows(points)
    s = summary(table)
    text = markdown(table, s)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
