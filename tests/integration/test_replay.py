"""The recorded landscapes and their replay through the real search loop: the data is whole,
the loop's samplers learn from the baseline on, the skip by estimate keeps every optimum, the
peers' strategies do what they are documented to do, and the README's table is the one the
benchmark wrote."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.common.trial import Status
from autotune.plan.estimate import Measured, calibrated_gib
from autotune.replay import Landscape, replay

ROOT = Path(__file__).parents[2]
LANDSCAPES = sorted((ROOT / "benchmarks" / "landscapes").glob("*.json"))
RECORDED = [Landscape.load(path) for path in LANDSCAPES]


def benchmark_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("replay_benchmark", ROOT / "benchmarks/replay.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_three_landscapes_are_recorded_with_a_memory_edge_each_point_once():
    assert len(RECORDED) >= 3
    assert len({land.model for land in RECORDED}) >= 2, "two models of different size"
    space = yaml.safe_load((ROOT / "benchmarks/landscapes/space.yaml").read_text())["knobs"]
    varied = {k: v["choices"] for k, v in space.items() if isinstance(v, dict)}
    for land in RECORDED:
        data = json.loads((ROOT / "benchmarks/landscapes" / f"{land.name}.json").read_text())
        assert data["command"].startswith("python benchmarks/landscapes/record.py")
        statuses = {p["status"] for p in land.points}
        assert statuses <= {"ok", "oom"}, statuses
        assert "oom" in statuses and "ok" in statuses, f"{land.name}: no memory edge"
        grid = {json.dumps({k: p["params"][k] for k in varied}, sort_keys=True)
                for p in land.points}  # fmt: skip
        assert len(grid) == math.prod(len(v) for v in varied.values()), land.name
        for point in land.points:
            if point["status"] == "ok":  # a few MiB past the budget, between two looks
                assert point["peak_memory_gib"] <= land.memory_budget_gib * 1.02
                assert point["samples_per_s"] > 0 and point["wall_s"] > 0
        assert sum(land.feasible(p) for p in land.points) > len(land.points) / 2


@pytest.mark.parametrize("land", RECORDED, ids=lambda land: land.name)
def test_the_estimate_against_the_measured_cpu_peaks(land):
    """Today's estimate (not the one recorded with the landscape) against every ok trial's
    peak: before any calibration, and calibrated on the other trials as a search does."""
    errors = benchmark_module().estimate_errors(land.name)
    assert errors["ok_trials"] == sum(p["status"] == "ok" for p in land.points)
    assert errors["calibrated_median_abs_error"] <= 0.15, errors
    assert errors["raw_median_abs_error"] <= 0.15, errors


@pytest.mark.parametrize("land", RECORDED, ids=lambda land: land.name)
def test_the_skip_by_estimate_keeps_the_optimum(land):
    """Today's estimate, raw and calibrated on every other ok point (as a search that has seen
    them all), keeps the optimum under the limit; the trim keeps its batch; a replay never
    skips it."""
    replayed = replay(land, n_trials=20, seed=0)
    plan = replayed.plan
    ok = [p for p in land.points if p["status"] == "ok"]
    best = max((p for p in ok if land.feasible(p)), key=lambda p: p["samples_per_s"])
    others = [Measured(params=p["params"], estimate_gib=plan.estimate_gib(p["params"]),
                       peak_gib=p["peak_memory_gib"]) for p in ok if p is not best]  # fmt: skip
    raw = plan.estimate_gib(best["params"])
    assert raw <= plan.estimate_limit_gib
    assert calibrated_gib(best["params"], raw, others) <= plan.estimate_limit_gib
    assert plan.space.knobs["batch_size"].choices[-1] >= best["params"]["batch_size"]
    skipped = [r.params for r in replayed.records if r.status is Status.SKIPPED]
    assert best["params"] not in skipped


def test_a_replay_runs_the_loop_on_the_recorded_answers_and_skips_use_up_no_trial():
    land = RECORDED[0]
    replayed = replay(land, n_trials=15, seed=1)
    assert replayed.records[0].baseline
    ran = [r for r in replayed.records if r.status is not Status.SKIPPED]
    assert len(ran) == 15 < len(replayed.records), "skipped proposals ran nothing: not counted"
    assert [land.answer(r.params) for r in ran] == replayed.answered
    for record in ran:
        point = land.answer(record.params)
        assert record.status.value == point["status"]
        assert record.result.samples_per_s == point.get("samples_per_s")
    assert replay(land, n_trials=15, seed=1).answered == replayed.answered, "seeded: repeatable"


def test_relative_samplers_learn_from_the_baseline_on_and_differ_from_random():
    land = RECORDED[0]
    proposals = {}
    for sampler in ("random", "gp", "nsga2", "tpe"):
        replayed = replay(land, n_trials=14, seed=3, sampler=sampler)
        proposals[sampler] = [r.params for r in replayed.records]
        study = replayed.study
        space = optuna.search_space.IntersectionSearchSpace().calculate(study)
        assert {"precision", "batch_size", "optim"} <= set(space), (sampler, space)
        if sampler != "random":
            trial = study.trials[-1]
            relative = study.sampler.infer_relative_search_space(study, trial)
            assert relative, f"{sampler} falls back to independent sampling"
    assert proposals["gp"] != proposals["random"]
    assert proposals["nsga2"] != proposals["random"]


def test_the_peers_strategies_do_what_they_are_documented_to_do():
    bench = benchmark_module()
    points = {b: {"status": "ok", "samples_per_s": s, "params": {"batch_size": b}}
              for b, s in ((8, 10.0), (16, 14.0), (32, 12.0))}  # fmt: skip
    points[64] = {"status": "oom", "params": {"batch_size": 64}}
    tried, chosen = bench.lightning(points)
    assert [p["params"]["batch_size"] for p in tried] == [8, 16, 32, 64]
    assert chosen["params"]["batch_size"] == 32, "the largest batch that fits"
    tried, chosen = bench.hf_auto_find_batch_size(points)
    assert [p["params"]["batch_size"] for p in tried] == [64, 32]
    assert chosen["params"]["batch_size"] == 32
    tried, chosen = bench.deepspeed_fast(points)
    assert len(tried) == 4 and chosen["params"]["batch_size"] == 16, "the fastest measured"
    tried, chosen = bench.hf_defaults(points)
    assert tried == [points[8]] == [chosen]
    at_defaults = bench.batches_at_defaults(RECORDED[0])
    assert list(at_defaults) == sorted(at_defaults) and len(at_defaults) >= 4
    for batch, point in at_defaults.items():
        assert point["params"]["batch_size"] == batch
        assert (
            point["params"]["precision"] == "fp32" and not point["params"]["gradient_checkpointing"]
        )


def test_the_readme_shows_the_table_the_benchmark_wrote():
    written = (ROOT / "benchmarks/results/replay.md").read_text()
    readme = (ROOT / "README.md").read_text()
    summary = written.split("\n\n")[0]
    estimate = written.split("The memory estimate on CPU:\n\n")[1]
    assert summary.strip() in readme
    assert estimate.strip() in readme
    results = json.loads((ROOT / "benchmarks/results/replay.json").read_text())
    assert set(results["landscapes"]) >= {land.name for land in RECORDED}
