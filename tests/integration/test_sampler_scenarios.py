"""The sampler's scenarios: on the default cuda space of bert-large on the H100's facts
(62,208 settings) the expert's guess, its ladder and what comes after; on 192 settings of the
tiny model on CPU, whole searches of 20-100 trials (`study/sampling`). Pure, but each takes
1-5 s of the effects model: kept out of the unit run, whose promise is its time."""

import dataclasses
import functools

import optuna
import pytest

from autotune.common.trial import Status, TrialResult
from autotune.store.records import PARAMS_ATTR, tell_result
from autotune.study.sampling.effects import EffectsSampler
from autotune.study.sampling.neighbourhood import Neighbourhood
from tests.unit.study.test_effects import BEST, effects_plan, ran, search, speed
from tests.unit.study.test_guess import h100_search


@pytest.fixture
def plan(tmp_path):
    return effects_plan(tmp_path)


def test_on_the_default_cuda_space_the_model_takes_over_from_the_ladder_not_novelty(tmp_path):
    """`autotune search model=bert-large-uncased seq_len=512` on the H100's facts, its default
    space (62,208 settings: loader workers, pinned memory, Liger, compile modes, checkpointing
    every n layers): the baseline, which sets none of those, is the point with each at what
    training then does, so that with the guess two settings are measured and the model
    chooses. Where it was not (a knob inactive in the baseline's setting filled in), the next
    trial after the ladder was the setting with the most unseen values: bs 200 checkpointed,
    fp8, paged 8-bit AdamW, eager attention, compiled (112 s on the twin, stopped)."""
    # No headroom: the guess and its ladder may fill the budget, as the twin's H100 run did
    # (under the default 10%, the guess is batch 120, under its 70.8 GiB limit).
    plan, sampler, study, record = h100_search(tmp_path, "headroom=0")
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


def test_on_multiplicative_effects_the_best_of_192_is_found_within_20_trials(plan):
    for seed in range(3):
        settings = ran(search(plan, 20, seed=seed))
        assert BEST in settings, seed
        assert len({str(sorted(p.items())) for p in settings}) == 20, "nothing twice"


def test_the_sampler_says_enough_once_no_untried_setting_is_worth_its_trial(plan):
    """192 settings of multiplicative effects: the model soon expects nothing left to gain
    0.1% of samples/s a minute (`min_gain_per_minute`) and says so before a trial is given
    settings, the best found by then; at 0 it never says so."""

    def until_enough(plan, most):
        sampler = EffectsSampler(plan, seed=0)
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        for _ in range(most):
            trial = study.ask()
            enough = sampler.enough(trial.number)
            if enough is not None:
                return [t.user_attrs[PARAMS_ATTR] for t in study.trials[:-1]], enough
            params = plan.space.sample(trial, plan.rules)
            trial.set_user_attr(PARAMS_ATTR, params)
            result = TrialResult(
                status=Status.OK, samples_per_s=speed(params), peak_memory_gib=1.0, wall_s=5.0
            )
            tell_result(study, trial, result, plan.info.memory_budget_gib, noise_cv=0.1)
        return ran(study), None

    plan = dataclasses.replace(plan, config=plan.config.model_copy(update={"n_trials": 100}))
    settings, enough = until_enough(plan, 100)
    assert enough is not None and "0.10% of samples/s a minute" in enough
    assert BEST in settings and len(settings) < 30, len(settings)
    never = plan.config.model_copy(update={"min_gain_per_minute": 0.0})
    settings, enough = until_enough(dataclasses.replace(plan, config=never), 2 * len(settings))
    assert enough is None
