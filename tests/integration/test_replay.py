"""The recorded landscapes and their replay through the real search loop: the data is whole,
the loop's samplers learn from the baseline on, the skip by estimate keeps every optimum, the
peers' strategies do what they are documented to do, and the tables docs/ shows are the ones
the benchmark wrote."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.common.trial import Status
from autotune.plan.estimate import Measured, calibrated_gib
from autotune.replay import Landscape, replay
from autotune.store.records import NOT_RUN_ATTR
from autotune.study.checks import settings_key
from tests import benchmark_scripts
from tests.docs_text import page

ROOT = Path(__file__).parents[2]
LANDSCAPES = sorted((ROOT / "benchmarks" / "landscapes").glob("*.json"))
RECORDED = [Landscape.load(path) for path in LANDSCAPES]


def benchmark_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # replay.py imports its neighbours
    return benchmark_scripts.load("replay.py", "replay_benchmark")


def knobs_varied(name):
    """The knobs a space file varies, with their values."""
    space = yaml.safe_load((ROOT / "benchmarks/landscapes" / name).read_text())["knobs"]
    return {k: v["choices"] for k, v in space.items() if isinstance(v, dict)}


def space_of(land):
    """needle-*.json were recorded on needle-*.yaml (no binding budget), the others on
    space.yaml (a budget that puts the largest batches out of memory)."""
    data = json.loads((ROOT / "benchmarks/landscapes" / f"{land.name}.json").read_text())
    assert data["command"].startswith("python benchmarks/landscapes/record.py")
    if not land.name.startswith("needle-"):
        assert "space=" not in data["command"]
        return "space.yaml"
    space = data["command"].split("space=benchmarks/landscapes/")[1].split()[0]
    assert knobs_varied(space) == {
        k: v["choices"] for k, v in land.knobs.items() if isinstance(v, dict)
    }
    return space


def distinct(land, varied):
    return {
        json.dumps({k: p["params"].get(k) for k in varied}, sort_keys=True) for p in land.points
    }


def test_three_landscapes_are_recorded_with_a_memory_edge_each_point_once():
    edged = [land for land in RECORDED if space_of(land) == "space.yaml"]
    assert len(edged) >= 3
    assert len({land.model for land in edged}) >= 2, "two models of different size"
    varied = knobs_varied("space.yaml")
    for land in edged:
        statuses = {p["status"] for p in land.points}
        assert statuses <= {"ok", "oom"}, statuses
        assert "oom" in statuses and "ok" in statuses, f"{land.name}: no memory edge"
        assert len(distinct(land, varied)) == math.prod(len(v) for v in varied.values())
        for point in land.points:
            if point["status"] == "ok":  # a few MiB past the budget, between two looks
                assert point["peak_memory_gib"] <= land.memory_budget_gib * 1.02
                assert point["samples_per_s"] > 0 and point["wall_s"] > 0
        assert sum(land.feasible(p) for p in land.points) > len(land.points) / 2


def test_two_landscapes_without_a_memory_edge_where_the_optimum_is_a_needle():
    """Every point measured and within a budget that does not bind; six knobs or more, with
    grad_accum and at least three optimizers; 150-300 settings; two models; few settings
    (at most 1 in 20) within 2% of the optimum."""
    needles = [land for land in RECORDED if space_of(land) != "space.yaml"]
    assert len(needles) >= 2
    assert len({land.model for land in needles}) >= 2
    for land in needles:
        varied = knobs_varied(space_of(land))
        assert len(varied) >= 6 and "grad_accum" in varied and len(varied["optim"]) >= 3
        assert 150 <= len(distinct(land, varied)) <= 300, land.name
        assert len(land.points) == len(distinct(land, varied)) + 1, "each once, and the baseline"
        assert all(land.feasible(p) for p in land.points), "no binding budget"
        peak = max(p["peak_memory_gib"] for p in land.points)
        assert peak < land.memory_budget_gib / 4
        speeds = sorted((p["samples_per_s"] for p in land.points), reverse=True)
        near = sum(s >= 0.98 * speeds[0] for s in speeds)
        assert near <= len(speeds) / 20, f"{near} settings within 2% of the optimum: no needle"


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
    others = [
        Measured(
            params=p["params"],
            estimate_gib=plan.estimate_gib(p["params"]),
            peak_gib=p["peak_memory_gib"],
        )
        for p in ok
        if p is not best
    ]
    raw = plan.estimate_gib(best["params"])
    assert raw <= plan.estimate_limit_gib
    assert calibrated_gib(best["params"], raw, others) <= plan.estimate_limit_gib
    assert plan.space.knobs["batch_size"].choices[-1] >= best["params"]["batch_size"]
    skipped = [r.params for r in replayed.records if r.status is Status.SKIPPED]
    assert best["params"] not in skipped


@pytest.mark.parametrize("land", RECORDED, ids=lambda land: land.name)
def test_auto_comes_within_2pct_of_the_optimum_in_20_trials_on_every_landscape(land):
    """The acceptance of `sampler=auto`, replayed: over seeds 0-9, the median search's best
    feasible trial after 20 trials is at least 0.98 of the optimum, the worst at least 0.90."""
    optimum = land.optimum()
    found = []
    for seed in range(10):
        ran = replay(land, n_trials=20, seed=seed).answered
        assert len(ran) == 20
        found.append(max(p["samples_per_s"] for p in ran if land.feasible(p)) / optimum)
    assert statistics.median(found) >= 0.98 and min(found) >= 0.90, [round(f, 3) for f in found]


def test_a_replay_runs_the_loop_on_the_recorded_answers_and_skips_use_up_no_trial():
    land = RECORDED[0]
    # TPE proposes settings the loop skips (`auto` passes over them: every proposal runs).
    replayed = replay(land, n_trials=15, seed=1, sampler="tpe")
    assert replayed.records[0].baseline
    ran = [r for r in replayed.records if r.status is not Status.SKIPPED]
    assert len(ran) == 15 < len(replayed.records), "skipped proposals ran nothing: not counted"
    assert [land.answer(r.params) for r in ran] == replayed.answered
    for record in ran:
        point = land.answer(record.params)
        assert record.result.samples_per_s == point.get("samples_per_s")
        if record.status is Status.STOPPED:  # under half the best: its last timed steps cut
            assert point["status"] == "ok" and 0 < record.result.wall_s < point["wall_s"]
            continue
        assert record.status.value == point["status"]
        assert record.result.wall_s == point["wall_s"]  # the trial's recorded cost, replayed
    assert Status.STOPPED in {r.status for r in ran}, "TPE's losers stop early"
    # The trials run the steps the landscape was recorded with: its wall times hold.
    assert (replayed.plan.info.warmup_steps, replayed.plan.info.measure_steps) == (2, 5)
    assert replayed.clock_s == pytest.approx(sum(r.result.wall_s for r in ran))
    again = replay(land, n_trials=15, seed=1, sampler="tpe")
    assert again.answered == replayed.answered, "seeded: repeatable"
    auto = replay(land, n_trials=15, seed=1)
    assert [r.status for r in auto.records].count(Status.SKIPPED) == 0
    assert replay(land, n_trials=15, seed=1).answered == auto.answered, "seeded: repeatable"


def test_a_search_stops_by_itself_once_no_untried_setting_is_worth_its_trial():
    """needle-tiny (192 settings, the baseline one of them, every one fits): with room for 200
    trials, `sampler=auto` stops when the model expects no untried setting to gain 0.1% of
    samples/s a minute of its trial (here after 76, its trials costing seconds: 0.1% a minute
    is a gain of 0.005% a trial), having found the optimum within 2%;
    `min_gain_per_minute=0` runs on through the whole space, the same search up to the
    stop."""
    land = next(land for land in RECORDED if land.name == "needle-tiny-s128")
    replayed = replay(land, n_trials=200, seed=0)
    last = replayed.study.trials[-1]
    assert last.user_attrs[NOT_RUN_ATTR].startswith("the model expects no untried setting")
    assert last.params == {}, "stopped before it was given settings: a later run may try them"
    ran = replayed.answered
    assert 10 <= len(ran) < 0.7 * len(land.points)
    best = max(p["samples_per_s"] for p in ran if land.feasible(p))
    assert best >= 0.98 * land.optimum()
    on = replay(land, n_trials=200, seed=0, min_gain_per_minute=0)
    # Every setting once: the baseline trains as one of the space's, which is not run again.
    assert len(on.answered) == len({settings_key(p["params"]) for p in land.points}) == 192
    assert on.answered[: len(ran)] == ran, "the same search up to the stop"


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
    points = {
        b: {"status": "ok", "samples_per_s": s, "params": {"batch_size": b}}
        for b, s in ((8, 10.0), (16, 14.0), (32, 12.0))
    }
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


def test_the_docs_show_the_tables_the_benchmark_wrote():
    written = (ROOT / "benchmarks/results/replay.md").read_text()
    summary = written.split("\n\n")[0]
    estimate = written.split("The memory estimate on CPU:\n\n")[1]
    assert summary.strip() in page("search.md")
    assert estimate.strip() in page("estimate.md")
    results = json.loads((ROOT / "benchmarks/results/replay.json").read_text())
    assert set(results["landscapes"]) >= {land.name for land in RECORDED}


def test_a_landscape_recorded_twice_is_compared_with_itself_pass_by_pass():
    """benchmarks/retest.py on the Xeon's needle-mini (recorded in two passes): each pass's best
    as the file holds it, and auto and random replayed on the mean and on each pass; a landscape
    recorded in one pass is refused."""
    path = ROOT / "benchmarks/results/2026-11-27-xeon/needle/needle-mini-s32.json"
    points = [p for p in json.loads(path.read_text())["points"] if p["status"] == "ok"]
    script = str(ROOT / "benchmarks/retest.py")
    out = subprocess.run(
        [sys.executable, script, str(path), "--seeds", "1"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    first, second = ([p["passes"][i]["samples_per_s"] for p in points] for i in (0, 1))
    best = max(range(len(points)), key=first.__getitem__)
    assert f"pass 1's best ({first[best]:.0f} samples/s) measured {second[best]:.0f}" in out.stdout
    rows = [row for row in out.stdout.splitlines() if row.startswith("| ") and " s | " in row]
    assert [row.split(" | ")[:2] for row in rows] == [
        [f"| {kind}", policy]
        for kind in ("mean", "pass 1", "pass 2")
        for policy in ("autotune (sampler=auto)", "random")
    ]
    once = subprocess.run(
        [sys.executable, script, str(LANDSCAPES[0])], capture_output=True, text=True
    )
    assert once.returncode == 1 and "recorded in one pass" in once.stderr


def test_a_search_on_a_multi_gpu_hosts_twin_chooses_among_the_strategies_by_their_cost():
    """Qwen2.5-7B at seq 2048 on the twin of an 8x H100 host (NVLink 4, NVSwitch): every trial
    on the 8 GPUs, the strategy searched among every one the plan can run there (tp with its
    splits 2, 4, 8; DataParallel; DDP, which cannot hold a 7B model's states, skipped by the
    estimate), and the pick, by measured cost, one of the sharding strategies."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from landscapes import twin

    land = twin.landscape("twin-8xh100-qwen2.5-7b-s2048")
    assert land.devices == 8
    strategies = {p["params"]["strategy"] for p in land.points}
    assert {"ddp", "dp", "fsdp", "zero2", "zero3", "tp", "fsdp_offload"} <= strategies
    assert {p["params"].get("tp_size") for p in land.points if p["params"]["strategy"] == "tp"} == {
        2,
        4,
        8,
    }
    assert not any(land.feasible(p) for p in land.points if p["params"]["strategy"] == "ddp")
    replayed = replay(land, n_trials=20, seed=0)
    assert replayed.plan.info.devices_per_trial == 8
    ran = [r for r in replayed.records if r.status is not Status.SKIPPED]
    tried = {r.params["strategy"] for r in ran}
    assert len(tried) >= 3, tried
    measured = zip(ran, replayed.answered, strict=True)
    record, point = max(
        ((r, p) for r, p in measured if land.feasible(p)), key=lambda rp: rp[1]["samples_per_s"]
    )
    assert record.params["strategy"] in {"fsdp", "zero1", "zero2", "zero3", "tp"}
    assert point["true_samples_per_s"] >= 0.9 * land.optimum()


def _committed_tables():
    return {
        name: (ROOT / "benchmarks/results" / name).read_bytes()
        for name in ("replay.json", "replay.md")
    }


@pytest.mark.parametrize(
    "arguments, named",
    [
        (["--policies", "bogus"], "--policies: unknown 'bogus'"),
        (["--seeds", "0"], "--seeds 0: must be at least 1"),
        (["--trials", "0"], "--trials 0: must be at least 20"),
        (["--trials", "-3"], "--trials -3: must be at least 20"),
        (["--jobs", "0"], "--jobs 0: must be at least 1"),
        (["--landscapes", "nope"], "--landscapes: unknown 'nope'"),
        (["--seeds", "2", "--out", "benchmarks/results"], "written only by a full run"),
    ],
)
def test_the_replay_refuses_a_run_that_selects_nothing_and_leaves_the_committed_tables(
    arguments, named
):
    before = _committed_tables()
    ran = subprocess.run(
        [sys.executable, "benchmarks/replay.py", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2, ran.stderr
    assert named in ran.stderr and "Traceback" not in ran.stderr
    assert _committed_tables() == before


def test_a_partial_replay_writes_its_tables_to_a_folder_of_its_own(tmp_path):
    before = _committed_tables()
    ran = subprocess.run(
        [
            sys.executable,
            "benchmarks/replay.py",
            *("--landscapes", "bert-tiny-s128", "--policies", "random", "--seeds", "1"),
            *("--jobs", "1", "--out", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr
    written = json.loads((tmp_path / "replay.json").read_text())
    assert list(written["landscapes"]) == ["bert-tiny-s128"]
    assert list(written["landscapes"]["bert-tiny-s128"]["policies"]) == ["random"]
    assert "`bert-tiny-s128`" in (tmp_path / "replay.md").read_text()
    assert _committed_tables() == before
