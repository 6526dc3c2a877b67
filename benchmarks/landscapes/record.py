"""Record a landscape: every point of `space.yaml` measured once on this machine, by a real
search (`sampler=grid`, real worker processes, the memory budget's watchdog), written as JSON.

    python benchmarks/landscapes/record.py NAME model=MODEL seq_len=N memory_budget=SIZE \
        [space=FILE]

`space=` defaults to `space.yaml` beside this file (the landscapes whose budget binds);
`needle-*.yaml` are the spaces of the landscapes recorded with a budget that does not.

Every grid point runs: the pre-trial rule that skips settings at least as memory-hungry as a
known out-of-memory trial is turned off here (a landscape holds measurements, not inferences),
and so is the skip by estimate. Trials past the budget are killed by the watchdog and recorded
as `oom`, as in a search. `benchmarks/replay.py` answers trials from the written file.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
import transformers

import autotune
from autotune.replay import FIGURES
from autotune.study import checks

HERE = Path(__file__).parent
SETTINGS = {
    "sampler": "grid",
    "n_trials": 1000,  # the grid ends the search
    "warmup_steps": 2,
    "measure_steps": 5,
    "estimate_margin": None,
    "confirm_rounds": 0,  # a landscape keeps each point's one measurement
    "early_stop": False,  # every point's timed steps, however slow
}


def main() -> None:
    name, *pairs = sys.argv[1:]
    settings = {
        "space": str(HERE / "space.yaml"),
        **dict(p.split("=", 1) for p in pairs),
        **SETTINGS,
    }
    checks.PRE_TRIAL_CHECKS = (checks.already_measured,)  # every grid point is measured
    with tempfile.TemporaryDirectory() as out:
        result = autotune.search(out=out, **settings)
    points = [
        {
            "number": trial.number,
            "params": trial.params,
            "status": trial.result.status.value,
            **{figure: getattr(trial.result, figure) for figure in FIGURES},
            "reason": trial.result.reason,
        }
        for trial in result.snapshot.records
    ]
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
        "settings": SETTINGS,
        "space": json.loads(json.dumps(_knobs(Path(settings["space"])))),
        "points": points,
    }
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(landscape, indent=1) + "\n")
    print(f"wrote {path}: {len(points)} trials")


def _knobs(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())["knobs"]


if __name__ == "__main__":
    main()
