import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from autotune.errors import SpaceError
from autotune.space import load_space, parse_space, shipped_names


def test_shipped_spaces_load_into_optuna_distributions():
    assert {"cpu", "default"} <= set(shipped_names())
    cpu = load_space("cpu")
    assert cpu.device == "cpu"
    assert isinstance(cpu.distributions["batch_size"], CategoricalDistribution)
    assert cpu.fixed == {"dataloader_num_workers": 0}
    default = load_space("default")
    assert default.distributions["batch_size"] == IntDistribution(8, 128, step=8)
    for knob in ("batch_size", "grad_accum", "gradient_checkpointing", "precision", "optim"):
        assert knob in cpu.distributions and knob in default.distributions


def test_complete_merges_fixed_values_in_knob_order():
    space = load_space("cpu")
    params = space.complete({"optim": "sgd", "batch_size": 8})
    assert list(params) == ["batch_size", "optim", "dataloader_num_workers"]


def test_a_space_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("device: any\nknobs:\n  batch_size: {low: 8, high: 32, step: 8}\n")
    space = load_space(str(path))
    assert space.name == "mine"
    assert space.distributions["batch_size"] == IntDistribution(8, 32, step=8)


def test_every_mistake_in_a_space_is_reported():
    data = {
        "device": "tpu",
        "knobs": {
            "batch_size": {"choices": [8, "sixteen"]},
            "precision": {"choices": ["fp32", "fp8"]},
            "warp_drive": {"choices": [1]},
            "grad_accum": {"low": 4, "high": 2},
        },
    }
    with pytest.raises(SpaceError) as error:
        parse_space(data, name="bad", source="bad.yaml")
    message = str(error.value)
    assert "5 problem(s)" in message
    for part in (
        "device: 'tpu'",
        "'sixteen' is not a positive integer",
        "'fp8' is not one of",
        "knobs.warp_drive: unknown knob",
        "high (2) is below low (4)",
    ):
        assert part in message


def test_booleans_are_not_integers():
    with pytest.raises(SpaceError, match="True is not a positive integer"):
        parse_space({"knobs": {"batch_size": {"choices": [True, 8]}}}, name="x", source="x")


def test_unknown_shipped_name_lists_the_shipped_ones():
    with pytest.raises(SpaceError, match="choose one of cpu, default"):
        load_space("nope")
