"""A `trainer=` factory's model is estimated once a trial of it has reported it: its config,
task, adapter and longest batch, the base's dtype and quantization as its config states them;
never `model=` at `seq_len=`, which only name the study."""

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.common.adapter import lora_config
from autotune.common.device import DeviceInfo
from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialResult
from autotune.plan.estimate import estimate
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan

PROBE = Path(__file__).parents[2] / "fixtures" / "probe-h100-2026-11-26.json"
H100 = DeviceInfo.from_facts(json.loads(PROBE.read_text()))
LLAMA = resolve_model("meta-llama/Llama-3.2-1B").config
ADAPTER = lora_config(r=16, alpha=32, dropout=0.05, targets="all-linear", task="causal-lm")
REPORTED = TrialResult(
    status=Status.OK,
    trained_config=LLAMA | {"dtype": "float32"},
    trained_task="causal-lm",
    trained_seq_len=2048,
    peft_config=ADAPTER,
)
"""What a trial of a factory training Llama-3.2-1B with LoRA reports."""


@pytest.fixture
def plan(tmp_path):
    factory = tmp_path / "mine.py"
    factory.write_text("def make(args, model_kwargs):\n    raise NotImplementedError\n")
    # model= names a BERT: the factory's Llama is what trains.
    config = load_config(
        ["model=bert-base-uncased", f"trainer={factory}:make", f"out={tmp_path / 'out'}"]
    )
    return make_plan(config, H100)


def test_nothing_is_estimated_before_a_trial_of_the_factory_reports_its_model(plan):
    assert plan.estimate_gib(plan.baseline) is None
    untold = dataclasses.replace(REPORTED, trained_config=None)
    assert plan.estimate_gib(plan.baseline, untold) is None


def expected_gib(params, adapter=ADAPTER, seq_len=2048):
    found = estimate(LLAMA, task="causal-lm", seq_len=seq_len, params=params, device="cuda",
                     adapter=adapter)  # fmt: skip
    return pytest.approx(found.budgeted / 2**30)


def test_the_reported_model_is_estimated_with_its_adapter_at_its_longest_batch(plan):
    assert plan.estimate_gib(plan.baseline, REPORTED) == expected_gib(plan.baseline)
    shorter = dataclasses.replace(REPORTED, trained_seq_len=512)
    assert plan.estimate_gib(plan.baseline, shorter) == expected_gib(plan.baseline, seq_len=512)
    # A factory's full fine-tune of the same model: its gradients and Adam states besides.
    full = dataclasses.replace(REPORTED, peft_config=None)
    assert plan.estimate_gib(plan.baseline, full) == expected_gib(plan.baseline, adapter=None)


@pytest.mark.parametrize(
    ("stated", "knobs"),
    [
        ({"dtype": "bfloat16"}, {"torch_dtype": "bf16"}),
        ({"torch_dtype": "bfloat16"}, {"torch_dtype": "bf16"}),  # transformers 4's name
        ({"dtype": "bfloat16", "quantization_config": {"load_in_4bit": True}},
         {"torch_dtype": "bf16", "quantization": "nf4"}),
        ({"dtype": "float16", "quantization_config": {"load_in_8bit": True}},
         {"torch_dtype": "bf16", "quantization": "int8"}),  # fp16's bytes are bf16's
    ],
)  # fmt: skip
def test_the_base_is_estimated_in_the_dtype_and_quantization_its_config_states(plan, stated, knobs):
    reported = dataclasses.replace(REPORTED, trained_config=LLAMA | stated)
    found = plan.estimate_gib(plan.baseline, reported)
    assert found == expected_gib(plan.baseline | knobs)
    assert found < plan.estimate_gib(plan.baseline, REPORTED)
