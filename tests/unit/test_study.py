import csv
import sys
from pathlib import Path

import optuna
import pytest

from autotune import cli, runner
from autotune.config import load_config
from autotune.errors import ConfigError
from autotune.hardware import DeviceInfo
from autotune.plan import baseline_params, make_plan
from autotune.records import PARAMS_ATTR, RESULT_ATTR
from autotune.study import at_least_as_hungry, doomed_by, make_sampler
from autotune.trial import Status, TrialResult
from tests.conftest import TINY_MODEL

OOM = {"batch_size": 32, "gradient_checkpointing": False, "precision": "bf16", "optim": "sgd"}


@pytest.mark.parametrize(
    ("change", "hungry"),
    [
        ({}, True),
        ({"batch_size": 64}, True),
        ({"batch_size": 16}, False),
        ({"gradient_checkpointing": True}, False),
        ({"precision": "fp32"}, False),  # no safe order between precisions
        ({"optim": "adafactor"}, False),
    ],
)
def test_at_least_as_hungry_as_an_oom(change, hungry):
    assert at_least_as_hungry({**OOM, **change}, OOM) is hungry


def test_checkpointing_off_is_hungrier_than_an_oom_that_had_it_on():
    oom = {**OOM, "gradient_checkpointing": True}
    assert at_least_as_hungry({**OOM, "gradient_checkpointing": False, "batch_size": 48}, oom)


def frozen(number, params, status):
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        values=[0.0, 1.0],
        user_attrs={PARAMS_ATTR: params, RESULT_ATTR: TrialResult(status=status).to_dict()},
    )
    trial.number = number
    return trial


def test_doomed_by_names_the_oom_trial_and_ignores_other_failures():
    trials = [frozen(3, OOM, Status.ERROR), frozen(5, OOM, Status.OOM)]
    assert doomed_by({**OOM, "batch_size": 64}, trials).number == 5
    assert doomed_by({**OOM, "batch_size": 8}, trials) is None
    assert doomed_by(OOM, [frozen(7, OOM, Status.HOST_OOM)]).number == 7


def test_baseline_is_the_hf_defaults_at_the_fixed_effective_batch():
    assert baseline_params("adamw_torch_fused", None) == {
        "batch_size": 8,
        "grad_accum": 1,
        "gradient_checkpointing": False,
        "precision": "fp32",
        "optim": "adamw_torch_fused",
        "attn_implementation": "sdpa",
        "dataloader_num_workers": 0,
    }
    assert baseline_params("adamw_torch", 64)["grad_accum"] == 8
    fixed = baseline_params("adamw_torch", 12)
    assert fixed["batch_size"] * fixed["grad_accum"] == 12


CPU = DeviceInfo(
    cuda_available=False, name="cpu", total_memory_bytes=2**34, free_memory_bytes=2**34,
    cpu_name="cpu", host_available_memory_bytes=2**34,
)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("auto", optuna.samplers.TPESampler),
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


TWO_POINT_SPACE = """
description: a grid of two points
device: any
knobs:
  batch_size: {choices: [8, 16]}
  precision: fp32
  optim: sgd
"""


def test_a_grid_search_runs_every_point_then_stops(tmp_path, monkeypatch, capsys):
    fake = Path(__file__).parent / "fakes" / "worker.py"
    launcher = runner.CommandLauncher((sys.executable, str(fake), "ok"))
    monkeypatch.setattr(runner, "ForkserverLauncher", lambda: launcher)
    space = tmp_path / "two.yaml"
    space.write_text(TWO_POINT_SPACE)
    args = [f"model={TINY_MODEL}", "seq_len=32", "sampler=grid", "n_trials=6",
            f"space={space}", f"out={tmp_path}", "study=g"]  # fmt: skip
    assert cli.main(["search", *args]) == 0
    assert "search ended: every grid point has run: 3 trials finished" in capsys.readouterr().out
    with open(tmp_path / "g" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    # The baseline takes no grid point: both points run after it, once each.
    assert [r["baseline"] for r in rows] == ["True", "False", "False"]
    assert sorted(int(r["batch_size"]) for r in rows[1:]) == [8, 16]
    assert cli.main(["search", *args]) == 0  # resumed: nothing is left to run
    assert "every grid point has run: 3 trials finished" in capsys.readouterr().out
