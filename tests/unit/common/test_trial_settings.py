"""A trial's settings as a whole: how they read, the baseline's, the differences that change the
training itself, memory order against an out-of-memory trial."""

import pytest

from autotune.common.trial_settings import (
    at_least_as_hungry,
    baseline_params,
    describe_params,
    math_changes,
)
from tests.unit.stand_ins import OOM

BASELINE = baseline_params("adamw_torch_fused", None)


def test_a_settings_line_shows_each_knob_as_the_catalogue_says():
    params = {
        "batch_size": 16,
        "gradient_checkpointing": True,
        "checkpointing_reentrant": False,
        "precision": "bf16",
        "optim": "adafactor",
        "torch_empty_cache_steps": 8,
    }
    assert describe_params(params) == "bs=16 gc=on reentrant=off bf16 adafactor empty_cache=8"


def test_the_baseline_is_the_catalogues_hf_defaults():
    synthetic = {
        "batch_size": 8,
        "grad_accum": 1,
        "gradient_checkpointing": False,
        "precision": "fp32",
        "optim": "adamw_torch_fused",
        "attn_implementation": "sdpa",
    }
    assert baseline_params("adamw_torch_fused", None) == synthetic
    loader = {"dataloader_num_workers": 0, "group_by_length": False}
    assert baseline_params("adamw_torch_fused", None, own_data=True) == synthetic | loader | {
        "pad_to_multiple_of": 1
    }
    users_trainer = baseline_params("adamw_torch_fused", None, own_data=True, own_collator=False)
    assert users_trainer == synthetic | loader, "a user's Trainer pads with its own collator"


def test_the_memory_order_of_the_new_knobs_is_unordered():
    oom = {"gradient_checkpointing": True, "checkpointing_reentrant": True, "batch_size": 8}
    assert at_least_as_hungry({**oom, "batch_size": 16}, oom)
    assert not at_least_as_hungry({**oom, "checkpointing_reentrant": False}, oom)


@pytest.mark.parametrize(
    ("change", "settings"),
    [
        ({"optim": "adamw_torch"}, []),  # another kernel of the same AdamW
        ({"gradient_checkpointing": True, "attn_implementation": "eager"}, []),
        ({"batch_size": 4, "grad_accum": 2}, []),  # the same 8 samples per update
        ({"batch_size": 32}, ["effective_batch_size"]),
        ({"optim": "adafactor"}, ["optim"]),
        ({"optim": "adamw_bnb_8bit"}, ["optim"]),
        ({"precision": "bf16"}, ["precision"]),
        ({"precision": "tf32"}, ["precision"]),
        (
            {"batch_size": 16, "precision": "bf16", "optim": "sgd"},
            ["effective_batch_size", "precision", "optim"],
        ),
    ],
)
def test_only_differences_that_change_the_training_itself_are_marked(change, settings):
    changes = math_changes({**BASELINE, **change}, BASELINE)
    assert [c.setting for c in changes] == settings


def test_a_math_change_says_what_changed_and_why():
    (batch, optim) = math_changes({**BASELINE, "batch_size": 32, "optim": "adafactor"}, BASELINE)
    assert (batch.baseline, batch.value) == (8, 32)
    assert "effective_batch_size=8" in batch.describe()
    assert optim.describe().startswith("optim adamw_torch_fused -> adafactor: another optimizer")
    (eight_bit,) = math_changes({**BASELINE, "optim": "paged_adamw_8bit"}, BASELINE)
    assert "8-bit" in eight_bit.why and "approximate" in eight_bit.why


@pytest.mark.parametrize(
    ("change", "hungry"),
    [
        ({}, True),
        ({"batch_size": 64}, True),
        ({"batch_size": 16}, False),
        ({"gradient_checkpointing": True}, False),
        ({"precision": "fp32"}, False),  # no safe order between precisions
        ({"optim": "adafactor"}, False),
    ],
)
def test_at_least_as_hungry_as_an_oom(change, hungry):
    assert at_least_as_hungry({**OOM, **change}, OOM) is hungry


def test_checkpointing_off_is_hungrier_than_an_oom_that_had_it_on():
    oom = {**OOM, "gradient_checkpointing": True}
    assert at_least_as_hungry({**OOM, "gradient_checkpointing": False, "batch_size": 48}, oom)


def test_baseline_is_the_hf_defaults_at_the_fixed_effective_batch():
    assert baseline_params("adamw_torch", 64)["grad_accum"] == 8
    fixed = baseline_params("adamw_torch", 12)
    assert fixed["batch_size"] * fixed["grad_accum"] == 12


def test_a_knob_without_effect_in_either_config_is_not_compared():
    oom = {**OOM, "gradient_checkpointing": True, "checkpointing_reentrant": True}
    assert at_least_as_hungry({**OOM, "batch_size": 64}, oom)  # checkpointing off: no reentrant


def test_on_several_devices_the_baseline_is_ddp_and_the_effective_batch_counts_every_rank():
    from autotune.common.trial_settings import baseline_params, math_changes

    baseline = baseline_params("adamw_torch_fused", None, devices=2)
    assert baseline["strategy"] == "ddp"
    assert "strategy" not in baseline_params("adamw_torch_fused", None)
    (change,) = math_changes(baseline | {"batch_size": 16, "strategy": "fsdp"}, baseline, 2)
    assert (change.setting, change.baseline, change.value) == ("effective_batch_size", 16, 32)
    assert "keep it with effective_batch_size=16" in change.why
