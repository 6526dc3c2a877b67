"""`strategy=tp`: searched on several GPUs for the model types the installed transformers has a
tensor-parallel plan for, with `tp_size` among the splits of the trial's devices; gone from a
CPU search with accelerate's refusal as its reason; refused beside an optimizer or a base that
cannot be sharded. The real split and its losses: tests/integration/test_tensor_parallel.py."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.child.ranks import Rank
from autotune.common.errors import SpaceError
from autotune.common.knob_values import TENSOR_PARALLEL_ON_CPU
from autotune.common.knobs import value_of
from autotune.common.models import resolve_model
from autotune.common.trial_settings import conflict, math_changes, replicas
from autotune.plan.capabilities import fit_space, fit_tp_to_run, tp_sizes
from autotune.plan.estimate import estimate, shape_of
from autotune.plan.space import SearchSpace, SpaceKnob
from tests.unit.stand_ins import GPUS, plan_for

TP_PLANS = dataclasses.replace(GPUS, tp_model_types=("llama", "qwen2", "mistral"))


def space(*knobs: SpaceKnob) -> SearchSpace:
    batch = SpaceKnob(name="batch_size", choices=(8, 16))
    knobs = {"batch_size": batch, **{k.name: k for k in knobs}}
    return SearchSpace(name="t", description="", device="any", knobs=knobs)


def fitted(devices: int, model_type: str = "llama", *knobs: SpaceKnob) -> SearchSpace:
    return fit_space(
        space(*knobs), "cuda", TP_PLANS, "data", devices=devices, model=(model_type, "causal-lm")
    )


def test_tp_is_searched_on_several_gpus_for_a_model_with_a_plan_with_its_group_sizes():
    on_8 = fitted(8)
    assert "tp" in on_8.knobs["strategy"].choices
    assert on_8.knobs["tp_size"].choices == (2, 4, 8)  # tp=2 x 4 groups .. tp=8 x 1
    assert "tp_size searched among 2, 4, 8: 8 devices per trial" in on_8.notes
    on_2 = fitted(2)
    assert "tp" in on_2.knobs["strategy"].choices
    assert "tp_size" not in on_2.knobs  # one split: both ranks one group
    assert tp_sizes(6) == (2, 3, 6) and tp_sizes(2) == (2,)


def test_tp_leaves_for_a_model_without_a_plan_and_so_does_tp_size():
    bert = fitted(8, "bert")
    assert "tp" not in bert.knobs["strategy"].choices and "tp_size" not in bert.knobs
    assert (
        "removed strategy=tp: the installed transformers has no tensor-parallel plan for "
        "bert models (it has one for 3: llama, mistral, qwen2)"
    ) in bert.notes


def test_a_named_tp_size_keeps_the_values_that_divide_the_devices():
    named = SpaceKnob(name="tp_size", choices=(2, 3, 4))
    strategy = SpaceKnob(name="strategy", choices=("ddp", "tp"))
    kept = fitted(4, "llama", strategy, named)
    assert kept.knobs["tp_size"].choices == (2, 4)
    assert "removed tp_size=3: does not divide devices_per_trial=4" in kept.notes
    with pytest.raises(SpaceError, match=r"tp_size: none of its values \(3\) divides"):
        fitted(4, "llama", strategy, SpaceKnob(name="tp_size", choices=(3,)))
    # Where tp itself left the space (no plan for BERT), its sizes are not judged: they go too.
    bert = fitted(4, "bert", strategy, SpaceKnob(name="tp_size", choices=(3,)))
    assert "tp_size" not in bert.knobs and bert.knobs["strategy"].choices == ("ddp",)


def test_tp_leaves_a_cpu_search_with_accelerates_refusal_as_its_reason(tmp_path):
    plan = plan_for(tmp_path, "devices_per_trial=2", "workers=1", tp_model_types=("bert",))
    assert "tp" not in plan.space.knobs["strategy"].choices
    assert "tp_size" not in plan.space.knobs
    assert f"removed strategy=tp: {TENSOR_PARALLEL_ON_CPU}" in plan.space.notes


def test_tp_is_refused_beside_an_optimizer_or_a_base_it_cannot_shard():
    assert "cannot update tp's sharded parameters" in conflict(
        {"strategy": "tp", "optim": "adafactor"}
    )
    assert "does not shard here" in conflict(
        {"strategy": "tp", "optim": "adamw_torch", "quantization": "4bit"}
    )
    assert conflict({"strategy": "tp", "optim": "adamw_torch_fused"}) is None


def test_tp_size_left_out_is_every_device_under_tp_and_one_otherwise():
    assert value_of({"strategy": "tp"}, "tp_size", devices=8) == 8
    assert value_of({"strategy": "tp", "tp_size": 2}, "tp_size", devices=8) == 2
    assert value_of({"strategy": "ddp"}, "tp_size", devices=8) == 1


def test_a_ranks_tensor_parallel_groups():
    assert Rank(0, 8, "tp", tp_size=2).tensor_parallel == (2, 4)  # 4 groups of 2 shard the rest
    assert Rank(0, 8, "tp", tp_size=8).tensor_parallel == (8, 1)
    assert Rank(0, 8, "ddp").tensor_parallel is None
    assert Rank(0, 8, "tp", tp_size=2).trainer_distributed


QWEN_7B = resolve_model("Qwen/Qwen2.5-7B").config


def at(strategy: str, devices: int, **params):
    settings = {"strategy": strategy, "batch_size": 1, "precision": "bf16", **params}
    return estimate(
        QWEN_7B, task="causal-lm", seq_len=2048, params=settings, device="cuda", devices=devices
    )


def test_a_tp_rank_holds_its_share_of_the_split_weights_and_all_of_the_rest():
    shape = shape_of(QWEN_7B)
    split = shape.layers * shape.block_linear + shape.vocab * shape.hidden
    rest = shape.parameters - split
    assert 0 < rest < shape.parameters * 0.1  # Qwen2.5-7B's untied input embedding, the norms
    ddp, tp2 = at("ddp", 2), at("tp", 2)
    assert ddp.weights == 6 * shape.parameters  # fp32 weights and their bf16 copies
    assert tp2.weights == 6 * (split // 2 + rest)
    assert tp2.optimizer == pytest.approx(ddp.optimizer * (split / 2 + rest) / shape.parameters)
    # Four groups of two shard each rank's share again (FSDP2 over `dp_shard`).
    tp2_by_4 = at("tp", 8, tp_size=2)
    assert tp2_by_4.model_states == pytest.approx(tp2.model_states / 4, rel=1e-6)
    # Eight ways alone, every rank keeps the whole of the rest (the 545M-parameter input
    # embedding): more than two ways by four groups, which shard it too.
    tp8 = at("tp", 8)
    assert tp8.weights == 6 * (split // 8 + rest)
    assert tp8.model_states > tp2_by_4.model_states


def test_a_tp_ranks_activations_split_the_heads_and_the_mlp_but_not_the_residuals():
    ddp, tp2, tp4 = at("ddp", 2), at("tp", 2), at("tp", 4)
    assert tp4.activations < tp2.activations < ddp.activations
    assert tp2.activations > ddp.activations / 2  # the residual stream stays whole
    assert tp2.logits == ddp.logits  # the head's output is gathered on every rank


def test_a_tp_trial_trains_one_batch_a_group_so_its_effective_batch_is_named_a_math_change():
    baseline = {"strategy": "ddp", "batch_size": 8, "grad_accum": 1}
    assert replicas(baseline, 8) == 8 and replicas({"strategy": "tp", "tp_size": 2}, 8) == 4
    (change,) = math_changes({**baseline, "strategy": "tp", "tp_size": 2}, baseline, devices=8)
    assert (change.setting, change.baseline, change.value) == ("effective_batch_size", 64, 32)
    assert math_changes({**baseline, "strategy": "tp", "batch_size": 64}, baseline, 8) == []


def test_tp_leaves_a_run_with_a_users_trainer_or_a_fixed_effective_batch():
    strategy = SpaceKnob(name="strategy", choices=("ddp", "tp"))
    space = fitted(2, "llama", strategy)
    mine = fit_tp_to_run(space, trainer=True, fixed_batch=False)
    assert mine.knobs["strategy"].choices == ("ddp",)
    assert "removed strategy=tp: trainer= builds the model whole" in mine.notes[-1]
    fixed = fit_tp_to_run(space, trainer=False, fixed_batch=True)
    assert "effective_batch_size= is split over every rank" in fixed.notes[-1]
    lora = fit_tp_to_run(space, trainer=False, fixed_batch=False, adapter=True)
    assert lora.knobs["strategy"].choices == ("ddp",)
    assert "peft's layers are not applied to tensor-parallel (DTensor) weights" in lora.notes[-1]
    assert fit_tp_to_run(space, trainer=False, fixed_batch=False) is space
    with pytest.raises(SpaceError, match="strategy=tp: trainer= builds"):
        fit_tp_to_run(
            fitted(2, "llama", SpaceKnob(name="strategy", choices=("tp",))),
            trainer=True,
            fixed_batch=False,
        )
