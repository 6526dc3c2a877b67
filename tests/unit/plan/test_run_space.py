"""The space a run searches is refused for another device, and its rules split a fixed
effective batch between a trial's ranks; each problem joins the plan's."""

from __future__ import annotations

from autotune.common.placement import Placement
from autotune.plan.overrides import load_config
from autotune.plan.run_space import fitted_space, sampling_rules
from autotune.plan.space import SamplingRules
from tests.unit import installed
from tests.unit.stand_ins import GPUS


def test_a_space_for_another_device_is_a_problem_named_with_the_others():
    config = load_config(["model=gpt2", "space=cpu"])
    problems = ["an earlier problem"]
    facts = installed.software_facts()
    rules = SamplingRules()
    space = fitted_space(
        config, 1, "cuda", GPUS, facts, rules, "synthetic", [Placement()], problems
    )
    assert space is None
    assert problems == [
        "an earlier problem",
        "space=cpu is for device=cpu, but this search runs on cuda",
    ]


def test_the_effective_batch_is_split_between_a_trials_ranks():
    problems: list[str] = []
    even = load_config(["model=gpt2", "effective_batch_size=64"])  # a trial of 2 ranks
    rules = sampling_rules(even, 2, "cuda", GPUS, "synthetic", problems)
    assert (rules.effective_batch_size, rules.tokens_per_sample, problems) == (32, 512, [])
    odd = load_config(["model=gpt2", "effective_batch_size=7"])
    assert sampling_rules(odd, 2, "cuda", GPUS, "data", problems).effective_batch_size is None
    assert problems == [
        "effective_batch_size=7 does not split evenly between devices_per_trial=2 ranks"
    ]
