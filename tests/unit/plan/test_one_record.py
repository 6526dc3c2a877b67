"""A study's settings have one record: once the plan is made, what the study is run for
(seq_len, its steps, its ranks, its budget's headroom, ...) is read from `plan.info`, the
`RunInfo` stored with the study, never from the `RunConfig` the run was started with, which
holds what this run does (n_trials, timeouts, workers) and may say `auto` where the plan
resolved it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from autotune.plan.config import RunConfig
from autotune.plan.run_info import RunInfo
from tests.unit.stand_ins import plan_for

PACKAGE = Path(__file__).resolve().parents[3] / "autotune"
SHARED = {f.name for f in dataclasses.fields(RunInfo)} & set(RunConfig.model_fields)
AFTER_THE_PLAN = ("study", "outputs", "execute")
"""The stages that are handed a plan: there every `config` is the plan's."""


def config_reads(source: str, bare_names: bool) -> list[str]:
    """The study's settings read off a config in `source`: `x.config.seq_len` anywhere, and
    with `bare_names` `config.seq_len` too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or node.attr not in SHARED:
            continue
        owner = node.value
        on_plan = isinstance(owner, ast.Attribute) and owner.attr == "config"
        bare = bare_names and isinstance(owner, ast.Name) and owner.id == "config"
        if on_plan or bare:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_the_shared_settings_are_the_ones_both_records_name():
    assert {"seq_len", "measure_steps", "warmup_steps", "devices_per_trial"} <= SHARED


def test_no_stage_reads_the_studys_settings_off_the_config():
    reads = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        after_plan = relative.parts[0] in AFTER_THE_PLAN
        if found := config_reads(path.read_text(), bare_names=after_plan):
            reads[str(relative)] = found
    assert reads == {}


def test_the_check_bites():
    assert config_reads("steps = plan.config.measure_steps", bare_names=False) == [
        "plan.config.measure_steps (line 1)"
    ]
    aliased = "config = plan.config\nspec = Spec(seq_len=config.seq_len)"
    assert config_reads(aliased, bare_names=True) == ["config.seq_len (line 2)"]
    assert config_reads(aliased, bare_names=False) == []  # plan/: `config` is the input
    assert config_reads("timeout = plan.config.trial_timeout", bare_names=True) == []


def test_the_plan_resolves_into_the_record_and_leaves_the_config_as_given(tmp_path):
    plan = plan_for(tmp_path, "warmup_steps=2", "measure_steps=5")
    assert plan.config.devices_per_trial == "auto"  # as the user gave it
    assert plan.info.devices_per_trial == plan.devices_per_trial == 1
    assert plan.trial_steps == 7
