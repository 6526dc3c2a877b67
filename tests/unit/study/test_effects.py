"""`sampler=effects`: the space's settings enumerated, the designed start, the model of the
knobs' effects, what it passes over, and the confidence it reports at the end."""

import math

import numpy as np
import optuna
import pytest

from autotune.common.device import DeviceInfo
from autotune.common.trial import Status, TrialResult
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.outcomes import SearchConfidence
from autotune.store.records import PARAMS_ATTR, TrialRecord, tell_result
from autotune.study.sampling import model as effects
from autotune.study.sampling.effects import EffectsSampler
from autotune.study.sampling.model import confidence, predict
from autotune.study.sampling.points import Points
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False,
    name="cpu",
    total_memory_bytes=2**34,
    free_memory_bytes=2**34,
    cpu_name="cpu",
    host_available_memory_bytes=2**34,
)
SPACE = """
device: cpu
knobs:
  batch_size: {choices: [8, 16, 32, 64]}
  grad_accum: {choices: [1, 2]}
  gradient_checkpointing: {choices: [false, true]}
  checkpointing_reentrant: {choices: [false, true]}
  optim: {choices: [adamw_torch, adamw_torch_fused, adafactor, sgd]}
  attn_implementation: {choices: [sdpa, eager]}
"""
SETTINGS = 4 * 2 * (1 + 2) * 4 * 2
"""Checkpointing off, or on with either re-entrance: 192 settings."""
EFFECTS = {
    "batch_size": {8: 0.0, 16: 0.25, 32: 0.4, 64: 0.35},
    "grad_accum": {1: 0.0, 2: 0.06},
    "gradient_checkpointing": {False: 0.0, True: -0.3},
    "checkpointing_reentrant": {False: 0.0, True: -0.04},
    "optim": {"adamw_torch": 0.0, "adamw_torch_fused": 0.1, "adafactor": -0.05, "sgd": 0.14},
    "attn_implementation": {"sdpa": 0.08, "eager": 0.0},
}
"""log samples/s, one effect per knob value: the best setting is unique."""


def speed(params):
    effect = sum(EFFECTS[k][v] for k, v in params.items() if k in EFFECTS)
    return 100 * math.exp(effect)


BEST = {"batch_size": 32, "grad_accum": 2, "gradient_checkpointing": False,
        "optim": "sgd", "attn_implementation": "sdpa"}  # fmt: skip


@pytest.fixture
def plan(tmp_path):
    return effects_plan(tmp_path)


def effects_plan(tmp_path):
    """192 settings of the tiny model on CPU, searched by the effects sampler."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    config = load_config(
        [
            f"model={TINY_MODEL}",
            f"space={space}",
            f"out={tmp_path}",
            "sampler=effects",
            "n_trials=20",
            "memory_budget=8GiB",
        ]
    )
    return make_plan(config, CPU)


def search(plan, trials, answer=speed, seed=0):
    """The loop's ask, publish and tell, by hand: each trial answered by `answer` (samples/s,
    or None for out of memory)."""
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=EffectsSampler(plan, seed=seed)
    )
    for _ in range(trials):
        trial = study.ask()
        params = plan.space.sample(trial, plan.rules)
        trial.set_user_attr(PARAMS_ATTR, params)
        samples = answer(params)
        result = (
            TrialResult(status=Status.OK, samples_per_s=samples, peak_memory_gib=1.0)
            if samples
            else TrialResult(status=Status.OOM)
        )
        tell_result(study, trial, result, plan.info.memory_budget_gib, noise_cv=0.1)
    return study


def ran(study):
    return [t.user_attrs[PARAMS_ATTR] for t in study.trials]


def test_points_are_every_setting_the_space_suggests_with_its_optuna_parameters(plan):
    points = plan.space.points(plan.rules, limit=1000)
    settings = [p for p, _ in points]
    assert len(points) == SETTINGS
    assert len({str(sorted(p.items())) for p in settings}) == SETTINGS
    for params, parameters in points:
        assert plan.space.sample(optuna.trial.FixedTrial(parameters), plan.rules) == params
        assert ("checkpointing_reentrant" in params) == params["gradient_checkpointing"]


def test_a_space_past_the_limit_gives_a_random_sample_of_its_settings(plan):
    points = plan.space.points(plan.rules, limit=50, rng=np.random.default_rng(1))
    assert len(points) == 50
    assert len({str(sorted(p.items())) for p, _ in points}) == 50
    for params, parameters in points:
        assert plan.space.sample(optuna.trial.FixedTrial(parameters), plan.rules) == params
    again = plan.space.points(plan.rules, limit=50, rng=np.random.default_rng(1))
    assert again == points, "seeded"


def test_the_search_opens_with_the_experts_guess_then_a_batch_ladder(plan):
    """No precision in this CPU space: the guess is fused AdamW, eager attention, no
    checkpointing, at the largest batch (all fit in 8 GiB; no baseline trial here bounds its
    cost), no accumulation; the ladder then halves the batch while that gains 5% (64 -> 32
    gains 5.1%, 32 -> 16 loses), and the model goes on from the fastest."""
    study = search(plan, 4)
    guess = {
        "batch_size": 64,
        "grad_accum": 1,
        "gradient_checkpointing": False,
        "optim": "adamw_torch_fused",
        "attn_implementation": "eager",
    }
    assert ran(study)[:3] == [guess, guess | {"batch_size": 32}, guess | {"batch_size": 16}]
    fastest, fourth = guess | {"batch_size": 32}, ran(study)[3]
    assert sum(fourth.get(k) != v for k, v in fastest.items()) == 1, "one knob from the fastest"


def test_a_wrong_prior_does_not_trap_the_search(plan):
    """Where the guides' advice is the slowest choice of every knob, the best is still found."""

    def contrary(params):
        effect = sum(-EFFECTS[k][v] for k, v in params.items() if k in EFFECTS)
        return 100 * math.exp(effect)

    best = {
        "batch_size": 8,
        "grad_accum": 1,
        "gradient_checkpointing": True,
        "checkpointing_reentrant": True,
        "optim": "adafactor",
        "attn_implementation": "eager",
    }
    assert max((p for p, _ in plan.space.points(plan.rules, limit=1000)), key=contrary) == best
    assert best in ran(search(plan, 20, contrary))


def test_a_measurement_the_others_contradict_loses_its_weight(plan, monkeypatch):
    points = Points.of(plan, np.random.default_rng(0))
    rng = np.random.default_rng(2)
    observed = [int(i) for i in rng.choice(len(points.params), 16, replace=False)]
    y = np.log([speed(points.params[i]) for i in observed])
    at = [i for i in range(len(points.params)) if i not in observed]
    truth = np.log([speed(points.params[i]) for i in at])
    clean, _ = predict(points, observed, y, at)
    assert np.abs(clean - truth).max() < 0.05
    disturbed = y.copy()
    disturbed[0] -= math.log(3)  # one run three times slower than its settings are
    kept, _ = predict(points, observed, disturbed, at)
    monkeypatch.setattr(effects, "OUTLIER_Z", math.inf)
    trusted, _ = predict(points, observed, disturbed, at)
    assert np.abs(trusted - truth).max() > 0.5, "believed, it misleads the model"
    assert np.abs(kept - truth).max() < 0.2
    assert np.median(np.abs(kept - truth)) < 0.05


def test_settings_running_elsewhere_or_skipped_by_the_loop_are_passed_over(plan):
    sampler = EffectsSampler(plan, seed=0)
    # Filled by hand (another sampler: this one would fit its model at each of 190 asks).
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0)
    )
    small = {
        "gradient_checkpointing": False,
        "grad_accum": 1,
        "optim": "sgd",
        "attn_implementation": "sdpa",
    }
    # Every setting tried but batch 16 and 64 of `small`; 32 ran out of memory.
    for i, params in enumerate(sampler.points.params):
        if params in ({**small, "batch_size": 16}, {**small, "batch_size": 64}):
            continue
        trial = study.ask({})
        trial.set_user_attr(PARAMS_ATTR, params)
        oom = params == {**small, "batch_size": 32}
        result = (
            TrialResult(status=Status.OOM)
            if oom
            else TrialResult(
                status=Status.OK, samples_per_s=speed(params) + i * 1e-6, peak_memory_gib=1.0
            )
        )
        tell_result(study, trial, result, 8.0, noise_cv=0.1)
    trials = study.get_trials(deepcopy=False)
    index = sampler.choose(trials)
    assert sampler.points.params[index] == {**small, "batch_size": 16}, "64: as hungry as the OOM"
    running = study.ask({})
    running.set_user_attr(PARAMS_ATTR, {**small, "batch_size": 16})
    assert sampler.choose(study.get_trials(deepcopy=False)) is None


def test_a_baseline_that_leaves_out_a_knob_is_the_setting_with_what_training_then_does(plan):
    points = Points.of(plan, np.random.default_rng(0))
    eager = next(i for i, p in enumerate(points.params) if p["attn_implementation"] == "eager")
    full = points.params[eager]
    assert points.find(full) == eager
    partial = {k: v for k, v in full.items() if k != "attn_implementation"}
    assert points.params[points.find(partial)] == {**full, "attn_implementation": "sdpa"}
    # The optimizer left out: the installed transformers' default (fused AdamW).
    no_optim = {k: v for k, v in full.items() if k != "optim"}
    assert points.params[points.find(no_optim)] == {**full, "optim": "adamw_torch_fused"}
    alone = {k: v for k, v in full.items() if k != "grad_accum"}
    assert points.find({**alone, "grad_accum": 7}) is None
    # The space searches no precision: the baseline's fp32 is what training does without it,
    # and bf16 is no setting of this space.
    assert points.find({**full, "precision": "fp32"}) == eager
    assert points.find({**full, "precision": "bf16"}) is None


def records_of(study):
    from autotune.store.records import load_records

    return load_records(study)


def test_the_confidence_says_whether_more_trials_would_pay(plan):
    early = confidence(plan, records_of(search(plan, 3)))
    assert early.untried == SETTINGS - 3 and early.could_beat > 0
    assert early.describe().endswith("more trials may pay")
    late = confidence(plan, records_of(search(plan, 40)))
    assert late.untried == SETTINGS - 40
    assert late.best_samples_per_s == pytest.approx(speed(BEST))
    assert late.could_beat == 0
    assert late.describe().endswith("more trials are unlikely to pay")
    assert late.records_seen == 40 and late.trials == 40


def test_the_confidence_wording():
    found = SearchConfidence(
        trials=20,
        best_samples_per_s=300.0,
        untried=170,
        could_beat=4,
        upper_samples_per_s=331.5,
        gain=0.02,
        chance=0.1,
    )
    assert found.describe() == (
        "4 of 170 untried settings could beat the best by 2% (a chance of 10% or more each; "
        "the model's 95% bound 331.5 samples/s, fastest found 300.0): more trials may pay"
    )
    none_left = SearchConfidence(
        trials=192,
        best_samples_per_s=300.0,
        untried=0,
        could_beat=0,
        upper_samples_per_s=None,
        gain=0.02,
        chance=0.1,
    )
    assert none_left.describe() == "every setting of the space that fits was tried"


def test_no_confidence_before_two_trials_were_measured(plan):
    assert confidence(plan, []) is None
    oom = [TrialRecord(number=0, params=BEST, result=TrialResult(status=Status.OOM))]
    assert confidence(plan, oom) is None
