"""The batch-size rule on the H100 of the first GPU run (its probe's facts, copied from
`../shared/gpu/h100-2026-11-26/probe.json`): `effective_batch_size=32` for bert-large at
seq_len 512 was refused there, though 8 divides 32 and bf16 bs 32 ran within 7% of bs 64."""

import json
from pathlib import Path

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError, SpaceError
from autotune.plan.batch_rule import apply_sampling_rules
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.space import SamplingRules
from autotune.plan.space_file import load_space
from tests.unit import installed

PROBE = Path(__file__).parents[2] / "fixtures" / "probe-h100-2026-11-26.json"
H100 = DeviceInfo.from_facts(json.loads(PROBE.read_text()))
EVERY_PRECISION = ("fp32", "tf32", "fp16", "bf16", "bf16+tf32", "fp8")
"""The default space's precisions that this H100 and its packages can run."""


def plan_on_h100(tmp_path, *settings):
    config = load_config(["model=bert-large-uncased", f"out={tmp_path / 'out'}", *settings])
    return make_plan(config, H100)


def test_the_probe_is_a_tensor_core_gpu():
    assert H100.tensor_core_64  # else the tests below would not meet the 16-bit rule at all


@pytest.mark.parametrize("effective", [32, 128])
def test_bert_large_at_512_keeps_every_precision_and_batches_of_8(tmp_path, effective):
    plan = plan_on_h100(tmp_path, "seq_len=512", f"effective_batch_size={effective}")
    space, rules = plan.space, plan.rules
    assert space.knobs["precision"].choices == EVERY_PRECISION
    assert not [n for n in plan.info.space_notes if "left out" in n]
    for precision in EVERY_PRECISION:
        candidates = space.batch_candidates(precision, rules)
        assert {8, 16, 32} <= set(candidates), precision
        assert all(effective % b == 0 for b in candidates)
    # 16-bit and fp32 under one multiple: one Optuna parameter, which the sampler learns as one.
    assert [p for p in space.grid(rules) if p.startswith("batch_size")] == ["batch_size"]


def test_an_odd_seq_len_leaves_out_the_16_bit_precisions_with_a_note(tmp_path):
    """511 tokens a sample: only a batch of 64 gives the matmuls rows in multiples of 64."""
    plan = plan_on_h100(tmp_path, "seq_len=511", "effective_batch_size=32")
    assert plan.space.knobs["precision"].choices == ("fp32", "tf32")
    assert plan.space.batch_candidates("fp32", plan.rules) == (8, 16, 32)
    assert (
        "precision=fp16, bf16, bf16+tf32, fp8 left out: no batch size that is a multiple of 64 "
        "divides effective_batch_size=32 (batch sizes allowed under the rule: 64, 128, 192, 256)"
    ) in plan.info.space_notes


def test_16_bit_at_seq_len_100_takes_multiples_of_16(tmp_path):
    plan = plan_on_h100(tmp_path, "seq_len=100", "effective_batch_size=64")
    assert plan.space.batch_candidates("bf16", plan.rules) == (16, 32, 64)
    assert plan.space.batch_candidates("fp32", plan.rules) == (8, 16, 32, 64)
    # Two rules, two Optuna parameters: each keeps its choices from trial to trial.
    grid = plan.space.grid(plan.rules)
    assert grid["batch_size"] == [8, 16, 32, 64]
    assert grid["batch_size_x16"] == [16, 32, 64]
    for precision in EVERY_PRECISION:
        params = {**plan.baseline, "precision": precision, "batch_size": 16}
        assert plan.space.holds(params, plan.rules), precision


def test_an_effective_batch_no_precision_can_take_is_refused_with_the_real_candidates(tmp_path):
    with pytest.raises(ConfigError) as refused:
        plan_on_h100(tmp_path, "seq_len=512", "effective_batch_size=12")
    message = str(refused.value)
    assert (
        "effective_batch_size=12: no batch size of space default divides it under the "
        "batch-size rule:\n  - precision=fp32, tf32, fp16, bf16, bf16+tf32, fp8: batch sizes "
        "allowed under the rule: 8, 16, 24, ..., 256\n"
    ) in message
    assert "9, 10" not in message


@pytest.mark.parametrize("source", ["data", "trainer"])
def test_samples_of_varying_length_fall_back_to_multiples_of_8(tmp_path, source):
    """Padded per batch (data=) or by the user's collator (trainer=), a batch's tokens are no
    fixed multiple of its size: the tensor-core rule has nothing to hold on to."""
    data = tmp_path / "reviews.jsonl"
    data.write_text('{"text": "a fine film"}\n{"text": "too long"}\n')
    trainer = tmp_path / "mine.py"
    trainer.write_text("def make(model, args, train_dataset):\n    raise NotImplementedError\n")
    given = f"data={data}" if source == "data" else f"trainer={trainer}:make"
    plan = plan_on_h100(tmp_path, "seq_len=511", "effective_batch_size=32", given)
    assert plan.space.knobs["precision"].choices == EVERY_PRECISION
    for precision in EVERY_PRECISION:
        assert plan.space.batch_candidates(precision, plan.rules) == (8, 16, 32), precision


def quick_on_h100(effective, tokens_per_sample=100):
    """The shipped quick space (fp32 and bf16) under this H100's rules."""
    rules = SamplingRules(
        effective_batch_size=effective,
        tensor_core_64=H100.tensor_core_64,
        tokens_per_sample=tokens_per_sample,
    )
    return apply_sampling_rules(load_space("quick", installed.software_facts()), rules), rules


def test_a_precision_no_batch_size_of_which_divides_the_effective_batch_is_left_out():
    # An odd sample length: 16-bit on an H100 takes multiples of 64 only, and 64 > 32.
    space, rules = quick_on_h100(32, tokens_per_sample=511)
    assert space.knobs["precision"].choices == ("fp32",)
    assert space.batch_candidates("fp32", rules) == (8, 16, 32)
    assert (
        "precision=bf16 left out: no batch size that is a multiple of 64 divides "
        "effective_batch_size=32 (batch sizes allowed under the rule: 64)"
    ) in space.notes


def test_an_effective_batch_no_batch_size_of_any_precision_divides_is_refused():
    with pytest.raises(SpaceError) as refused:
        quick_on_h100(12)
    assert str(refused.value) == (
        "effective_batch_size=12: no batch size of space quick divides it under the batch-size "
        "rule:\n"
        "  - precision=fp32: batch sizes allowed under the rule: 8, 16, 32, 64\n"
        "  - precision=bf16: batch sizes allowed under the rule: 16, 32, 64\n"
        "  give an effective_batch_size that one of these batch sizes divides"
    )
