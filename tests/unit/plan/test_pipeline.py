"""`strategy=pp`: named in a space, it leaves it with the reason no Trainer path trains a
pipeline (its evidence: tests/integration/test_pipeline.py); never searched unnamed."""

from __future__ import annotations

import pytest

from autotune.common.errors import ConfigError
from autotune.common.knob_values import PIPELINE_REFUSAL
from autotune.common.models import resolve_model
from autotune.plan.estimate import estimate, shape_of
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from tests.conftest import TINY_MODEL
from tests.unit.stand_ins import GPUS


def plan_with(tmp_path, strategies: str):
    path = tmp_path / "mine.yaml"
    path.write_text(f"device: any\nknobs:\n  strategy: {{choices: {strategies}}}\n")
    config = load_config(
        [f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=2", f"space={path}"]
    )
    return make_plan(config, GPUS)


def test_pp_named_beside_ddp_leaves_the_space_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = plan_with(tmp_path, "[ddp, pp]")
    assert plan.space.knobs["strategy"].choices == ("ddp",)
    assert f"removed strategy=pp: {PIPELINE_REFUSAL}" in plan.space.notes


def test_pp_alone_is_a_space_that_cannot_run_and_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigError, match="strategy=pp: no Trainer path trains a pipeline"):
        plan_with(tmp_path, "[pp]")


def test_pp_is_not_searched_where_the_space_names_no_strategy(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=2"])
    plan = make_plan(config, GPUS)
    assert "pp" not in plan.space.knobs["strategy"].choices
    assert not any("strategy=pp" in note for note in plan.space.notes)


def test_the_estimate_says_what_a_pipelines_last_stage_would_hold():
    """Not trainable here, but `autotune estimate` answers what it would need: the last stage
    holds its ceil(layers / N) blocks and the LM head, and under GPipe every micro-batch's
    activations and logits (`grad_accum` of them)."""
    qwen = resolve_model("Qwen/Qwen2.5-7B").config
    shape = shape_of(qwen)

    def at(strategy, devices, **params):
        settings = {"strategy": strategy, "batch_size": 1, "precision": "bf16", **params}
        return estimate(
            qwen, task="causal-lm", seq_len=2048, params=settings, device="cuda", devices=devices
        )

    head = shape.vocab * shape.hidden
    block = (shape.parameters - head) // shape.layers
    pp4 = at("pp", 4)
    assert pp4.weights == 6 * (-(-shape.layers // 4) * block + head)  # 7 of 28 blocks, the head
    one = at("single", 1)
    assert pp4.activations == one.activations * 7 // 28 and pp4.logits == one.logits
    four_micro = at("pp", 4, grad_accum=4)
    assert four_micro.activations == 4 * pp4.activations and four_micro.logits == 4 * one.logits
