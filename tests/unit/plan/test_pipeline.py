"""`strategy=pp`: named in a space, it leaves it with the reason no Trainer path trains a
pipeline (its evidence: tests/integration/test_pipeline.py); never searched unnamed."""

from __future__ import annotations

import pytest

from autotune.common.errors import ConfigError
from autotune.common.knob_values import PIPELINE_REFUSAL
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
