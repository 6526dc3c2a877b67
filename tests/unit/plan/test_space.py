import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotune.common.errors import SpaceError
from autotune.common.trial_settings import baseline_params
from autotune.plan.space import SamplingRules
from autotune.plan.space_file import SoftwareFacts, load_space, parse_space, shipped_names

FACTS = SoftwareFacts(
    optimizer_names=("adamw_torch", "adamw_torch_fused", "adafactor", "sgd"),
    compile_backends=("inductor", "cudagraphs", "eager"),
)


def sample(space, rules=None, seed=0):
    rules = rules or SamplingRules()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return space.sample(study.ask(), rules)


def test_shipped_spaces_are_listed_with_descriptions():
    assert {"cpu", "default", "memory", "quick"} <= set(shipped_names())
    for name in shipped_names():
        assert load_space(name).description


def test_ranges_expand_and_plain_values_fix_a_knob():
    space = load_space("default")
    assert space.knobs["batch_size"].choices == tuple(range(8, 257))
    assert space.knobs["batch_size"].is_range
    assert space.knobs["dataloader_num_workers"].choices == (0,)
    params = sample(space)
    assert params["dataloader_num_workers"] == 0
    assert params["batch_size"] % 8 == 0


def test_params_come_back_in_display_order():
    params = sample(load_space("cpu"))
    assert list(params)[:2] == ["batch_size", "grad_accum"]


def test_a_space_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("device: any\nknobs:\n  batch_size: {low: 8, high: 32, multiple_of: 8}\n")
    space = load_space(str(path))
    assert space.name == "mine"
    assert space.batch_candidates(None, SamplingRules()) == (8, 16, 24, 32)


def test_log_range_walks_powers_of_two():
    space = parse_space(
        {"knobs": {"batch_size": {"low": 8, "high": 100, "log": True}}}, name="x", source="x"
    )
    assert space.knobs["batch_size"].choices == (8, 16, 32, 64)


def test_conditions_activate_a_knob_only_when_they_hold():
    data = {
        "knobs": {
            "torch_compile": {"choices": ["off", "inductor"]},
            "compile_mode": {
                "choices": ["default", "max-autotune"],
                "when": {"torch_compile": {"not": "off"}},
            },
        }
    }
    space = parse_space(data, name="x", source="x", facts=FACTS)
    seen = [sample(space, seed=s) for s in range(30)]
    assert all(("compile_mode" in p) == (p["torch_compile"] != "off") for p in seen)
    assert {p["torch_compile"] for p in seen} == {"off", "inductor"}


def test_yaml_off_means_no_compile():
    space = parse_space({"knobs": {"torch_compile": False}}, name="x", source="x", facts=FACTS)
    assert space.knobs["torch_compile"].choices == ("off",)


def test_effective_batch_derives_grad_accum_and_skips_non_divisors():
    space = parse_space(
        {
            "knobs": {
                "batch_size": {"choices": [8, 16, 24, 32, 64]},
                "grad_accum": {"choices": [1, 2]},
            }
        },
        name="x",
        source="x",
    )
    rules = SamplingRules(effective_batch_size=32)
    assert space.batch_candidates(None, rules) == (8, 16, 32)
    for seed in range(20):
        params = sample(space, rules, seed)
        assert params["batch_size"] * params["grad_accum"] == 32


def test_auto_gives_16_bit_batches_that_tile_the_tokens_by_64_on_tensor_core_gpus_only():
    space = load_space("default")
    odd = SamplingRules(tensor_core_64=True, tokens_per_sample=511)
    assert space.batch_candidates("bf16", odd) == (64, 128, 192, 256)
    assert space.batch_candidates("fp16+tf32", odd) == (64, 128, 192, 256)
    assert space.batch_candidates("fp32", odd)[:3] == (8, 16, 24)
    hundred = SamplingRules(tensor_core_64=True, tokens_per_sample=100)
    assert space.batch_candidates("bf16", hundred)[:3] == (16, 32, 48)
    for tokens in (512, 128):  # every batch of 8 already gives 64-row multiples
        rules = SamplingRules(tensor_core_64=True, tokens_per_sample=tokens)
        assert space.batch_candidates("bf16", rules)[:3] == (8, 16, 24)
    varying = SamplingRules(tensor_core_64=True)  # the user's data: lengths vary
    assert space.batch_candidates("bf16", varying)[:3] == (8, 16, 24)
    no_tensor_cores = SamplingRules(tokens_per_sample=511)
    assert space.batch_candidates("bf16", no_tensor_cores)[:3] == (8, 16, 24)


def test_small_batches_only_when_listed():
    memory = load_space("memory")
    assert memory.batch_candidates("bf16", SamplingRules())[:3] == (1, 2, 4)
    ranged = parse_space({"knobs": {"batch_size": {"low": 1, "high": 16}}}, name="x", source="x")
    assert ranged.batch_candidates(None, SamplingRules()) == (8, 16)


def test_every_mistake_in_a_file_is_reported_with_its_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "device: cuda\n"
        "knobs:\n"
        "  precision: {choices: [fp32, fp4]}\n"
        "  batch_size: {choices: [8, 12]}\n"
        "  optim: {choices: [adamw_torh]}\n"
        "  compile_mode: {choices: [default], when: {torch_compile: inductor}}\n"
        "  warp_drive: {choices: [1]}\n"
        "  grad_accum: {choices: []}\n"
    )
    with pytest.raises(SpaceError) as error:
        load_space(str(path), FACTS)
    message = str(error.value)
    for part in (
        f"{path}:3: knobs.precision: 'fp4' is not one of",
        f"{path}:4: knobs.batch_size: batch size 12 breaks the rule",
        f"{path}:5: knobs.optim: 'adamw_torh' is not a TrainingArguments.optim name here; "
        "did you mean adamw_torch?",
        f"{path}:6: knobs.compile_mode: when: torch_compile is not in this space",
        f"{path}:7: knobs.warp_drive: unknown knob",
        f"{path}:8: knobs.grad_accum: choices must be a non-empty list",
    ):
        assert part in message


def test_broken_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("knobs:\n  batch_size: [8\n")
    with pytest.raises(SpaceError, match=r"broken\.yaml:3: not valid YAML"):
        load_space(str(path))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"batch_size": {"choices": [True, 8]}}, "True is not a positive integer"),
        ({"batch_size": {"low": 8, "high": 48, "multiple_of": "auto"}}, "needs a multiple of 64"),
        ({"grad_accum": {"low": 4, "high": 2}}, "high (2) is below low (4)"),
        ({"precision": {"low": 1, "high": 2}}, "expected `choices: [...]` or a single value"),
        (
            {"optim": {"choices": ["sgd"], "multiple_of": 8}},
            "multiple_of applies to batch_size only",
        ),
        ({"grad_accum": {"choices": [1, 1]}}, "choices repeat a value"),
        (
            {"batch_size": 8, "compile_mode": {"choices": ["default"], "when": {"batch_size": 16}}},
            "is chosen after compile_mode",
        ),
        (
            {
                "torch_compile": "off",
                "compile_mode": {"choices": ["default"], "when": {"torch_compile": "inductor"}},
            },
            "no value of torch_compile (off) satisfies it",
        ),
    ],
)
def test_rule_violations_and_impossible_conditions(knobs, message):
    with pytest.raises(SpaceError) as error:
        parse_space({"knobs": knobs}, name="x", source="x", facts=FACTS)
    assert message in str(error.value)


def test_unknown_shipped_name_lists_the_shipped_ones():
    with pytest.raises(SpaceError, match="choose one of cpu, data, default"):
        load_space("nope")


def test_the_baseline_as_optuna_parameters_uses_the_spaces_own_distributions():
    baseline = baseline_params("adamw_torch_fused", None, own_data=True)
    found = load_space("memory").optuna_params(baseline, SamplingRules())
    # fp32 is no choice of this space: Optuna holds one distribution per name, so it is left out.
    assert "precision" not in found
    assert found["batch_size"] == (CategoricalDistribution((1, 2, 4, 8, 16)), 8)
    assert found["optim"][1] == "adamw_torch_fused"
    # A knob the space fixes is never suggested: a one-value distribution cannot clash.
    assert found["dataloader_num_workers"] == (CategoricalDistribution((0,)), 0)
    # The space fixes checkpointing on; the baseline's off is a parameter of its own.
    assert found["gradient_checkpointing"] == (CategoricalDistribution((False,)), False)


def test_a_knob_given_twice_in_a_space_file_is_refused_naming_both_lines(tmp_path):
    """YAML keeps the last silently: the knob edited in one place would run from the other."""
    path = tmp_path / "twice.yaml"
    path.write_text(
        "device: any\nknobs:\n  batch_size: {choices: [8]}\n  optim: sgd\n"
        "  batch_size: {choices: [16]}\n"
    )
    with pytest.raises(SpaceError) as refused:
        load_space(str(path))
    assert str(refused.value) == (
        f"{path}:5: knobs.batch_size: given twice (first on line 3); keep one"
    )


def test_a_space_too_large_to_enumerate_draws_the_settings_it_is_given_first():
    """A space of more settings than the limit is searched over a random sample; settings the
    sample must hold (the baseline's: the model's first measurement) are drawn into it, where
    they are settings of the space."""
    import numpy as np

    knobs = {
        "batch_size": {"choices": [8, 16, 32, 64]},
        "optim": {"choices": ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd"]},
        "gradient_checkpointing": {"choices": [False, True]},
    }
    space = parse_space({"knobs": knobs}, name="s", source="s", facts=FACTS)
    rules = SamplingRules()
    wanted = {"batch_size": 8, "gradient_checkpointing": False, "optim": "sgd"}
    elsewhere = {**wanted, "batch_size": 12}  # no batch of this space
    for seed in range(5):
        rng = np.random.default_rng(seed)
        drawn = space.points(rules, limit=3, rng=rng, first=[wanted, elsewhere])
        assert len(drawn) == 3 and drawn[0][0] == wanted
        assert drawn[0][1] == {"batch_size": 8, "optim": "sgd", "gradient_checkpointing": False}
        assert all(params != elsewhere for params, _ in drawn)


def test_a_space_nested_past_the_parser_or_the_cap_is_refused_in_one_line(tmp_path):
    """A hostile space file ends in one SpaceError (exit 2), not a RecursionError traceback."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("knobs:\n  batch_size: " + "[" * 1500 + "]" * 1500 + "\n")
    with pytest.raises(SpaceError, match="nested too deep for the YAML parser"):
        load_space(str(deep))
    deeper = tmp_path / "deeper.yaml"
    deeper.write_text("knobs:\n  batch_size: " + "[" * 200 + "8" + "]" * 200 + "\n")
    with pytest.raises(SpaceError, match=r"deeper.yaml:2: nested more than 16 levels deep"):
        load_space(str(deeper))


def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path):
    """Nine aliases of ten, 10^9 leaves once followed: refused from the composed document at
    the cap (100,000), at once, in constant memory."""
    lines = ["a: &a [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nknobs:\n  batch_size:\n    choices: [*i]\n")
    with pytest.raises(SpaceError, match="expands to more than 100,000 values"):
        load_space(str(bomb))


def test_a_choice_that_is_a_list_and_a_range_too_long_are_refused_by_size_not_by_value():
    with pytest.raises(SpaceError, match=r"choices must be values .* item 2 is a list"):
        parse_space({"knobs": {"batch_size": {"choices": [8, [16, 32]]}}}, name="t", source="t")
    with pytest.raises(SpaceError, match=r"is 1,000,000,001 values; a range may have 10,000"):
        parse_space(
            {"knobs": {"batch_size": {"low": 0, "high": 10**12, "step": 1000}}},
            name="t",
            source="t",
        )


def test_a_file_of_many_bad_choices_lists_the_first_and_counts_the_rest():
    facts = SoftwareFacts(optimizer_names=("adamw_torch", "adafactor"))
    data = {"knobs": {"optim": {"choices": [f"bogus{i}" for i in range(5000)]}}}
    with pytest.raises(SpaceError) as refused:
        parse_space(data, name="big", source="big.yaml", facts=facts)
    lines = str(refused.value).splitlines()
    assert lines[0] == "5,000 problem(s) in big.yaml:"
    assert len(lines) == 1 + 30 + 1
    assert lines[1] == "  - big.yaml: 'bogus0' is not a TrainingArguments.optim name here"
    assert lines[-1] == "  - ... and 4,970 more: fix these 30 and validate again"
    close = {"knobs": {"optim": {"choices": ["adamw_troch"]}}}
    with pytest.raises(SpaceError, match="did you mean adamw_torch"):
        parse_space(close, name="close", source="close.yaml", facts=facts)
