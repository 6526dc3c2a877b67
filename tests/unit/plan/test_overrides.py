"""Overrides are typed as their settings need (path-, name- and URL-typed settings are the
literal string typed; YAML types the others), and every problem is named at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli.estimate import parse as parse_estimate
from autotune.common.errors import ConfigError
from autotune.plan.config import EstimateConfig, ExportConfig, ReportConfig, RunConfig, WorkerConfig
from autotune.plan.overrides import help_rows, load_config, make_config


def test_overrides_are_typed_and_defaults_fill_the_rest():
    config = load_config(["model=gpt2", "n_trials=8", "timeout=1h30m", "memory_budget=24GiB"])
    assert config.model == "gpt2"
    assert config.n_trials == 8
    assert config.timeout == 5400.0
    assert config.memory_budget == 24 * 1024**3
    assert config.trial_timeout == 600.0
    assert config.storage is None


def test_misspelt_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match="n_trails: unknown key; did you mean n_trials"):
        load_config(["model=gpt2", "n_trails=5"])


def test_bad_value_names_key_value_and_what_is_expected():
    with pytest.raises(ConfigError, match="n_trials=abc: expected a valid integer"):
        load_config(["model=gpt2", "n_trials=abc"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        load_config(["n_trails=5", "seq_len=-1", "timeout=soon", "memory_budget=lots", "oops"])
    message = str(error.value)
    assert message.startswith("6 problems")
    for part in (
        "n_trails: unknown key",
        "seq_len=-1",
        "timeout=soon: expected a duration",
        "memory_budget=lots: expected a size",
        "'oops': expected key=value",
        "model: required",
    ):
        assert part in message


def test_a_dotted_key_is_an_unknown_key_like_any_other():
    with pytest.raises(ConfigError, match=r"measure\.steps: unknown key"):
        load_config(["model=gpt2", "measure.steps=3"])


def test_a_key_given_twice_is_a_problem():
    with pytest.raises(ConfigError, match="seed: given more than once"):
        load_config(["model=gpt2", "seed=1", "seed=2"])


def test_help_lists_every_key_with_type_and_default():
    rows = {key: (kind, default) for key, kind, default, _ in help_rows()}
    assert set(rows) == set(RunConfig.model_fields)
    assert rows["n_trials"] == ("INT", "20")
    assert rows["device"] == ("auto|cuda|cpu", "auto")
    assert rows["timeout"] == ("DURATION", "null")
    assert rows["model"][1] == "required"


def test_the_documented_settings_table_is_the_one_search_help_prints():
    settings = (Path(__file__).parents[3] / "docs" / "settings.md").read_text()
    table = settings.split("| key | type | default | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:  # past the |---| line
        cells = [c.strip() for c in line.strip("|").replace("\\|", "\x00").split("|")]
        key, kind, default, meaning = (c.replace("\x00", "|") for c in cells)
        rows.append((key.strip("`"), kind.replace(" | ", "|"), default.strip("`"), meaning))
    assert rows == help_rows()


def test_a_data_file_named_with_a_hash_is_that_file_not_a_yaml_comment() -> None:
    assert load_config(["model=gpt2", "data=#reviews.jsonl"]).data == "#reviews.jsonl"


def test_a_data_file_named_with_a_colon_is_that_file_not_a_mapping() -> None:
    assert load_config(["model=gpt2", "data=x: y.jsonl"]).data == "x: y.jsonl"


def test_a_newline_in_a_file_name_stays() -> None:
    config = load_config(["model=gpt2", "data=a\nb.jsonl", "tokenizer=./t\nok"])
    assert (config.data, config.tokenizer) == ("a\nb.jsonl", "./t\nok")


def test_names_and_urls_keep_what_yaml_would_retype() -> None:
    config = load_config(
        [
            "model=1e3",
            "study=007",
            "storage=sqlite:///#x.db",
            "out=[a]",
            "space=yes",
            "text_column=01",
            "data_split=on",
            "data=d",
        ]
    )
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
    config = load_config(
        ["model=gpt2", "n_trials=8", "quiet=true", "timeout=null", "headroom=0.2", "workers=2"]
    )
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
