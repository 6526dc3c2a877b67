"""Path-, name- and URL-typed settings are the literal string typed; YAML types the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli.estimate import parse as parse_estimate
from autotune.common.errors import ConfigError
from autotune.plan.config import (
    EstimateConfig,
    ExportConfig,
    ReportConfig,
    RunConfig,
    WorkerConfig,
    load_config,
    make_config,
)


def test_a_data_file_named_with_a_hash_is_that_file_not_a_yaml_comment() -> None:
    assert load_config(["model=gpt2", "data=#reviews.jsonl"]).data == "#reviews.jsonl"


def test_a_data_file_named_with_a_colon_is_that_file_not_a_mapping() -> None:
    assert load_config(["model=gpt2", "data=x: y.jsonl"]).data == "x: y.jsonl"


def test_a_newline_in_a_file_name_stays() -> None:
    config = load_config(["model=gpt2", "data=a\nb.jsonl", "tokenizer=./t\nok"])
    assert (config.data, config.tokenizer) == ("a\nb.jsonl", "./t\nok")


def test_names_and_urls_keep_what_yaml_would_retype() -> None:
    config = load_config([
        "model=1e3", "study=007", "storage=sqlite:///#x.db", "out=[a]", "space=yes",
        "text_column=01", "data_split=on", "data=d",
    ])  # fmt: skip
    assert (config.model, config.study, config.storage, config.out, config.space) == (
        "1e3",
        "007",
        "sqlite:///#x.db",
        Path("[a]"),
        "yes",
    )
    assert (config.text_column, config.data_split) == ("01", "on")


def test_null_still_means_unset_for_an_optional_string() -> None:
    config = load_config(["model=gpt2", "storage=null", "data=~", "study=null"])
    assert (config.storage, config.data, config.study) == (None, None, None)


def test_typed_settings_are_still_read_as_yaml() -> None:
    config = load_config(["model=gpt2", "n_trials=8", "quiet=true", "timeout=null",
                          "headroom=0.2", "workers=2"])  # fmt: skip
    assert (config.n_trials, config.quiet, config.timeout, config.headroom) == (8, True, None, 0.2)
    assert config.workers == 2


@pytest.mark.parametrize(
    ("schema", "overrides", "field", "expected"),
    [
        (WorkerConfig, ["study=007", "storage=sqlite:///#w.db"], "storage", "sqlite:///#w.db"),
        (WorkerConfig, ["out=#o"], "out", Path("#o")),
        (ExportConfig, ["study=#s", "trial=3"], "study", "#s"),
        (ReportConfig, ["storage=postgresql://u@h/d#x"], "storage", "postgresql://u@h/d#x"),
        (EstimateConfig, ["model=#m"], "model", "#m"),
    ],
)
def test_every_schema_takes_its_string_settings_literally(
    schema: type, overrides: list[str], field: str, expected: object
) -> None:
    assert getattr(load_config(overrides, schema), field) == expected


def test_estimate_knob_overrides_are_still_typed() -> None:
    config, knobs = parse_estimate(["model=#m", "precision=bf16", "gradient_checkpointing=true"])
    assert config.model == "#m"
    assert knobs == {"precision": "bf16", "gradient_checkpointing": True}


@pytest.mark.parametrize("schema", [RunConfig, EstimateConfig])
def test_a_zero_memory_budget_is_refused_not_taken_as_unset(schema: type) -> None:
    with pytest.raises(ConfigError, match="memory_budget=0"):
        load_config(["model=gpt2", "memory_budget=0"], schema)


@pytest.mark.parametrize(
    ("schema", "values", "key"),
    [
        (RunConfig, {"model": "gpt2", "seq_len": True}, "seq_len"),
        (RunConfig, {"model": "gpt2", "n_trials": True}, "n_trials"),
        (RunConfig, {"model": "gpt2", "seed": True}, "seed"),
        (RunConfig, {"model": "gpt2", "effective_batch_size": True}, "effective_batch_size"),
        (RunConfig, {"model": "gpt2", "memory_budget": True}, "memory_budget"),
        (RunConfig, {"model": "gpt2", "headroom": True}, "headroom"),
        (RunConfig, {"model": "gpt2", "trial_timeout": True}, "trial_timeout"),
        (EstimateConfig, {"model": "gpt2", "max_batch_size": True}, "max_batch_size"),
        (ExportConfig, {"trial": True}, "trial"),
    ],
)
def test_a_boolean_is_refused_for_a_number(schema: type, values: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key}=True: expected a number, not a boolean"):
        make_config(values, schema)
