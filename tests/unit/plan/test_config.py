"""Each command's settings: closed, frozen, and text where text is expected."""

from __future__ import annotations

from autotune.plan.overrides import load_config


def test_numbers_given_for_string_keys_stay_strings():
    assert load_config(["model=gpt2", "study=2024"]).study == "2024"
