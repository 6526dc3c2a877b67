import re
from pathlib import Path

import pytest

from autotune.common.errors import ConfigError
from autotune.plan.config import RunConfig, help_rows, load_config


def test_overrides_are_typed_and_defaults_fill_the_rest():
    config = load_config(["model=gpt2", "n_trials=8", "timeout=1h30m", "memory_budget=24GiB"])
    assert config.model == "gpt2"
    assert config.n_trials == 8
    assert config.timeout == 5400.0
    assert config.memory_budget == 24 * 1024**3
    assert config.trial_timeout == 600.0
    assert config.storage is None


def test_numbers_given_for_string_keys_stay_strings():
    assert load_config(["model=gpt2", "study=2024"]).study == "2024"


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


def test_study_name_must_be_usable_as_a_folder():
    with pytest.raises(ConfigError, match="study=a/b"):
        load_config(["model=gpt2", "study=a/b"])


def test_help_lists_every_key_with_type_and_default():
    rows = {key: (kind, default) for key, kind, default, _ in help_rows()}
    assert set(rows) == set(RunConfig.model_fields)
    assert rows["n_trials"] == ("INT", "20")
    assert rows["device"] == ("auto|cuda|cpu", "auto")
    assert rows["timeout"] == ("DURATION", "null")
    assert rows["model"][1] == "required"


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


def test_the_readme_settings_table_is_the_one_search_help_prints():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme.split("| key | type | default | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:  # past the |---| line
        cells = [c.strip() for c in line.strip("|").replace("\\|", "\x00").split("|")]
        key, kind, default, meaning = (c.replace("\x00", "|") for c in cells)
        rows.append((key.strip("`"), kind.replace(" | ", "|"), default.strip("`"), meaning))
    assert rows == help_rows()
