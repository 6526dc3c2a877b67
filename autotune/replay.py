"""Replaying a landscape: the real search loop, with each trial answered from measurements
made earlier instead of run.

A landscape is every point of a search space with what it measured: a grid recorded on a real
machine (`benchmarks/landscapes/*.json`, written by `benchmarks/landscapes/record.py`), or a
cost model. `replay` plans a search for it as `autotune search` would (space, baseline,
budget, estimate), and runs `search.loop.run_search` unchanged with a simulated executor: sampler,
tell rules, pre-trial checks and the skip by estimate all act as in a real search, so
strategies can be compared on the same landscape in seconds and repeated over seeds.

A landscape whose points are noise-free figures (a cost model's) says how much a measurement
of them varies (`Landscape.remeasure_sigma`): each replay then measures every point afresh, the
draw made from its seed, so that seeds are re-runs of the search on the same machine, and a
search's pick (its fastest measurement) is scored at the point's noise-free figure: what the
user would get, lucky draws and all.

`on_clock` scores a replayed search against its simulated time: what it had found by given
moments of the search, and when it first came near the optimum.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotune.common.device import DeviceInfo, cpu_reserve_bytes
from autotune.common.trial import Status, TrialResult, TrialSpec, feasible, stopped_reason
from autotune.common.units import GIB
from autotune.execute.simulated import SimulatedExecutor
from autotune.plan import software_cache
from autotune.plan.overrides import make_config
from autotune.plan.plan import SearchPlan, make_plan
from autotune.store.records import TrialRecord, load_records
from autotune.study.checks import settings_key
from autotune.study.loop import run_search
from autotune.study.opening import open_study

STEPS = ("warmup_steps", "measure_steps")
"""The settings of a recorded landscape that its replayed trials run with."""
FIGURES = ("samples_per_s", "tokens_per_s", "peak_memory_gib", "step_time_cv",
           "step_time_median_ms", "estimate_gib", "wall_s")  # fmt: skip
"""What a landscape keeps of each measured trial."""


@dataclass(frozen=True, kw_only=True)
class Landscape:
    """A search space with an answer for each of its points."""

    name: str
    model: str
    seq_len: int
    device: str
    """`cpu` or `cuda`: the device the answers are for."""
    device_name: str
    memory_budget_gib: float
    knobs: dict[str, Any]
    """The space's knobs, as in a space file."""
    answer: Callable[[dict[str, Any]], dict[str, Any]]
    """Settings -> {status, reason, samples_per_s, peak_memory_gib, wall_s, ...}."""
    points: list[dict[str, Any]] = field(default_factory=list)
    """Every point with its answer (`params` included) where the landscape lists them."""
    device_facts: dict[str, Any] = field(default_factory=dict)
    """`DeviceInfo` fields of the landscape's device beyond its name (a GPU's compute
    capability, bf16 support, ...)."""
    description: str = ""
    steps: dict[str, int] = field(default_factory=dict)
    """The `warmup_steps` and `measure_steps` the points were recorded with, where recorded:
    a replayed trial runs (and stops within) the same steps, so its recorded `wall_s` holds."""
    devices: int = 1
    """The devices a trial trains on (`devices_per_trial`): a multi-GPU host's landscape
    answers each strategy on all of them."""
    remeasure_sigma: float = 0.0
    """How much one measurement of a point varies (the standard deviation of log samples/s)
    where the points' figures are noise-free: a replay answers a point's samples/s times
    exp(sigma x N(0, 1)), drawn from its seed and the settings. 0 for a recorded landscape,
    whose figures are themselves one measurement each."""

    @classmethod
    def load(cls, path: Path) -> Landscape:
        """A landscape recorded by `benchmarks/landscapes/record.py`."""
        data = json.loads(Path(path).read_text())
        # Each point answers for its own settings as recorded (the baseline and the space's
        # setting that trains alike are two measurements), else for the settings that train
        # as it does (`settings_key`).
        exact = {json.dumps(p["params"], sort_keys=True): p for p in data["points"]}
        alike = {settings_key(p["params"]): p for p in reversed(data["points"])}

        def answer(params: dict[str, Any]) -> dict[str, Any]:
            found = exact.get(json.dumps(params, sort_keys=True)) or alike.get(settings_key(params))
            if found is None:
                raise KeyError(f"landscape {data['name']} has no point {params}")
            return found

        return cls(
            name=data["name"],
            model=data["model"],
            seq_len=data["seq_len"],
            device=data["device"],
            device_name=data["machine"],
            memory_budget_gib=data["memory_budget_gib"],
            knobs=data["space"],
            answer=answer,
            points=data["points"],
            description=data["command"],
            steps={k: v for k, v in data.get("settings", {}).items() if k in STEPS},
        )

    def feasible(self, point: dict[str, Any]) -> bool:
        """Measured and within the budget: a point the search may recommend (a trial can end
        ok a little past the budget, between two looks of the memory watchdog)."""
        return feasible(Status(point["status"]), point["peak_memory_gib"], self.memory_budget_gib)

    def optimum(self) -> float:
        """The best samples/s of a feasible point: what a full grid finds."""
        return max(p["samples_per_s"] for p in self.points if self.feasible(p))


class LandscapeAnswers:
    """Answers each trial from the landscape, its recorded cost (`wall_s`) included: the
    simulated executor's answer (`autotune.execute.simulated`); no process runs. With the
    landscape's `remeasure_sigma`, each point as this seed's measurement of it."""

    def __init__(self, landscape: Landscape, seed: int = 0) -> None:
        self.landscape = landscape
        self.seed = seed
        self.answered: list[dict[str, Any]] = []
        """The points answered, in order, as measured (where measured afresh,
        `true_samples_per_s` is the landscape's own figure): what a real search would have
        run."""

    def measured(self, params: dict[str, Any]) -> dict[str, Any]:
        """The landscape's point for `params`, as this seed measures it."""
        point = self.landscape.answer(params)
        true = point.get("samples_per_s")
        sigma = self.landscape.remeasure_sigma
        if not true or not sigma:
            return point
        # The same draw for the same seed and settings: a replay is repeatable.
        factor = math.exp(sigma * random.Random(f"{self.seed}/{settings_key(params)}").gauss())
        scaled = {k: point[k] * factor for k in ("samples_per_s", "tokens_per_s") if point.get(k)}
        return {**point, **scaled, "true_samples_per_s": true}

    def __call__(self, spec: TrialSpec) -> TrialResult:
        point = self.measured(spec.params)
        self.answered.append(point)
        figures = {k: point.get(k) for k in FIGURES if k != "estimate_gib"}
        below, speed = spec.stop_below_samples_per_s, point.get("samples_per_s")
        step_ms = point.get("step_time_median_ms")
        stops = below and speed and step_ms and figures["wall_s"] is not None and speed < below
        if point["status"] == Status.OK.value and stops:
            # Stopped early: its timed steps after the stop are not run (the landscape keeps
            # one pace a point: every step at it).
            figures["wall_s"] -= (spec.measure_steps - spec.stop_after_steps) * step_ms / 1e3
            return TrialResult(
                status=Status.STOPPED,
                measured_steps=spec.stop_after_steps,
                reason=stopped_reason(spec.stop_after_steps, speed, below),
                **figures,
            )
        return TrialResult(
            status=Status(point["status"]),
            reason=point.get("reason", ""),
            measured_steps=1 if point["status"] == Status.OK.value else 0,
            **figures,
        )


@dataclass(frozen=True)
class Replayed:
    records: list[TrialRecord]
    """The study's trials as the loop recorded them (skips included), in order."""
    answered: list[dict[str, Any]]
    """The landscape points the launcher answered (trials that would have run), in order."""
    study: optuna.Study
    """The in-memory study the loop ran on."""
    plan: SearchPlan
    clock_s: float = 0.0
    """The simulated search time: the answered trials' recorded `wall_s`, one after another."""
    results: list[TrialResult] = field(default_factory=list)
    """What the executor returned for each answered trial, in order: the landscape's point, or
    a timeout where its `wall_s` passed the trial's limit."""


def replay(
    landscape: Landscape,
    *,
    n_trials: int,
    seed: int,
    sampler: str = "auto",
    estimate_margin: float | None = 0.25,
    work_dir: Path | None = None,
    **settings: Any,
) -> Replayed:
    """One search on the landscape, as `autotune search model=... sampler=... n_trials=...`
    would run it on the landscape's machine (other keys in `settings`)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_for(
            landscape,
            Path(work_dir or tmp),
            n_trials=n_trials,
            seed=seed,
            sampler=sampler,
            estimate_margin=estimate_margin,
            **settings,
        )
        # Opened as a search opens its study (settled plan, sampler, baseline queued), in
        # memory: a replay runs hundreds of searches.
        study, plan = open_study(plan, storage=optuna.storages.InMemoryStorage())
        answers = LandscapeAnswers(landscape, seed)
        executor = SimulatedExecutor(answers)
        run_search(plan, study, executor=executor)
        return Replayed(
            records=load_records(study),
            answered=answers.answered,
            study=study,
            plan=plan,
            clock_s=executor.clock_s,
            results=executor.answered,
        )


def plan_for(landscape: Landscape, work_dir: Path, **settings: Any) -> SearchPlan:
    """The plan `autotune search` makes for the landscape's model, space and budget on its
    device; the space file and the study folder go in `work_dir`."""
    space_path = work_dir / "space.yaml"
    space_path.write_text(yaml.safe_dump({"device": landscape.device, "knobs": landscape.knobs}))
    config = make_config(
        {
            "model": landscape.model,
            "seq_len": landscape.seq_len,
            "device": landscape.device,
            "space": str(space_path),
            "memory_budget": int(landscape.memory_budget_gib * GIB),
            "out": str(work_dir / "out"),
            "quiet": True,
            **(
                {"devices_per_trial": landscape.devices, "workers": 1}
                if landscape.devices > 1
                else {}
            ),
            **landscape.steps,
            **settings,
        }
    )
    return make_plan(config, device_info(landscape))


def device_info(landscape: Landscape) -> DeviceInfo:
    """This machine's software facts (optimizers, model types) with the landscape's device."""
    memory = int(landscape.memory_budget_gib * GIB) * 4
    # A host with room for 4x the budget once the search's own share is kept: the landscape was
    # recorded with its budget, and the live machine's RAM has no part in a replay.
    host = memory + cpu_reserve_bytes(memory)
    device = {
        "cuda_available": landscape.device == "cuda",
        "name": landscape.device_name,
        "total_memory_bytes": memory,
        "free_memory_bytes": memory,
        "host_available_memory_bytes": host,
        "host_total_memory_bytes": memory,
    }
    # The landscape's space as it was recorded: a CPU landscape holds the bf16 points it ran,
    # which a search on such a CPU now leaves out (emulated, slow) unless told otherwise.
    recorded = {"bf16_supported": True} if landscape.device == "cpu" else {}
    if landscape.devices > 1:  # a multi-GPU host's GPUs, all of them a trial's
        device["cuda_device_names"] = (landscape.device_name,) * landscape.devices
        device["cuda_free_memory_bytes"] = (memory,) * landscape.devices
    return dataclasses.replace(_here(), **device, **(recorded | landscape.device_facts))


@functools.cache
def _here() -> DeviceInfo:
    return software_cache.probe_device()


# Scoring a replayed search against its clock.


@dataclass(frozen=True)
class Trial:
    """A trial a replayed search ran, as it is scored."""

    status: str
    samples_per_s: float | None
    """As measured; set only where the trial found something: feasible (ok and within the
    budget)."""
    wall_s: float | None
    """Its recorded cost; None where the landscape has none (a cost model without a clock)."""
    true_samples_per_s: float | None = None
    """The point's noise-free figure where the landscape measures it afresh
    (`Landscape.remeasure_sigma`); None: the measurement is the figure."""

    @property
    def worth(self) -> float:
        """What this trial gives the user as the search's pick: its point's figure."""
        if self.samples_per_s is None:
            return 0.0
        return self.samples_per_s if self.true_samples_per_s is None else self.true_samples_per_s


def picked(trials: Sequence[Trial]) -> Trial | None:
    """The trial a search recommends from these: the fastest measured (scored at its `worth`:
    a lucky measurement of a slower point is what the user gets)."""
    found = [t for t in trials if t.samples_per_s is not None]
    return max(found, key=lambda t: t.samples_per_s, default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class OnClock:
    """A search scored against its simulated time."""

    found: tuple[float, ...]
    """At each mark, the worth of the pick of the trials ended by then (`picked`) over the
    optimum; 0.0 where none had found anything."""
    within_s: float | None
    """When the first trial within `within` of the optimum ended; None: none was."""


def on_clock(
    trials: Sequence[Trial], optimum: float, marks_s: Sequence[float], within: float
) -> OnClock | None:
    """A search's trials, run one after another, against its simulated time: a trial counts
    from the moment it ends (the `wall_s` of the trials up to it and its own); one that ends
    after a mark does not count at that mark, and one that finds nothing (out of memory) only
    moves the clock on. None where a trial's cost is unknown."""
    if any(t.wall_s is None for t in trials):
        return None
    series, ended_s = [], 0.0
    for k, trial in enumerate(trials, 1):
        ended_s += trial.wall_s
        pick = picked(trials[:k])
        series.append((ended_s, pick.worth / optimum if pick else 0.0))
    # The pick can change for a worse point (a lucky measurement): the last pick by the mark.
    found = tuple(next((b for e, b in reversed(series) if e <= mark), 0.0) for mark in marks_s)
    within_s = next((e for e, b in series if b >= within), None)
    return OnClock(found=found, within_s=within_s)
