"""The search refuses a model the installed transformers cannot build before any trial runs."""

from __future__ import annotations

import json

import pytest

from autotune.common.errors import ConfigError
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from tests.unit.stand_ins import CPU, plan_for


def test_a_config_of_an_unknown_model_type_is_refused_before_any_trial(tmp_path):
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bertt", "vocab_size": 8}))
    with pytest.raises(ConfigError, match=r"model_type 'bertt' is not one transformers 5.x knows"):
        make_plan(load_config([f"model={folder}", f"out={tmp_path}"]), CPU)
    with pytest.raises(ConfigError, match="transformers has no seq2seq head for bert models"):
        plan_for(tmp_path, "task=seq2seq")
