"""The knob catalogue: each knob's mapping, display, baseline and memory order, in one place."""

import dataclasses

import optuna
import pytest
import transformers

from autotune.errors import SpaceError
from autotune.knobs import (
    KNOBS,
    SAMPLE_ORDER,
    at_least_as_hungry,
    baseline_params,
    describe_params,
    is_compiled,
    sixteen_bit,
    training_args,
)
from autotune.space import SamplingRules
from autotune.space_file import load_space, parse_space

FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
OLD_FIELDS = FIELDS - {"activation_checkpointing", "activation_checkpointing_kwargs"}


def test_checkpointing_reentrant_sets_the_checkpointing_kwargs_of_the_installed_release():
    on = {"gradient_checkpointing": True, "checkpointing_reentrant": True}
    assert training_args(on, device="cuda", fields=FIELDS)["activation_checkpointing_kwargs"] == {
        "use_reentrant": True
    }
    older = training_args(on, device="cuda", fields=OLD_FIELDS)
    assert older["gradient_checkpointing_kwargs"] == {"use_reentrant": True}
    assert older["gradient_checkpointing"] is True


def test_checkpointing_reentrant_does_nothing_without_checkpointing():
    off = {"gradient_checkpointing": False, "checkpointing_reentrant": True}
    kwargs = training_args(off, device="cuda", fields=FIELDS)
    assert "activation_checkpointing_kwargs" not in kwargs


@pytest.mark.parametrize(("steps", "expected"), [(0, None), (8, 8)])
def test_torch_empty_cache_steps_zero_means_never(steps, expected):
    kwargs = training_args({"torch_empty_cache_steps": steps}, device="cuda", fields=FIELDS)
    assert kwargs["torch_empty_cache_steps"] == expected


def test_the_new_knobs_make_real_training_arguments(tmp_path):
    params = {
        "batch_size": 8, "gradient_checkpointing": True, "checkpointing_reentrant": False,
        "precision": "fp32", "optim": "adamw_torch", "torch_empty_cache_steps": 4,
    }  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), **training_args(params, device="cpu", fields=FIELDS)
    )
    assert args.torch_empty_cache_steps == 4
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


def test_a_settings_line_shows_each_knob_as_the_catalogue_says():
    params = {
        "batch_size": 16, "gradient_checkpointing": True, "checkpointing_reentrant": False,
        "precision": "bf16", "optim": "adafactor", "torch_empty_cache_steps": 8,
    }  # fmt: skip
    assert describe_params(params) == "bs=16 gc=on reentrant=off bf16 adafactor empty_cache=8"


def test_the_baseline_is_the_catalogues_hf_defaults():
    assert baseline_params("adamw_torch_fused", None) == {
        "batch_size": 8, "grad_accum": 1, "gradient_checkpointing": False, "precision": "fp32",
        "optim": "adamw_torch_fused", "attn_implementation": "sdpa", "dataloader_num_workers": 0,
    }  # fmt: skip


def test_facts_about_values_have_one_answer():
    assert sixteen_bit("bf16+tf32") and sixteen_bit("fp16") and not sixteen_bit("tf32")
    assert not sixteen_bit(None)
    assert is_compiled({"torch_compile": "inductor"}) and not is_compiled({})
    assert set(SAMPLE_ORDER) == set(KNOBS)


def test_the_memory_order_of_the_new_knobs_is_unordered():
    oom = {"gradient_checkpointing": True, "checkpointing_reentrant": True, "batch_size": 8}
    assert at_least_as_hungry({**oom, "batch_size": 16}, oom)
    assert not at_least_as_hungry({**oom, "checkpointing_reentrant": False}, oom)


def test_a_space_samples_checkpointing_reentrant_only_with_checkpointing_on():
    space = parse_space(
        {"knobs": {"gradient_checkpointing": {"choices": [False, True]},
                   "checkpointing_reentrant": {"choices": [False, True]}}},
        name="t", source="t.yaml",
    )  # fmt: skip
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
            name="t", source="t.yaml",
        )  # fmt: skip


def test_the_memory_space_searches_the_new_knobs():
    space = load_space("memory")
    assert space.knobs["checkpointing_reentrant"].choices == (False, True)
    assert space.knobs["torch_empty_cache_steps"].choices == (0, 8)
