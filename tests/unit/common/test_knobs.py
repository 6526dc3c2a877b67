"""The knob catalogue: each knob's mapping, display, baseline and memory order, in one place."""

import re
from pathlib import Path

import optuna
import pytest

import autotune
from autotune.common.errors import SpaceError
from autotune.common.knob_values import optimizer_family, sixteen_bit
from autotune.common.knobs import (
    KNOBS,
    active,
    environment,
    is_compiled,
    model_kwargs,
    training_args,
    value_of,
)
from autotune.common.trial_settings import (
    conflict,
    describe_params,
    effective_batch,
)
from autotune.plan.space import SamplingRules
from autotune.plan.space_file import load_space, parse_space, shipped_names
from tests.unit import installed
from tests.unit.installed import training_arguments_fields as installed_fields

RENAMED = {"activation_checkpointing", "activation_checkpointing_kwargs"}
"""transformers 5's names for gradient_checkpointing(_kwargs): not in older releases."""


def test_checkpointing_reentrant_sets_the_checkpointing_kwargs_of_the_installed_release():
    on = {"gradient_checkpointing": True, "checkpointing_reentrant": True}
    fields = installed_fields()
    assert training_args(on, device="cuda", fields=fields)["activation_checkpointing_kwargs"] == {
        "use_reentrant": True
    }
    older = training_args(on, device="cuda", fields=fields - RENAMED)
    assert older["gradient_checkpointing_kwargs"] == {"use_reentrant": True}
    assert older["gradient_checkpointing"] is True


def test_checkpointing_reentrant_does_nothing_without_checkpointing():
    off = {"gradient_checkpointing": False, "checkpointing_reentrant": True}
    kwargs = training_args(off, device="cuda", fields=installed_fields())
    assert "activation_checkpointing_kwargs" not in kwargs


def test_partial_checkpointing_joins_the_checkpointing_kwargs():
    fields = installed_fields()
    params = {
        "gradient_checkpointing": True,
        "checkpointing_reentrant": False,
        "checkpointing_every_n_layers": 2,
    }
    assert training_args(params, device="cuda", fields=fields) == {
        "fp16": False,
        "bf16": False,
        "tf32": False,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": False, "every_n_layers": 2},
    }
    every = {"gradient_checkpointing": True, "checkpointing_every_n_layers": 1}
    assert "activation_checkpointing_kwargs" not in training_args(
        every, device="cuda", fields=fields
    )
    off = {"gradient_checkpointing": False, "checkpointing_every_n_layers": 3}
    assert "activation_checkpointing_kwargs" not in training_args(off, device="cuda", fields=fields)
    assert describe_params(params) == "gc=on reentrant=off gc_every=2"


@pytest.mark.parametrize(("steps", "expected"), [(0, None), (8, 8)])
def test_torch_empty_cache_steps_zero_means_never(steps, expected):
    kwargs = training_args(
        {"torch_empty_cache_steps": steps},
        device="cuda",
        fields=installed_fields(),
    )
    assert kwargs["torch_empty_cache_steps"] == expected


def test_the_new_knobs_make_real_training_arguments(tmp_path):
    params = {
        "batch_size": 8,
        "gradient_checkpointing": True,
        "checkpointing_reentrant": False,
        "precision": "fp32",
        "optim": "adamw_torch",
        "torch_empty_cache_steps": 4,
    }
    args = installed.transformers().TrainingArguments(
        output_dir=str(tmp_path),
        **training_args(params, device="cpu", fields=installed_fields()),
    )
    assert args.torch_empty_cache_steps == 4
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


def test_loader_settings_follow_the_installed_transformers_and_the_workers():
    params = {
        "dataloader_num_workers": 2,
        "dataloader_prefetch_factor": 4,
        "group_by_length": True,
        "pad_to_multiple_of": 8,
    }
    new = training_args(params, device="cuda", fields={"train_sampling_strategy"})
    assert new["train_sampling_strategy"] == "group_by_length"
    assert new["dataloader_prefetch_factor"] == 4 and "pad_to_multiple_of" not in new
    old = training_args(params, device="cuda", fields={"group_by_length"})
    assert old["group_by_length"] is True
    assert active("dataloader_prefetch_factor", params)
    no_workers = params | {"dataloader_num_workers": 0}
    assert not active("dataloader_prefetch_factor", no_workers), "torch refuses it without"
    assert "dataloader_prefetch_factor" not in training_args(no_workers, device="cpu", fields=set())


def test_facts_about_values_have_one_answer():
    assert sixteen_bit("bf16+tf32") and sixteen_bit("fp16") and not sixteen_bit("tf32")
    assert not sixteen_bit(None)
    assert is_compiled({"torch_compile": "inductor"}) and not is_compiled({})


def test_a_knob_a_setting_leaves_out_trains_at_one_value_wherever_it_is_asked():
    # What the HF defaults train with, the installed transformers' optimizer, and the
    # strategy by the devices a trial has: the same answer for the estimate, the twin, the
    # worker and the exports (they once said batch 8 and batch 1, adamw_torch and fused).
    assert value_of({}, "batch_size") == 8 and value_of({}, "grad_accum") == 1
    assert value_of({}, "optim") == "adamw_torch_fused"
    assert value_of({}, "optim", default_optim="adamw_torch") == "adamw_torch"
    assert value_of({}, "strategy") == "single"
    assert value_of({}, "strategy", devices=2) == "ddp"
    assert value_of({}, "compile_mode") == "default"
    assert value_of({}, "checkpointing_every_n_layers") == 1
    assert value_of({"batch_size": 32}, "batch_size") == 32
    assert effective_batch({}) == 8


def test_no_stage_keeps_a_default_of_its_own_for_a_knob():
    """A knob's value where a setting leaves it out is read from the catalogue (`value_of`),
    never from a literal beside a `.get`."""
    package = Path(autotune.__file__).parent
    pattern = re.compile(r"\.get\(\s*\"(" + "|".join(KNOBS) + r")\"\s*,")
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_a_space_samples_checkpointing_reentrant_only_with_checkpointing_on():
    space = parse_space(
        {
            "knobs": {
                "gradient_checkpointing": {"choices": [False, True]},
                "checkpointing_reentrant": {"choices": [False, True]},
            }
        },
        name="t",
        source="t.yaml",
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(30):
        trial = study.ask()
        seen.append(space.sample(trial, SamplingRules()))
        study.tell(trial, 0.0)
    assert all(("checkpointing_reentrant" in p) == p["gradient_checkpointing"] for p in seen)
    assert {p.get("checkpointing_reentrant") for p in seen} == {None, False, True}


def test_a_space_whose_knob_can_never_take_effect_is_refused():
    with pytest.raises(SpaceError, match="takes effect only with gradient_checkpointing=true"):
        parse_space(
            {"knobs": {"gradient_checkpointing": False, "checkpointing_reentrant": True}},
            name="t",
            source="t.yaml",
        )


def test_the_memory_space_searches_the_new_knobs():
    space = load_space("memory")
    assert space.knobs["checkpointing_reentrant"].choices == (False, True)
    assert space.knobs["torch_empty_cache_steps"].choices == (0, 8)


@pytest.mark.parametrize("name", shipped_names())
def test_shipped_spaces_offer_adamw_and_the_guides_memory_savers_only(name):
    # The HF guide never offers SGD as a substitute for AdamW; Adafactor and 8-bit AdamW are
    # its memory savers, and the search marks them as changing the training.
    allowed = {"AdamW", "AdamW (8-bit states)", "Adafactor"}
    optimizers = load_space(name).knobs["optim"].choices
    assert {optimizer_family(o) for o in optimizers} <= allowed


def test_deepspeeds_strategies_are_the_trainers_deepspeed_config_with_their_own_settings():
    args = training_args({"strategy": "zero3", "zero_overlap_comm": False}, device="cpu", fields=())
    zero = args["deepspeed"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] is False
    assert zero["stage3_param_persistence_threshold"] == "auto"  # HF's sizes from the model
    assert args["deepspeed"]["train_micro_batch_size_per_gpu"] == "auto"  # the args' batch
    offload = training_args({"strategy": "zero3_offload"}, device="cuda", fields=())["deepspeed"]
    assert offload["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert offload["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert offload["optimizer"]["type"] == "AdamW"  # DeepSpeed's, run on the host
    # Without a DeepSpeed strategy its setting has no effect, and sets nothing.
    assert "deepspeed" not in training_args(
        {"strategy": "ddp", "zero_overlap_comm": True}, device="cpu", fields=()
    )
    assert conflict({"strategy": "zero2_offload", "optim": "adafactor"}) == (
        "zero2_offload updates the weights with DeepSpeed's host AdamW, not adafactor"
    )
    assert conflict({"strategy": "zero2_offload", "optim": "adamw_torch_fused"}) is None
    # FSDP2's offload steps the optimizer on the host: any torch optimizer, no bitsandbytes.
    assert conflict({"strategy": "fsdp_offload", "optim": "adafactor"}) == (
        "adafactor cannot update fsdp_offload's sharded parameters (DTensors)"
    )
    assert conflict({"strategy": "fsdp_offload", "optim": "paged_adamw_8bit"}) == (
        "fsdp_offload steps the optimizer on the host, where paged_adamw_8bit's kernels cannot run"
    )
    assert conflict({"strategy": "fsdp_offload", "optim": "sgd"}) is None
    assert training_args({"strategy": "fsdp_offload"}, device="cuda", fields=()) == {
        "fp16": False,
        "bf16": False,
    }  # applied by the ranks, not the Trainer


def test_todays_gpu_knobs_map_to_their_arguments_environment_and_collator():
    fields = installed_fields()
    args = training_args(
        {"use_liger_kernel": True, "gradient_checkpointing": True, "activation_offload": True},
        device="cuda",
        fields=fields,
    )
    assert args["use_liger_kernel"] is True
    assert args["activation_checkpointing_kwargs"] == {"offload": True}
    # fp8: accelerate's, from the environment TrainingArguments reads with fp16 and bf16 off.
    fp8 = {"precision": "fp8"}
    assert training_args(fp8, device="cuda", fields=fields) == {
        "bf16": False,
        "fp16": False,
        "tf32": False,
    }
    assert environment(fp8) == {"ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "AO"}
    assert environment({"precision": "bf16"}) == {}
    assert model_kwargs({"attn_implementation": "flash_attention_2"}) == {
        "attn_implementation": "flash_attention_2"
    }
    # FlashAttention computes in 16 bits only; packing is set on the collator, with it alone.
    assert conflict({"attn_implementation": "flash_attention_2", "precision": "fp32"}) == (
        "flash_attention_2 runs in fp16 or bf16, not fp32"
    )
    assert conflict({"attn_implementation": "flash_attention_3", "precision": "bf16"}) is None
    assert KNOBS["packing"].collator and not active(
        "packing", {"attn_implementation": "sdpa", "packing": True}
    )
    assert active("packing", {"attn_implementation": "flash_attention_2", "packing": True})


def test_a_knob_that_needs_one_of_some_values_says_them_in_words():
    with pytest.raises(
        SpaceError,
        match=r"takes effect only with strategy fsdp, fsdp_grad_op or "
        r"fsdp_offload, which this space never chooses",
    ):
        parse_space(
            {"knobs": {"strategy": "ddp", "fsdp_prefetch": True}}, name="t", source="t.yaml"
        )


@pytest.mark.parametrize("strategy", ["fsdp", "zero3", "zero2_offload"])
def test_a_quantized_base_is_not_sharded(strategy):
    # bitsandbytes' packed weights are no parameters FSDP2 or ZeRO can shard as they are.
    assert conflict({"strategy": strategy, "quantization": "nf4"}).startswith(
        f"a nf4 base holds bitsandbytes' packed weights, which {strategy} does not shard here"
    )
    assert conflict({"strategy": strategy, "quantization": "none"}) is None
    assert conflict({"strategy": "ddp", "quantization": "int8"}) is None
