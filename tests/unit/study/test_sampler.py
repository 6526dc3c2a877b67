import optuna
import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.study.sampling.effects import EffectsSampler
from autotune.study.sampling.sampler import make_sampler
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False,
    name="cpu",
    total_memory_bytes=2**34,
    free_memory_bytes=2**34,
    cpu_name="cpu",
    host_available_memory_bytes=2**34,
)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("auto", EffectsSampler),
        ("effects", EffectsSampler),
        ("gp", optuna.samplers.GPSampler),
        ("tpe", optuna.samplers.TPESampler),
        ("nsga2", optuna.samplers.NSGAIISampler),
        ("random", optuna.samplers.RandomSampler),
        ("grid", optuna.samplers.GridSampler),
    ],
)
def test_sampler_choice(name, kind, tmp_path):
    plan = make_plan(
        load_config([f"model={TINY_MODEL}", f"sampler={name}", f"out={tmp_path}"]), CPU
    )
    assert isinstance(make_sampler(plan, seed=0), kind)


def test_grid_covers_every_parameter_the_space_suggests(tmp_path):
    plan = make_plan(load_config([f"model={TINY_MODEL}", "sampler=grid", f"out={tmp_path}"]), CPU)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=make_sampler(plan, seed=0)
    )
    seen = set()
    for _ in range(20):
        trial = study.ask()
        seen.add(str(plan.space.sample(trial, plan.rules)))
        study.tell(trial, [1.0, 1.0])
    assert len(seen) == 20  # a grid does not repeat itself


def test_gp_without_scipy_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    plan = make_plan(load_config([f"model={TINY_MODEL}", "sampler=gp", f"out={tmp_path}"]), CPU)
    with pytest.raises(ConfigError, match="sampler=gp needs scipy"):
        make_sampler(plan, seed=0)


def test_tpe_is_told_what_other_processes_are_running(tmp_path):
    plan = make_plan(load_config([f"model={TINY_MODEL}", "sampler=tpe", f"out={tmp_path}"]), CPU)
    assert make_sampler(plan, seed=0)._constant_liar
