"""Search strategies on recorded landscapes: which finds the fastest config in the fewest trials?

Each landscape (`benchmarks/landscapes/`) holds a measurement for every point of a space:
five recorded on a CPU with `sampler=grid`, and five answered by the GPU twin
(`landscapes/twin.py`: the default CUDA space for bert-large at seq 512 on an H100 and an A100,
and Qwen2.5-0.5B at seq 1024 on an H100; and a multi-GPU space, every strategy a search on
several GPUs chooses among, for Qwen2.5-7B at seq 2048 on an 8x H100 NVLink host and a 4x L4
PCIe host, each trial on all of the host's GPUs; each trial's GPU time included) (`SOURCES`).
autotune's samplers run through the real search loop (`autotune.replay`: sampler, tell rules,
pre-trial checks and the skip by estimate as in a search), each over several seeds. The peers'
strategies run as they work, on the same answers:

- Lightning's BatchSizeFinder (binsearch mode): doubles the batch from the smallest until one
  runs out of memory, then bisects; keeps the largest batch that fits. Other knobs at defaults.
- HF `auto_find_batch_size`: starts at a large batch (the landscape's largest) and shrinks it on
  each out-of-memory until one fits: here to the next smaller batch the landscape has.
  accelerate 1.x shrinks by 0.9, older releases by half; on the CPU landscapes' doubling
  batches that is halving, which undercounts the OOMs of 0.9 steps.
- DeepSpeed autotuning, fast mode: sweeps the micro batch at fixed other knobs (from the
  smallest until one runs out of memory) and keeps the fastest.
- HF defaults: the baseline alone.
- random (`sampler=random`) and the full grid (`sampler=grid`), through the loop.

For each: the samples/s of its pick over the landscape's optimum (what a full grid finds)
after 10 and 20 trials, how many trials it took to come within 2% of the optimum,
trials spent on OOM, and the recorded wall time of the trials it ran (CPU landscapes).

A pick is the fastest feasible trial measured. The recorded landscapes' points are one
measurement each, replayed as they are: every seed of `sampler=auto` sees the same figures. The
twin's points are noise-free, and each seed measures them afresh with the GPUs' step noise
(`Landscape.remeasure_sigma`), so that its seeds are re-runs of the search; a pick is scored at
its point's noise-free figure (a lucky measurement of a slower point is what a user would get),
and the optimum is the best noise-free figure. The peers run on the points' figures, noise-free
on the twin: the batch they keep does not hang on a measurement's luck.

The clock columns score the same searches against simulated search time instead of trials
(`autotune.replay.on_clock`): the trials run one after another, each costing its recorded
`wall_s`, and a trial counts from the moment it ends, so a slow trial (a large batch, a
compile, one that runs out of memory late) spends time that a count of trials does not see.
Time is in baseline-times, the recorded wall time of the landscape's HF-defaults trial (the
search's first), so that landscapes of different speed compare: found @5/10/20 base is the
median over seeds of the pick/optimum among the trials ended by 5, 10 and 20 baseline-times
(the seconds they are on that landscape in the header), and "time to 2%" the median time at
which the pick first came within 2% of the optimum ("never" where fewer than half of the
seeds got there). A search whose trials all ended before a mark counts what it found in them.
A peer hands over its pick when it stops, so its pick counts from the end of its last trial
(nothing before; the batches it tried and did not keep find nothing). A landscape without
recorded costs would have "-" there. The table under the summary gives found @5 and
@10 base for every landscape.

    python benchmarks/replay.py [--seeds 10] [--trials 20] [--jobs 2]

Writes benchmarks/results/replay.json and benchmarks/results/replay.md (the tables); a run
that selects less (other --seeds or --trials, some --landscapes or --policies) writes them to
benchmarks/replay-partial/ or --out instead, so the committed tables come from a full run only.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from landscapes import twin  # noqa: E402

from autotune.common.trial import OUT_OF_MEMORY, Status  # noqa: E402
from autotune.plan.config import RunConfig  # noqa: E402
from autotune.plan.estimate import Measured, calibrated_gib  # noqa: E402
from autotune.replay import Landscape, Trial, on_clock, picked, plan_for, replay  # noqa: E402
from autotune.study.sampling.model import confidence  # noqa: E402
from autotune.study.sampling.sampler import quiet_optuna  # noqa: E402

SOURCES: dict[str, Callable[[], Landscape]] = {
    **{p.stem: functools.partial(Landscape.load, p)
       for p in sorted((HERE / "landscapes").glob("*.json"))},
    **{name: functools.partial(twin.landscape, name) for name in twin.TWINS},
}  # fmt: skip
"""Landscape name -> the function that makes it. Another source of points (a GPU performance
model's) is one more entry: a function of no arguments returning a `Landscape` whose `points`
list every point of its space (`params`, `status`, `samples_per_s`, `peak_memory_gib`, and the
trial's cost `wall_s` for the clock columns; "-" there without it) and whose `answer` gives a
setting's point. Its HF-defaults point is the clock's unit (`baseline_s`)."""
AUTO = "autotune (sampler=auto)"
SEARCHES: dict[str, dict[str, Any]] = {
    AUTO: {"sampler": "auto"},
    "auto without the estimate": {"sampler": "auto", "estimate_margin": None},
    "tpe (multivariate; auto before)": {"sampler": "tpe"},
    "gp": {"sampler": "gp"},
    "nsga2": {"sampler": "nsga2"},
    "random": {"sampler": "random"},
    "grid": {"sampler": "grid"},
}
GRID_LIMIT = 500
"""Points beyond which the grid is not replayed (the twin's have 51,841 to 124,417)."""
WITHIN = 0.98
TRIAL_TIMEOUT_S = RunConfig.model_fields["trial_timeout"].default
CLOCK_MARKS = (5, 10, 20)
"""Simulated search time, in baseline-times, at which the clock columns look."""


@functools.cache
def landscape(name: str) -> Landscape:
    return SOURCES[name]()


@functools.cache
def baseline_s(name: str) -> float | None:
    """The recorded wall time of the landscape's HF-defaults trial: the clock's unit."""
    (point,), _ = hf_defaults(batches_at_defaults(landscape(name)))
    return point.get("wall_s")


def clock_marks_s(name: str) -> list[float] | None:
    base = baseline_s(name)
    return None if base is None else [mark * base for mark in CLOCK_MARKS]


def search(name: str, policy: str, seed: int, trials: int) -> tuple[list[Trial], int | None]:
    """The trials a search ran, and (for `sampler=auto`) how many untried settings its
    confidence said could still beat the best by 2%."""
    land = landscape(name)
    settings = dict(SEARCHES[policy])
    n_trials = len(land.points) + 1 if settings["sampler"] == "grid" else trials
    replayed = replay(land, n_trials=n_trials, seed=seed, **settings)
    could_beat = None
    if policy == AUTO:
        said = confidence(replayed.plan, replayed.records)
        could_beat = None if said is None else said.could_beat
    # Skipped proposals run nothing, cost no time and use up no trial: the trials are the runs.
    # As the executor returned them: a point past the trial's limit (a long compile on a GPU
    # twin) is a timeout that cost the limit.
    trials = [
        Trial(
            r.status.value,
            r.samples_per_s if r.feasible(land.memory_budget_gib) else None,
            r.wall_s,
            point.get("true_samples_per_s"),
        )
        for r, point in zip(replayed.results, replayed.answered, strict=True)
    ]
    wall_s = _wall(trials)
    assert wall_s is None or math.isclose(wall_s, replayed.clock_s), (wall_s, replayed.clock_s)
    return trials, could_beat


# The peers' strategies: batch size only, other knobs at the HF defaults.


def batches_at_defaults(land: Landscape) -> dict[int, dict]:
    """Batch size -> the landscape's point with every other knob at the HF defaults."""
    with tempfile.TemporaryDirectory() as work:
        baseline = plan_for(land, Path(work), n_trials=1, seed=0).baseline
    fixed = {k: v for k, v in baseline.items() if k != "batch_size"}
    found: dict[int, dict] = {}
    for point in land.points:
        params = point["params"]
        if (
            all(params.get(k) == v for k, v in fixed.items())
            and params.get("torch_compile", "off") == "off"
        ):
            found.setdefault(params["batch_size"], point)
    return dict(sorted(found.items()))


def lightning(points: dict[int, dict]) -> tuple[list[dict], dict | None]:
    sizes = list(points)
    tried, low, high, i = [], None, None, 0
    while True:
        tried.append(points[sizes[i]])
        if tried[-1]["status"] == Status.OK.value:
            low = i
            if high is None and i + 1 < len(sizes):
                i += 1
                continue
        else:
            high = i
        if low is None or high is None or high - low <= 1:
            break
        i = (low + high) // 2
    return tried, points[sizes[low]] if low is not None else None


def hf_auto_find_batch_size(points: dict[int, dict]) -> tuple[list[dict], dict | None]:
    tried = []
    for size in reversed(points):
        tried.append(points[size])
        if points[size]["status"] == Status.OK.value:
            return tried, points[size]
    return tried, None


def deepspeed_fast(points: dict[int, dict]) -> tuple[list[dict], dict | None]:
    tried = []
    for size in points:
        tried.append(points[size])
        if points[size]["status"] != Status.OK.value:
            break
    ok = [p for p in tried if p["status"] == Status.OK.value]
    return tried, max(ok, key=lambda p: p["samples_per_s"], default=None)


def hf_defaults(points: dict[int, dict]) -> tuple[list[dict], dict | None]:
    first = points[min(points)]
    return [first], first if first["status"] == Status.OK.value else None


PEERS: dict[str, Callable[[dict[int, dict]], tuple[list[dict], dict | None]]] = {
    "Lightning BatchSizeFinder": lightning,
    "HF auto_find_batch_size": hf_auto_find_batch_size,
    "DeepSpeed autotuning (fast)": deepspeed_fast,
    "HF defaults": hf_defaults,
}


def peer(name: str, policy: str) -> dict[str, Any]:
    land = landscape(name)
    tried, chosen = PEERS[policy](batches_at_defaults(land))
    optimum = land.optimum()
    found = chosen["samples_per_s"] / optimum if chosen and land.feasible(chosen) else 0.0
    trials = [_as_trial(land, p) for p in tried]
    # The pick is handed over when the peer stops: it counts from the end of the last trial.
    *before, last = trials
    handed_over = [
        *(replace(t, samples_per_s=None) for t in before),
        replace(last, samples_per_s=chosen["samples_per_s"] if found else None),
    ]
    return {
        "found": found,
        "trials": len(tried),
        "within_2pct": found >= WITHIN,
        "oom_trials": sum(p["status"] in _oom() for p in tried),
        "wall_s": _wall(trials),
        "chosen_batch": chosen["params"]["batch_size"] if chosen else None,
        "clock": summarise_clock([handed_over], optimum, name),
    }


def _as_trial(land: Landscape, point: dict) -> Trial:
    """A peer's trial of the point: past the search's default trial_timeout it would have been
    cut there too (the peers' points are eager: no compile time)."""
    wall_s = point.get("wall_s")
    if wall_s is not None and wall_s > TRIAL_TIMEOUT_S:
        return Trial(Status.TIMEOUT.value, None, TRIAL_TIMEOUT_S)
    speed = point["samples_per_s"] if land.feasible(point) else None
    return Trial(point["status"], speed, wall_s)


def _oom() -> set[str]:
    return {s.value for s in OUT_OF_MEMORY}


def _wall(trials: list[Trial]) -> float | None:
    walls = [t.wall_s for t in trials]
    return None if any(w is None for w in walls) else sum(walls)


def summarise_clock(trials_by_seed: list[list[Trial]], optimum: float, name: str) -> dict | None:
    """Median (and min) found/optimum at each of CLOCK_MARKS, how many seeds' trials had all
    ended before it, and the median time to within 2%; None without a clock."""
    marks_s = clock_marks_s(name)
    if marks_s is None:
        return None
    scores = [on_clock(trials, optimum, marks_s, WITHIN) for trials in trials_by_seed]
    if None in scores:
        return None
    out: dict[str, Any] = {}
    for i, (mark, mark_s) in enumerate(zip(CLOCK_MARKS, marks_s, strict=True)):
        found = [score.found[i] for score in scores]
        out[f"found@{mark}x"] = {
            "s": mark_s,
            "median": statistics.median(found),
            "min": min(found),
            "ended_before": sum(_wall(t) < mark_s for t in trials_by_seed),
        }
    reached = [score.within_s for score in scores]
    median_s = statistics.median(s if s is not None else float("inf") for s in reached)
    out["to_2pct"] = {
        "median_s": median_s,
        "median_x": median_s / baseline_s(name),
        "reached": sum(s is not None for s in reached),
    }
    return out


def found(trials: list[Trial], optimum: float) -> float:
    """The worth of the search's pick of these trials over the optimum (0.0: none found)."""
    pick = picked(trials)
    return pick.worth / optimum if pick else 0.0


def summarise(
    trials_by_seed: list[list[Trial]],
    optimum: float,
    marks: list[int],
    could_beat: list[int | None] | None = None,
) -> dict:
    """Median (and min) found/optimum at each mark, trials to within 2%, OOM trials, wall;
    and whether the confidence said more trials may pay where the search missed the optimum
    by more than 2% (and where it did not)."""

    def to_within(trials: list[Trial]) -> int | None:
        return next(
            (k for k in range(1, len(trials) + 1) if found(trials[:k], optimum) >= WITHIN), None
        )

    out: dict[str, Any] = {"seeds": len(trials_by_seed)}
    for mark in marks:
        picks = [found(t[:mark], optimum) for t in trials_by_seed]
        out[f"found@{mark}"] = {"median": statistics.median(picks), "min": min(picks)}
        out[f"within_2pct@{mark}"] = sum(f >= WITHIN for f in picks)
        out[f"oom_trials@{mark}"] = statistics.median(
            sum(x.status in _oom() for x in t[:mark]) for t in trials_by_seed
        )
        walls = [_wall(t[:mark]) for t in trials_by_seed]
        out[f"wall_s@{mark}"] = None if None in walls else statistics.median(walls)
    if could_beat is not None:
        at_end = [found(t, optimum) >= WITHIN for t in trials_by_seed]
        out["confidence"] = {
            "missed_said_may_pay": sum(
                not r and bool(c) for r, c in zip(at_end, could_beat, strict=True)
            ),
            "missed": at_end.count(False),
            "reached_said_unlikely": sum(
                r and not c for r, c in zip(at_end, could_beat, strict=True)
            ),
            "reached": at_end.count(True),
        }
    reached = [to_within(t) for t in trials_by_seed]
    out["trials_to_2pct"] = {
        "median": statistics.median(r if r is not None else float("inf") for r in reached),
        "reached": sum(r is not None for r in reached),
    }
    return out


def estimate_errors(name: str) -> dict[str, Any]:
    """The estimate against every ok point's measured peak: as it is before any trial, and
    calibrated on all the other ok points (`estimate.calibrated_gib`, as a search that has
    measured them would)."""
    land = landscape(name)
    with tempfile.TemporaryDirectory() as work:
        plan = plan_for(land, Path(work), n_trials=1, seed=0)
    ok = [p for p in land.points if p["status"] == Status.OK.value]
    raw = {id(p): plan.estimate_gib(p["params"]) for p in ok}
    errors, calibrated = [], []
    for point in ok:
        others = [
            Measured(params=o["params"], estimate_gib=raw[id(o)], peak_gib=o["peak_memory_gib"])
            for o in ok
            if o is not point
        ]
        errors.append(raw[id(point)] / point["peak_memory_gib"] - 1)
        fixed = calibrated_gib(point["params"], raw[id(point)], others)
        calibrated.append(fixed / point["peak_memory_gib"] - 1)
    return {
        "ok_trials": len(ok),
        "raw_median_abs_error": statistics.median(abs(e) for e in errors),
        "raw_median_error": statistics.median(errors),
        "raw_error_range": [min(errors), max(errors)],
        "calibrated_median_abs_error": statistics.median(abs(e) for e in calibrated),
    }


def estimate_table(errors: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| landscape | ok trials | estimate: median abs error (median, range) "
        "| calibrated on the other trials |",
        "|---|---|---|---|",
    ]
    for name, e in errors.items():
        low, high = e["raw_error_range"]
        lines.append(
            f"| `{name}` | {e['ok_trials']} | {e['raw_median_abs_error']:.1%} "
            f"({e['raw_median_error']:+.1%}, {low:+.0%} to {high:+.0%}) "
            f"| {e['calibrated_median_abs_error']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def _run(task: tuple[str, str, int, int]) -> tuple[str, str, int, list[Trial], int | None, float]:
    quiet_optuna()
    warnings.simplefilter("ignore")
    name, policy, seed, trials = task
    started = time.perf_counter()
    ran, could_beat = search(name, policy, seed, trials)
    return name, policy, seed, ran, could_beat, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--landscapes", nargs="+", default=list(SOURCES))
    parser.add_argument("--policies", nargs="+", default=[*SEARCHES, *PEERS])
    parser.add_argument(
        "--out",
        type=Path,
        help="where the tables go: benchmarks/results/ (the committed ones) only from a full "
        "run with the default seeds and trials; any other run writes to a folder of its own, "
        f"{PARTIAL_OUT.relative_to(HERE.parent)}/ unless this names one",
    )
    args = parser.parse_args()
    problems = argument_problems(args, parser.get_default)
    if problems:
        parser.exit(2, "".join(f"replay.py: {p}\n" for p in problems))
    out = output_folder(args, parser.get_default)
    marks = [m for m in (10, 20, 30, 50) if m <= args.trials]
    tasks = []
    for name in args.landscapes:
        for policy in (p for p in args.policies if p in SEARCHES):
            if policy == "grid" and len(landscape(name).points) > GRID_LIMIT:
                continue
            tasks += [(name, policy, seed, args.trials) for seed in range(args.seeds)]
    runs: dict[tuple[str, str], list[tuple[int, list[Trial], int | None]]] = {}
    cpu_s: dict[tuple[str, str], float] = {}
    started = time.perf_counter()
    with multiprocessing.get_context("forkserver").Pool(args.jobs) as pool:
        for done, (name, policy, seed, trials, could_beat, took) in enumerate(
            pool.imap_unordered(_run, tasks), 1
        ):
            runs.setdefault((name, policy), []).append((seed, trials, could_beat))
            cpu_s[name, policy] = cpu_s.get((name, policy), 0.0) + took
            print(f"[{done}/{len(tasks)}] {name} {policy} seed {seed}: {took:.1f} s", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name in args.landscapes:
        land = landscape(name)
        results[name] = {
            "optimum_samples_per_s": land.optimum(),
            "points": len(land.points),
            "oom_points": sum(p["status"] in _oom() for p in land.points),
            "recorded_with": land.description,
            "baseline_wall_s": baseline_s(name),
            "policies": {},
        }
        for policy in args.policies:
            if policy in PEERS:
                results[name]["policies"][policy] = {"peer": True, **peer(name, policy)}
            elif (name, policy) in runs:
                by_seed = sorted(runs[name, policy], key=lambda run: run[0])
                summary = summarise(
                    [t for _, t, _ in by_seed],
                    land.optimum(),
                    marks,
                    [c for _, _, c in by_seed] if policy == AUTO else None,
                )
                summary["clock"] = summarise_clock([t for _, t, _ in by_seed], land.optimum(), name)
                if policy == AUTO:
                    summary["headline"] = headline(name, [t for _, t, _ in by_seed])
                summary["replay_s_per_seed"] = cpu_s[name, policy] / args.seeds
                results[name]["policies"][policy] = summary
    errors = {n: estimate_errors(n) for n in args.landscapes if landscape(n).device == "cpu"}
    wall_s = time.perf_counter() - started
    summary = {
        "seeds": args.seeds,
        "trials": args.trials,
        "landscapes": results,
        "estimate": errors,
        "wall_s": wall_s,
        "jobs": args.jobs,
    }
    (out / "replay.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = (
        tables(results, args.trials)
        + headline_lines(results)
        + confidence_table(results)
        + f"\nReplayed in {wall_s:.0f} s ({args.jobs} processes).\n"
        + "\nThe memory estimate on CPU:\n\n"
        + estimate_table(errors)
    )
    (out / "replay.md").write_text(text)
    print(text)
    print(f"Wrote {out / 'replay.json'} and {out / 'replay.md'}.")


COMMITTED_OUT = HERE / "results"
PARTIAL_OUT = HERE / "replay-partial"
"""A run that selects less than the whole (fewer seeds, one landscape, one policy) writes here
unless --out names a folder: the committed tables are rewritten only from a full run."""


def argument_problems(args: argparse.Namespace, default: Callable[[str], Any]) -> list[str]:
    """Every argument that would select nothing or nonsense, named at once (a run of no seeds
    or no trials would otherwise write empty tables over the recorded ones)."""
    problems = []
    for name, least, why in (
        ("seeds", 1, ""),
        ("trials", 20, " (the tables give what was found by trial 10 and 20)"),
        ("jobs", 1, ""),
    ):
        if getattr(args, name) < least:
            problems.append(f"--{name} {getattr(args, name)}: must be at least {least}{why}")
    for option, given, known in (
        ("landscapes", args.landscapes, list(SOURCES)),
        ("policies", args.policies, [*SEARCHES, *PEERS]),
    ):
        unknown = [g for g in given if g not in known]
        if unknown:
            problems.append(
                f"--{option}: unknown {', '.join(map(repr, unknown))}; known: "
                + ", ".join(map(repr, known))
            )
        if len(set(given)) != len(given):
            problems.append(f"--{option}: named more than once: {', '.join(given)}")
    if args.out and not full_run(args, default) and _same(args.out, COMMITTED_OUT):
        problems.append(
            f"--out {args.out}: the committed tables are written only by a full run (every "
            "landscape and policy, the default --seeds and --trials)"
        )
    return problems


def full_run(args: argparse.Namespace, default: Callable[[str], Any]) -> bool:
    """Every landscape and policy with the default seeds and trials: the run whose tables are
    the committed ones (--jobs changes only how long it takes)."""
    return all(getattr(args, name) == default(name) for name in ("seeds", "trials")) and all(
        set(getattr(args, name)) == set(default(name)) for name in ("landscapes", "policies")
    )


def output_folder(args: argparse.Namespace, default: Callable[[str], Any]) -> Path:
    out = args.out or (COMMITTED_OUT if full_run(args, default) else PARTIAL_OUT)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def tables(results: dict[str, dict[str, Any]], trials: int) -> str:
    """The summary (policy x landscape: found after 20 trials, OOM trials) and one detailed
    table per landscape."""
    names = list(results)
    policies = list(dict.fromkeys(p for r in results.values() for p in r["policies"]))
    lines = [
        "| policy | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for policy in policies:
        cells = []
        for name in names:
            r = results[name]["policies"].get(policy)
            if r is None:
                cells.append("-")
            elif r.get("peer"):
                cells.append(f"{r['found']:.2f} ({r['trials']} trials, {r['oom_trials']} OOM)")
            else:
                cells.append(f"{r['found@20']['median']:.2f} ({r['oom_trials@20']:g} OOM)")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n\n" + clock_table(results)
    for name, r in results.items():
        base = r["baseline_wall_s"]
        heads = [
            "policy",
            "found @10",
            "found @20 (worst seed)",
            "seeds within 2% @20",
            "trials to 2% (median, seeds reaching)",
            "OOM trials @20",
            "wall @20",
            *(
                f"found @{m} base" + ("" if base is None else f" ({m * base:.0f} s)")
                for m in CLOCK_MARKS
            ),
            "time to 2% (median, seeds reaching)",
        ]
        cost = "no recorded trial costs" if base is None else f"baseline trial {base:.1f} s"
        text += (
            f"\n`{name}`: {r['points']} points ({r['oom_points']} out of memory), optimum "
            f"{r['optimum_samples_per_s']:.1f} samples/s, {cost}\n\n"
            f"| {' | '.join(heads)} |\n|{'---|' * len(heads)}\n"
        )
        for policy, p in r["policies"].items():
            clock = " | ".join(_clock_cells(p.get("clock"), seeds=p.get("seeds", 1)))
            if p.get("peer"):
                wall = "-" if p["wall_s"] is None else f"{p['wall_s'] / 60:.1f} min"
                text += (
                    f"| {policy} | | {p['found']:.2f} (batch {p['chosen_batch']}) | "
                    f"{'yes' if p['within_2pct'] else 'no'} | {p['trials']} trials run | "
                    f"{p['oom_trials']} | {wall} | {clock} |\n"
                )
                continue
            reach = p["trials_to_2pct"]
            median = "never" if reach["median"] == float("inf") else f"{reach['median']:g}"
            wall = p.get("wall_s@20")
            text += (
                f"| {policy} | {_cell(p, 10)} | {p['found@20']['median']:.2f} "
                f"({p['found@20']['min']:.2f}) | "
                f"{p['within_2pct@20']}/{p['seeds']} | {median} ({reach['reached']}/{p['seeds']}) "
                f"| {p['oom_trials@20']:g} | {'-' if wall is None else f'{wall / 60:.1f} min'} "
                f"| {clock} |\n"
            )
    return text


HEADLINE_S = (180.0, 600.0)
"""The first 3 and 10 minutes of a search on a GPU twin: what it had found by then."""


def headline(name: str, trials_by_seed: list[list[Trial]]) -> dict[str, Any] | None:
    """On a GPU twin: the best found over the optimum within 3 minutes and over the HF
    defaults' samples/s within 10 (median and worst seed); None without a clock."""
    land = landscape(name)
    (base,), _ = hf_defaults(batches_at_defaults(land))
    if base.get("wall_s") is None or not base.get("samples_per_s"):
        return None
    scores = [on_clock(t, land.optimum(), HEADLINE_S, WITHIN) for t in trials_by_seed]
    of_optimum = [s.found[0] for s in scores]
    x_baseline = [s.found[1] * land.optimum() / base["samples_per_s"] for s in scores]
    return {
        "of_optimum@180s": {"median": statistics.median(of_optimum), "min": min(of_optimum)},
        "x_baseline@600s": {"median": statistics.median(x_baseline), "min": min(x_baseline)},
    }


def headline_lines(results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, result in results.items():
        said = result["policies"].get(AUTO, {}).get("headline")
        if said is None or landscape(name).device != "cuda":
            continue
        optimum, baseline = said["of_optimum@180s"], said["x_baseline@600s"]
        lines.append(
            f"- `{name}`, sampler=auto: {optimum['median']:.2f} of the optimum "
            f"within 3 minutes (worst seed {optimum['min']:.2f}); "
            f"{baseline['median']:.1f}x the HF defaults within 10 minutes (worst seed "
            f"{baseline['min']:.1f}x)"
        )
    if not lines:
        return ""
    return (
        "\nThe first minutes on the GPU twins (simulated search time):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def clock_table(results: dict[str, dict[str, Any]]) -> str:
    """Policy x landscape: the median found/optimum within 5 and 10 baseline-times."""
    names = list(results)
    policies = list(dict.fromkeys(p for r in results.values() for p in r["policies"]))
    heads = [
        f"`{n}`" + ("" if (base := results[n]["baseline_wall_s"]) is None else f" ({base:.1f} s)")
        for n in names
    ]
    lines = [
        "Found within 5 / 10 baseline-times of simulated search time (median over seeds, and "
        "the worst seed's within 10 in brackets; a baseline-time is the HF-defaults trial's "
        "recorded wall time, in brackets in the header):",
        "",
        "| policy | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(names),
    ]
    for policy in policies:
        cells = []
        for name in names:
            clock = results[name]["policies"].get(policy, {}).get("clock")
            found = None if clock is None else [clock[f"found@{m}x"]["median"] for m in (5, 10)]
            worst = None if clock is None else clock["found@10x"]["min"]
            cells.append("-" if found is None else f"{found[0]:.2f} / {found[1]:.2f} ({worst:.2f})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _clock_cells(clock: dict | None, seeds: int) -> list[str]:
    """Found at each mark, the time to 2% (and how many seeds got there)."""
    if clock is None:
        return ["-"] * (len(CLOCK_MARKS) + 1)
    cells = [f"{clock[f'found@{mark}x']['median']:.2f}" for mark in CLOCK_MARKS]
    reach = clock["to_2pct"]
    median = (
        "never"
        if reach["median_s"] == float("inf")
        else f"{reach['median_s']:.0f} s = {reach['median_x']:.1f} base"
    )
    return [*cells, median + (f" ({reach['reached']}/{seeds})" if seeds > 1 else "")]


def confidence_table(results: dict[str, dict[str, Any]]) -> str:
    """Whether `sampler=auto`'s confidence at the end told the seeds that missed the optimum by
    more than 2% that more trials may pay, and the others that they are unlikely to."""
    lines = [
        "",
        f"The confidence at the end of `{AUTO}`'s searches:",
        "",
        "| landscape | missed by >2%: said more trials may pay | within 2%: said unlikely to pay |",
        "|---|---|---|",
    ]
    for name, r in results.items():
        said = r["policies"].get(AUTO, {}).get("confidence")
        if said is not None:
            lines.append(
                f"| `{name}` | {said['missed_said_may_pay']} of {said['missed']} "
                f"| {said['reached_said_unlikely']} of {said['reached']} |"
            )
    return "\n".join(lines) + "\n"


def _cell(summary: dict, mark: int) -> str:
    found = summary.get(f"found@{mark}")
    return "-" if found is None else f"{found['median']:.2f}"


if __name__ == "__main__":
    main()
