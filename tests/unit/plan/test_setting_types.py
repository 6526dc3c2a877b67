"""A setting's type checks its value, and says what it expects."""

from __future__ import annotations

import re

import pytest

from autotune.common.errors import ConfigError
from autotune.plan.config import EstimateConfig, RunConfig
from autotune.plan.overrides import load_config


def test_study_name_must_be_usable_as_a_folder():
    with pytest.raises(ConfigError, match="study=a/b"):
        load_config(["model=gpt2", "study=a/b"])


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("..", "not out= itself or its parent"),
        (".", "not out= itself or its parent"),
        ("a" * 101, "at most 100 characters (it has 101)"),
        ("../up", "letters, digits"),
    ],
)
def test_a_study_name_cannot_leave_the_out_folder(name, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(["model=gpt2", f"study={name}"])
    assert load_config(["model=gpt2", "study=" + "a" * 100]).study == "a" * 100


@pytest.mark.parametrize("schema", [RunConfig, EstimateConfig])
def test_a_zero_memory_budget_is_refused_not_taken_as_unset(schema: type) -> None:
    with pytest.raises(ConfigError, match="memory_budget=0"):
        load_config(["model=gpt2", "memory_budget=0"], schema)
