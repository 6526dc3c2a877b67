"""Record a landscape: every point of `space.yaml` measured on this machine, by a real search
(`sampler=grid`, real worker processes, the memory budget's watchdog), written as JSON.

    python benchmarks/landscapes/record.py NAME model=MODEL seq_len=N memory_budget=SIZE \
        [space=FILE] [passes=N]

`space=` defaults to `space.yaml` beside this file (the landscapes whose budget binds);
`needle-*.yaml` are the spaces of the landscapes recorded with a budget that does not.

Every grid point runs: the pre-trial rule that skips settings at least as memory-hungry as a
known out-of-memory trial is turned off here (a landscape holds measurements, not inferences),
and so is the skip by estimate. Trials past the budget are killed by the watchdog and recorded
as `oom`, as in a search. `benchmarks/replay.py` answers trials from the written file.

`passes=N` (default 1) measures the whole grid N times, one search after another, and keeps
each point's mean (`merge`): five timed steps leave a point's samples/s a few percent off, and
the slowest of a landscape's points, or its best, is then partly chance. Each point keeps what
every pass measured (`passes`), and the run prints how far two passes of one point differ.

    python benchmarks/landscapes/record.py combine OUT.json FIRST.json LATER.json [...]

writes, from landscapes each recorded in one pass over the same space (the same model,
sequence length, budget and machine kind), the landscape of their passes (`combine`): a
landscape recorded once can be measured again later and compared with itself
(`benchmarks/retest.py`).
"""

from __future__ import annotations

import json
import platform
import shlex
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
import transformers

import autotune
from autotune.replay import FIGURES
from autotune.store.records import TrialRecord
from autotune.study import checks

HERE = Path(__file__).parent
SETTINGS = {
    "sampler": "grid",
    "n_trials": 1000,  # the grid ends the search
    "warmup_steps": 2,
    "measure_steps": 5,
    "estimate_margin": None,
    "confirm_rounds": 0,  # a point is measured once a pass
    "early_stop": False,  # every point's timed steps, however slow
}


SAME = ("model", "task", "seq_len", "device", "memory_budget_gib", "machine", "space")
"""What landscapes must share for their passes to combine."""


def main() -> None:
    if sys.argv[1:2] == ["combine"]:
        out, *paths = sys.argv[2:]
        try:
            combined = combine([json.loads(Path(p).read_text()) for p in paths])
        except ValueError as refused:
            sys.exit(f"not combined: {refused}")
        Path(out).write_text(json.dumps(combined, indent=1) + "\n")
        print(f"wrote {out}: {len(combined['points'])} trials, {len(paths)} passes")
        return
    name, *pairs = sys.argv[1:]
    given = dict(p.split("=", 1) for p in pairs)
    passes = int(given.pop("passes", "1"))
    settings = {"space": str(HERE / "space.yaml"), **given, **SETTINGS}
    checks.PRE_TRIAL_CHECKS = (checks.already_measured,)  # every grid point is measured
    runs = []
    for n in range(passes):
        print(f"pass {n + 1} of {passes}", flush=True)
        with tempfile.TemporaryDirectory() as out:
            result = autotune.search(out=out, **settings)
        runs.append([point_of(trial) for trial in result.snapshot.records])
    points = merge(runs) if passes > 1 else runs[0]
    info = result.info
    landscape = {
        "name": name,
        "command": shlex.join(["python", "benchmarks/landscapes/record.py", *sys.argv[1:]]),
        "recorded": date.today().isoformat(),
        "machine": info.device_name or platform.machine(),
        "cpu_threads": result.snapshot.records[0].result.cpu_threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "autotune": autotune.__version__,
        "model": info.model,
        "task": info.task,
        "seq_len": info.seq_len,
        "device": info.device,
        "memory_budget_gib": info.memory_budget_gib,
        "settings": {**SETTINGS, "passes": passes},
        "space": json.loads(json.dumps(_knobs(Path(settings["space"])))),
        "points": points,
    }
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(landscape, indent=1) + "\n")
    print(f"wrote {path}: {len(points)} trials")


def combine(landscapes: list[dict]) -> dict:
    """The landscape of the passes of single-pass landscapes over the same space (`merge`),
    with each recording's command and date; ValueError where one differs in `SAME` or was
    itself recorded in several passes."""
    first = landscapes[0]
    problems = [
        f"{land['name']}: {key} {land.get(key)!r}, not {first.get(key)!r}"
        for land in landscapes[1:]
        for key in SAME
        if land.get(key) != first.get(key)
    ]
    problems += [
        f"{land['name']}: recorded in {land['settings']['passes']} passes"
        for land in landscapes
        if land["settings"].get("passes", 1) != 1
    ]
    if len(landscapes) < 2 or problems:
        raise ValueError("; ".join(problems) or "two landscapes or more combine")
    return {
        **first,
        "command": [land["command"] for land in landscapes],
        "recorded": ", ".join(land["recorded"] for land in landscapes),
        "settings": {**first["settings"], "passes": len(landscapes)},
        "points": merge([land["points"] for land in landscapes]),
    }


def point_of(trial: TrialRecord) -> dict:
    return {
        "number": trial.number,
        "params": trial.params,
        "status": trial.result.status.value,
        **{figure: getattr(trial.result, figure) for figure in FIGURES},
        "reason": trial.result.reason,
    }


MEANS = ("samples_per_s", "tokens_per_s", "step_time_cv", "step_time_median_ms", "wall_s")
"""The figures a point measured more than once keeps the mean of; of its memory, the peak."""


def merge(runs: list[list[dict]]) -> list[dict]:
    """One point per setting, from passes over the same grid: ok if every pass was (the mean of
    each of `MEANS`, the highest peak memory), else the first pass that was not, as it was."""
    by_key = [{checks.settings_key(p["params"]): p for p in run} for run in runs]
    points, gaps = [], []
    for first in runs[0]:
        measured = [run[checks.settings_key(first["params"])] for run in by_key]
        failed = [p for p in measured if p["status"] != "ok"]
        if failed:
            points.append({**failed[0], "passes": [_figures(p) for p in measured]})
            continue
        point = {**first, **{f: statistics.fmean(p[f] for p in measured) for f in MEANS}}
        point["peak_memory_gib"] = max(p["peak_memory_gib"] for p in measured)
        point["passes"] = [_figures(p) for p in measured]
        points.append(point)
        speeds = [p["samples_per_s"] for p in measured]
        gaps.append((max(speeds) - min(speeds)) / point["samples_per_s"])
    if gaps:
        gaps.sort()
        print(
            f"passes of one point differ by {statistics.median(gaps):.1%} (median), "
            f"{gaps[int(0.9 * (len(gaps) - 1))]:.1%} (9th decile), {gaps[-1]:.1%} (most) of "
            "their mean"
        )
    return points


def _figures(point: dict) -> dict:
    return {"status": point["status"], **{f: point[f] for f in (*MEANS, "peak_memory_gib")}}


def _knobs(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())["knobs"]


if __name__ == "__main__":
    main()
