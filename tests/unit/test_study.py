import optuna
import pytest

from autotune.checks import as_hungry_as_an_oom
from autotune.config import load_config
from autotune.errors import ConfigError
from autotune.hardware import DeviceInfo
from autotune.knobs import at_least_as_hungry, baseline_params
from autotune.plan import make_plan
from autotune.records import TrialRecord
from autotune.study import make_sampler
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


def record(number, params, status):
    return TrialRecord(number=number, params=params, result=TrialResult(status=status))


def test_a_config_as_hungry_as_an_oom_is_skipped_naming_that_trial():
    records = [record(3, OOM, Status.ERROR), record(5, OOM, Status.OOM)]
    skip = as_hungry_as_an_oom({**OOM, "batch_size": 64}, records)
    assert skip.reason == "at least as memory-hungry as trial 5, which ran out of memory"
    assert skip.repeat_of is None  # recorded as skipped, not told as a repeat
    assert as_hungry_as_an_oom({**OOM, "batch_size": 8}, records) is None
    assert as_hungry_as_an_oom(OOM, [record(7, OOM, Status.HOST_OOM)]).reason.endswith(
        "trial 7, which ran out of memory"
    )


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


def test_tpe_is_told_what_other_processes_are_running(tmp_path):
    plan = make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}"]), CPU)
    assert make_sampler(plan, seed=0)._constant_liar


def test_settings_another_process_is_running_are_not_run_again():
    from autotune.records import PARAMS_ATTR, SAME_AS_RUNNING_ATTR, is_interrupted
    from autotune.study import _running_with

    study = optuna.create_study(directions=["maximize", "minimize"])
    theirs = study.ask()
    theirs.set_user_attr(PARAMS_ATTR, {"batch_size": 16, "precision": "bf16"})
    mine = study.ask()
    # The same settings in another key order are the same settings.
    assert _running_with(study, mine.number, {"precision": "bf16", "batch_size": 16}) == 0
    assert _running_with(study, mine.number, {"precision": "fp32", "batch_size": 16}) is None
    assert _running_with(study, theirs.number, {"batch_size": 16, "precision": "bf16"}) is None
    mine.set_user_attr(SAME_AS_RUNNING_ATTR, theirs.number)
    study.tell(mine, state=optuna.trial.TrialState.FAIL)
    # Ended without running on purpose: never mistaken for a trial a dead search left behind.
    assert not is_interrupted(study.trials[mine.number])
