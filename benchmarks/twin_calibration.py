"""The GPU twin against every GPU figure the repository holds: a table of point, measured, twin
and error, and (with --fit) the twin's fitted constants re-fitted on the points.

    python benchmarks/twin_calibration.py [--add LANDSCAPE.json [--gpu H100]] [--fit]
        [--leave-one-out] [--out benchmarks/results/twin-calibration.md]

The points are `benchmarks/twin/points.json` (each names the file it comes from): a plain
PyTorch loop's figures and autotune's trials, on an H100 and an H200. What is compared:
samples/s and the peak of each measured point, the wall time of the trials that report one,
and how the failed trials ended (a timeout past its limit, an OOM with its time to the OOM, a
trial still compiling when the search was stopped). `--fit` minimises the squared log errors of
the speeds and walls over the constants `FITTED` names, by coordinate descent in log space
(deterministic, no dependency), and writes them back into `autotune/twin/constants.json`.

A GPU lease adds its points: `--add` takes a landscape the lease recorded on the GPU
(`benchmarks/landscapes/record_inprocess.py`: autotune's own trial worker, in one process) and
appends its points to `points.json`, so that `--fit` re-fits on them with the rest.
`--leave-one-out` says how well the twin predicts a point it was not fitted on: each measured
speed is predicted by constants fitted on the other points.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

from autotune.common.links import GpuLink
from autotune.common.models import resolve_model
from autotune.twin import model

HERE = Path(__file__).parent
POINTS = HERE / "twin" / "points.json"
CONSTANTS = Path(model.__file__).parent / model.CONSTANTS_FILE
SPEED_LIMIT = 0.10
"""The twin's goal on measured speeds: within 10% of each."""

FITTED: list[tuple[str, ...]] = [
    ("model", "efficiency", "hopper", "fp32"), ("model", "efficiency", "hopper", "tf32"),
    ("model", "efficiency", "hopper", "16bit"), ("model", "tokens_half", "hopper", "fp32"),
    ("model", "tokens_half", "hopper", "tf32"), ("model", "tokens_half", "hopper", "16bit"),
    ("model", "efficiency", "ampere", "tf32"), ("model", "efficiency", "ampere", "16bit"),
    ("model", "efficiency", "volta", "fp32"), ("model", "efficiency", "volta", "16bit"),
    ("model", "efficiency", "turing", "fp32"), ("model", "staged_link_share"),
    ("model", "traffic_bytes"),
    ("model", "checkpointing_host"), ("model", "autocast_host"), ("model", "loop_host"),
    ("model", "trainer_step_ms"), ("model", "trainer_micro_ms"),
    ("model", "compiled_speed"), ("model", "compile_s_per_layer"),
    ("model", "compile_before_oom"), ("model", "reserved_over_estimate"),
    ("hosts", "h100-host", "layer_host_ms"), ("hosts", "h200-host", "layer_host_ms"),
]  # fmt: skip
"""The constants `--fit` moves: those no datasheet or single measurement gives."""


def load_points() -> list[dict[str, Any]]:
    return json.loads(POINTS.read_text())["points"]


def landscape_points(path: Path, gpu: str | None) -> list[dict[str, Any]]:
    """A GPU landscape's points as calibration points: measured by the trial worker, in one
    process (so no wall time: a point's has no process start)."""
    land = json.loads(path.read_text())
    if land.get("device") != "cuda":
        raise SystemExit(f"{path}: recorded on {land.get('device')}, not on a GPU")
    key = model.gpu(gpu or land["machine"]).key
    steps = land["settings"]
    points = []
    for p in land["points"]:
        measured: dict[str, Any] = {"status": p["status"]}
        if p["status"] == "ok":
            measured |= {
                "samples_per_s": p["samples_per_s"],
                "peak_gib": p["peak_memory_gib"],
                "peak_kind": "reserved",
            }
        elif p["status"] != "oom":
            continue  # an error says nothing of speed or memory
        points.append(
            {
                "id": f"{land['name']} {land['recorded']} #{p['number']}",
                "gpu": key,
                "source": f"{path.name} ({land['command']})",
                "runner": "trial",
                "model": land["model"],
                "task": land["task"],
                "seq_len": land["seq_len"],
                "params": p["params"],
                "warmup_steps": steps["warmup_steps"],
                "measure_steps": steps["measure_steps"],
                "measured": measured,
            }
        )
    return points


def add_points(path: Path, gpu: str | None) -> int:
    """Append a landscape's points to points.json (those not already there); how many."""
    data = json.loads(POINTS.read_text())
    known = {p["id"] for p in data["points"]}
    new = [p for p in landscape_points(path, gpu) if p["id"] not in known]
    data["points"] += new
    POINTS.write_text(json.dumps(data, indent=1) + "\n")
    return len(new)


def predict(point: dict[str, Any]) -> model.Prediction:
    spec = resolve_model(point["model"])
    budget = point.get("memory_budget_gib")
    g = model.gpu(point["gpu"])
    if "link" in point:  # the point's GPUs reached each other otherwise than the GPU's own
        g = dataclasses.replace(g, link=GpuLink(a=0, b=1, **point["link"]))
    return model.predict(
        g,
        spec.config,
        task=point["task"],
        seq_len=point["seq_len"],
        params=point["params"],
        warmup_steps=point["warmup_steps"],
        measure_steps=point["measure_steps"],
        trainer=point["runner"] == "trial",
        memory_budget_bytes=None if budget is None else int(budget * 2**30),
        devices=point.get("devices", 1),
    )


def rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per compared figure: point, figure, measured, twin, error (twin / measured - 1)."""
    out = []
    for point in points:
        p = predict(point)
        m = point["measured"]

        def row(
            figure: str, measured: float, twin: float, kind: str = "", at: dict[str, Any] = point
        ) -> None:
            out.append(
                {
                    "point": at["id"],
                    "figure": figure,
                    "measured": measured,
                    "twin": twin,
                    "error": twin / measured - 1,
                    "kind": kind,
                }
            )

        if m["status"] == "ok":
            row("samples/s", m["samples_per_s"], p.samples_per_s or 0.0, "speed")
            peak = p.peak_gib
            if m.get("peak_kind") == "allocated":  # the loop's max_memory_allocated: no cache
                peak /= model.model_constant("reserved_over_estimate")
            if "peak_gib" in m:
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
    elif "wall_s" not in m:  # an OOM measured in one process: its status alone
        same = status == m["status"]
        shown = m["status"]
    else:
        same = status == m["status"]
        shown = f"{m['status']} at {m['wall_s']:.0f} s"
    error = None
    if same and m["status"] == "oom" and "wall_s" in m:
        error = p.wall_s / m["wall_s"] - 1
    return {
        "point": point["id"],
        "figure": "ending",
        "measured": shown,
        "twin": twin,
        "error": error,
        "kind": "ending",
        "same": same,
    }


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
    return total + sum(
        log_error(r) for r in table if r["kind"] == "ending" and r["error"] is not None
    )


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


def fit(points: list[dict[str, Any]], rounds: int = 12, sweeps: int = 8) -> float:
    """Coordinate descent on the log of each FITTED constant: try x / f and x * f, keep the
    better, halve f's exponent each round; a sweep of `rounds` again from the result while the
    last one gained (coupled constants move a step at a time). Works on the loaded constants in
    place."""
    tree = model.constants()
    best = loss(points)
    for _ in range(sweeps):
        start = best
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
        if start - best < 1e-4:
            break
    for path in FITTED:
        _set(tree, path, float(f"{_get(tree, path):.4g}"))
    return loss(points)


def leave_one_out(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured speed predicted by constants fitted on the other points."""
    fitted = json.loads(json.dumps(model.constants()))
    out = []
    for k, point in enumerate(points):
        if point["measured"]["status"] != "ok":
            continue
        model.constants().update(json.loads(json.dumps(fitted)))
        fit(points[:k] + points[k + 1 :], rounds=6)
        twin = predict(point).samples_per_s or 0.0
        measured = point["measured"]["samples_per_s"]
        kind = _kind(point)
        alone = sum(_kind(q) == kind for q in points if q["measured"]["status"] == "ok") == 1
        out.append(
            {
                "point": point["id"],
                "measured": measured,
                "twin": twin,
                "error": twin / measured - 1,
                "alone": alone,
            }
        )
    model.constants().update(fitted)
    return out


def _kind(point: dict[str, Any]) -> tuple[str, str, bool, bool]:
    """What a point's own constants are: its GPU's architecture, its precision's class,
    compiled or not, and whether its GPUs' copies crossed host memory (no P2P)."""
    params = point["params"]
    staged = point.get("devices", 1) > 1 and not point.get("link", {}).get("p2p", True)
    return (
        model.gpu(point["gpu"]).architecture,
        model._precision_class(params.get("precision", "fp32")),
        model.is_compiled(params),
        staged,
    )


def markdown(table: list[dict[str, Any]], s: dict[str, Any]) -> str:
    lines = [
        "# The GPU twin against every GPU figure the repository holds",
        "",
        "`python benchmarks/twin_calibration.py` (constants: `autotune/twin/constants.json`;",
        "points: `benchmarks/twin/points.json`, each with its source file).",
        "",
        "| point | figure | measured | twin | error |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        if r["kind"] == "ending":
            error = "same" if r["same"] else "differs"
            if r["error"] is not None:
                error += f" ({r['error']:+.0%} in time)"
            lines.append(f"| {r['point']} | ending | {r['measured']} | {r['twin']} | {error} |")
        else:
            lines.append(
                f"| {r['point']} | {r['figure']} | {r['measured']:.4g} | "
                f"{r['twin']:.4g} | {r['error']:+.1%} |"
            )
    lines += [
        "",
        f"Speeds within 10%: {s['speeds_within_10pct']} of {s['speeds']} "
        f"(largest error {s['speed_max_error']:.1%}); Spearman's rank correlation of the "
        f"speeds {s['spearman']:.3f}; peaks within {s['memory_max_error']:.1%}; wall "
        f"times within {s['wall_max_error']:.1%}; failed trials' endings reproduced: "
        f"{s['endings_reproduced']} of {s['endings']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--add", type=Path, help="a GPU landscape whose points to add")
    parser.add_argument("--gpu", help="the twin's name of the landscape's GPU (default: its own)")
    parser.add_argument("--fit", action="store_true", help="re-fit FITTED and write them back")
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="predict each speed from constants fitted on the others",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "twin-calibration.md")
    args = parser.parse_args()
    if args.add:
        print(f"added {add_points(args.add, args.gpu)} points of {args.add} to {POINTS}")
    points = load_points()
    if args.fit:
        before = loss(points)
        after = fit(points)
        CONSTANTS.write_text(json.dumps(model.constants(), indent=2) + "\n")
        print(
            f"fitted {len(FITTED)} constants on {len(points)} points: loss {before:.4f} -> "
            f"{after:.4f}; wrote {CONSTANTS}"
        )
    table = rows(points)
    s = summary(table)
    text = markdown(table, s)
    if args.leave_one_out:
        held = leave_one_out(points)
        text += (
            "\n## Each speed predicted by constants fitted without it\n\n"
            "| point | measured | twin | error |\n|---|---|---|---|\n"
        )
        text += "".join(
            f"| {r['point']}{' (alone)' * r['alone']} | {r['measured']:.4g} | "
            f"{r['twin']:.4g} | {r['error']:+.1%} |\n"
            for r in held
        )
        errors = sorted(abs(r["error"]) for r in held if not r["alone"])
        text += (
            f"\nOf the {len(errors)} points not alone: within 10%, "
            f"{sum(e <= SPEED_LIMIT for e in errors)}; median error "
            f"{statistics.median(errors):.1%}, largest {errors[-1]:.1%}. (alone): the only "
            "measured point of its kind (GPU architecture, precision class, compiled or not, "
            "copies through host memory or not): held out, nothing else fits its constants, "
            "so its figure tests nothing; the next GPU run's landscape adds such points.\n"
        )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
