"""The expert's guess (`study/guess.py`): the guides' advice at the largest batch that fits
the budget and that costs at most `GUESS_COST` baseline trials at the baseline's pace."""

import dataclasses
import functools

import numpy as np
import optuna
import pytest

from autotune.common.trial import Status, TrialResult
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import BASELINE_ATTR, PARAMS_ATTR, TrialRecord, tell_result
from autotune.study.sampling.effects import EffectsSampler
from autotune.study.sampling.guess import GUESS_COST, expert_guess
from autotune.study.sampling.neighbourhood import Neighbourhood
from autotune.study.sampling.points import Points
from tests.conftest import TINY_MODEL
from tests.unit.study.test_effects import CPU
from tests.unit.study.test_skip_on_h100 import H100

SPACE = """
device: cpu
knobs:
  precision: {choices: [fp32, bf16]}
  batch_size: {choices: [8, 16, 32, 64, 128]}
  gradient_checkpointing: {choices: [false, true]}
  optim: {choices: [adamw_torch, adamw_torch_fused, adafactor]}
  attn_implementation: {choices: [sdpa, eager]}
"""
STEPS = 3 + 10
"""The default warm-up and timed steps of a trial."""
PACE = 100.0
"""The baseline's samples/s."""


@pytest.fixture
def plan(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    config = load_config(
        [f"model={TINY_MODEL}", f"space={space}", f"out={tmp_path}", "memory_budget=8GiB"]
    )
    return make_plan(config, dataclasses.replace(CPU, bf16_supported=True))


def guess(plan, start_s):
    """The guess after a baseline whose trial took `start_s` besides its steps."""
    wall_s = start_s + STEPS * plan.baseline["batch_size"] / PACE
    result = TrialResult(status=Status.OK, samples_per_s=PACE, wall_s=wall_s, peak_memory_gib=0.1)
    baseline = TrialRecord(number=0, params=dict(plan.baseline), result=result, baseline=True)
    points = Points.of(plan, np.random.default_rng(0))
    index = expert_guess(points, plan, [baseline], lambda index: True)
    return points.params[index], wall_s


def test_the_guess_is_the_cpus_advice(plan):
    params, _ = guess(plan, start_s=20.0)
    assert {k: v for k, v in params.items() if k != "batch_size"} == {
        "precision": "bf16",
        "gradient_checkpointing": False,
        "optim": "adamw_torch_fused",
        "attn_implementation": "eager",
    }


def test_where_the_start_up_dominates_a_trial_the_guess_takes_the_largest_batch(plan):
    """A GPU's trial: 20 s of start-up, 1 s of steps at batch 8; batch 128 costs 37.6 s at
    the baseline's pace, within 3 x 21 s."""
    params, _ = guess(plan, start_s=20.0)
    assert params["batch_size"] == 128


def test_where_the_steps_are_a_trials_cost_the_guess_stays_within_a_few_baseline_trials(plan):
    """A CPU's trial: 1 s of start-up, 1.04 s of steps at batch 8. Batch 32 costs 5.2 s at
    the baseline's pace, within 3 x 2.04 s; batch 64 (9.3 s) is not."""
    params, wall_s = guess(plan, start_s=1.0)
    assert params["batch_size"] == 32
    assert 1.0 + STEPS * 32 / PACE <= GUESS_COST * wall_s < 1.0 + STEPS * 64 / PACE


CUDA_SPACE = """
device: cuda
knobs:
  precision: {choices: [fp32, bf16+tf32]}
  batch_size: {choices: [8, 16, 32, 48, 64, 96, 128]}
  optim: {choices: [adamw_torch, adamw_torch_fused]}
"""


def test_on_a_gpu_the_guess_is_costed_at_its_precisions_peak_not_the_fp32_baselines_pace(
    tmp_path,
):
    """The A100 twin's bert-large baseline: fp32 at 12.3 samples/s, 24.8 s a trial. At that
    pace batch 128 would cost 152 s, past 3 baseline trials (74 s); at the bf16 peak over
    fp32's (the H100's 989 / 67 TFLOP/s here) it costs about 25 s, and the guess keeps the
    largest batch that fits, as without the bound."""
    space = tmp_path / "space.yaml"
    space.write_text(CUDA_SPACE)
    config = load_config(
        ["model=bert-large-uncased", "seq_len=512", f"space={space}", f"out={tmp_path}"]
    )
    plan = make_plan(config, H100)
    points = Points.of(plan, np.random.default_rng(0))

    def guess_after(wall_s):
        result = TrialResult(
            status=Status.OK,
            samples_per_s=12.3,
            wall_s=wall_s,
            peak_memory_gib=10.3,
            estimate_gib=plan.estimate_gib(plan.baseline),
        )
        baseline = TrialRecord(number=0, params=dict(plan.baseline), result=result, baseline=True)
        return points.params[expert_guess(points, plan, [baseline], lambda index: True)]

    unbounded = guess_after(wall_s=None)
    assert unbounded["precision"] == "bf16+tf32"
    assert unbounded["batch_size"] >= 96
    assert guess_after(wall_s=24.8) == unbounded


def h100_search(tmp_path, *settings):
    """The headline search's plan on the H100's facts, its effects sampler, a study filled by
    hand (another sampler: this one would fit its model at every ask), and how to record a
    trial in it."""
    plan = make_plan(
        load_config(["model=bert-large-uncased", "seq_len=512", f"out={tmp_path}", *settings]),
        H100,
    )
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0)
    )

    def record(params, result, *, is_baseline=False):
        trial = study.ask({})
        trial.set_user_attr(PARAMS_ATTR, params)
        if is_baseline:
            trial.set_user_attr(BASELINE_ATTR, True)
        tell_result(study, trial, result, plan.info.memory_budget_gib, noise_cv=0.1)

    return plan, EffectsSampler(plan, seed=0), study, record


def test_on_the_default_cuda_space_the_model_takes_over_from_the_ladder_not_novelty(tmp_path):
    """`autotune search model=bert-large-uncased seq_len=512` on the H100's facts, its default
    space (62,208 settings: loader workers, pinned memory, Liger, compile modes, checkpointing
    every n layers): the baseline, which sets none of those, is the point with each at what
    training then does, so that with the guess two settings are measured and the model
    chooses. Where it was not (a knob inactive in the baseline's setting filled in), the next
    trial after the ladder was the setting with the most unseen values: bs 200 checkpointed,
    fp8, paged 8-bit AdamW, eager attention, compiled (112 s on the twin, stopped)."""
    plan, sampler, study, record = h100_search(tmp_path)
    points = sampler.points
    baseline = points.params[points.find(plan.baseline)]
    assert baseline == {
        **plan.baseline,
        "torch_compile": "off",
        "use_liger_kernel": False,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": True,
    }

    # The twin's H100: the baseline, then the guess at 8x, then its ladder's rung out of memory.
    ok = functools.partial(TrialResult, status=Status.OK, step_time_cv=0.01)
    record(
        dict(plan.baseline),
        ok(samples_per_s=39.5, wall_s=21.9, peak_memory_gib=11.3),
        is_baseline=True,
    )
    guess = points.params[sampler.choose(study.get_trials())]
    assert guess["precision"] == "bf16+tf32" and guess["batch_size"] == 128
    record(guess, ok(samples_per_s=311.0, wall_s=24.6, peak_memory_gib=70.5))
    rung = points.params[sampler.choose(study.get_trials())]
    assert rung == {**guess, "batch_size": rung["batch_size"]} and rung["batch_size"] > 128
    record(rung, TrialResult(status=Status.OOM, wall_s=19.8))

    fourth = points.params[sampler.choose(study.get_trials())]
    differs = {k for k in fourth.keys() | guess.keys() if fourth.get(k) != guess.get(k)}
    assert len(differs) <= 2, (differs, fourth)  # near the fastest, not the most novel
    assert fourth["torch_compile"] == "off" and fourth["precision"] != "fp8", fourth
    assert not fourth["gradient_checkpointing"] and fourth["attn_implementation"] != "eager"
    assert "8bit" not in fourth["optim"], fourth


def test_with_one_setting_measured_the_start_stays_near_it_and_leaves_compile_and_fp8(tmp_path):
    """The HF defaults of a large model out of memory on the card, the guess measured, its
    ladder's rung up out of memory: one setting measured, too few for the model. The next
    trial changes one knob of the guess, not every knob at once (compiled, fp8, checkpointed,
    eager, paged 8-bit: the setting with the most unseen values, and the likeliest to fail)."""
    plan, sampler, study, record = h100_search(tmp_path)
    points = sampler.points

    record(dict(plan.baseline), TrialResult(status=Status.OOM, wall_s=9.0), is_baseline=True)
    guess = points.params[sampler.choose(study.get_trials())]
    ok = TrialResult(status=Status.OK, samples_per_s=311.0, wall_s=24.6, peak_memory_gib=70.5)
    record(guess, ok)
    rung = points.params[sampler.choose(study.get_trials())]
    assert rung["batch_size"] > guess["batch_size"]
    record(rung, TrialResult(status=Status.OOM, wall_s=19.8))

    # One knob away while fewer than 3 trials since the guess found nothing faster, then two.
    for radius in (1, 1, 2):
        proposal = points.params[sampler.choose(study.get_trials())]
        active = {k for k in proposal.keys() & guess.keys() if proposal[k] != guess[k]}
        assert 1 <= len(active) <= radius, (active, proposal)
        assert proposal["torch_compile"] == "off" and proposal["precision"] != "fp8", proposal
        record(proposal, TrialResult(status=Status.CRASHED))  # measured nothing: still one


def test_the_baseline_is_found_where_the_space_file_makes_a_knob_it_leaves_out_inactive(
    tmp_path,
):
    # Pinned memory searched only off fp32, the optimizer not searched: the fp32 baseline
    # (which sets fused AdamW, the default) is the fp32 batch 8 point without either.
    space = tmp_path / "space.yaml"
    space.write_text(
        "device: cuda\n"
        "knobs:\n"
        "  precision: {choices: [fp32, bf16]}\n"
        "  batch_size: {choices: [8, 16]}\n"
        "  dataloader_pin_memory: {choices: [true, false], when: {precision: {not: fp32}}}\n"
    )
    config = load_config(
        ["model=bert-large-uncased", "seq_len=512", f"space={space}", f"out={tmp_path}"]
    )
    plan = make_plan(config, H100)
    points = Points.of(plan, np.random.default_rng(0))
    found = points.find(dict(plan.baseline))
    assert found is not None
    assert points.params[found] == {"precision": "fp32", "batch_size": 8}


def test_the_last_trials_may_compile_the_fastest_eager_settings_at_another_batch(tmp_path):
    """Compiled activations take about twice the memory (`estimate`): at the fastest eager
    batch (bs 128, 70.5 of the H100's 79 GiB) a compiled setting is over the budget, so the
    last trials, one knob from the fastest, never compiled. Compiling (or fp8) may now come
    with another batch and accumulation; any other change stays one knob."""
    plan, sampler, _, _ = h100_search(tmp_path)
    points = sampler.points
    guess = next(
        i
        for i, p in enumerate(points.params)
        if p["batch_size"] == 128
        and p["grad_accum"] == 1
        and p["precision"] == "bf16+tf32"
        and p["optim"] == "adamw_torch_fused"
        and p["attn_implementation"] == "sdpa"
        and not p["gradient_checkpointing"]
        and p["torch_compile"] == "off"
        and not p["use_liger_kernel"]
        and p["dataloader_num_workers"] == 0
    )
    untried = [i for i in range(len(points.params)) if i != guess]
    near = Neighbourhood(points, plan).refinements(untried, guess, late=True)

    def changed(i):
        params, fastest = points.params[i], points.params[guess]
        return {k for k in params.keys() & fastest.keys() if params[k] != fastest[k]}

    compiled = [i for i in near if points.params[i]["torch_compile"] != "off"]
    assert {points.params[i]["batch_size"] for i in compiled} >= {64, 128}
    for i in compiled:
        assert changed(i) - {"batch_size", "grad_accum"} == {"torch_compile"}, points.params[i]
        assert points.params[i]["compile_mode"] == "default"
    for i in near:
        if i not in compiled and points.params[i]["precision"] != "fp8":
            assert len(changed(i)) == 1, points.params[i]
    budget = plan.info.memory_budget_gib
    at_128 = [i for i in compiled if points.params[i]["batch_size"] == 128]
    assert all(plan.estimate_gib(points.params[i]) > budget for i in at_128)
    assert any(plan.estimate_gib(points.params[i]) <= budget for i in compiled)
