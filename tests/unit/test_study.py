import optuna
import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError
from autotune.common.knobs import at_least_as_hungry, baseline_params
from autotune.common.trial import Status, TrialResult
from autotune.plan.config import load_config
from autotune.plan.plan import make_plan
from autotune.search.checks import as_hungry_as_an_oom
from autotune.search.sampler import make_sampler
from autotune.store.records import TrialRecord
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


def test_settings_another_process_is_running_are_not_run_again():
    from autotune.store.records import NOT_RUN_ATTR, PARAMS_ATTR, is_interrupted

    study = optuna.create_study(directions=["maximize", "minimize"])
    theirs = study.ask()
    theirs.set_user_attr(PARAMS_ATTR, {"batch_size": 16, "precision": "bf16"})
    mine = study.ask()
    # The same settings in another key order are the same settings.
    same = not_to_run(study, mine, {"precision": "bf16", "batch_size": 16}, 10)
    assert same.same_as_running and same.reason == "trial 0 was running these settings"
    assert not_to_run(study, mine, {"precision": "fp32", "batch_size": 16}, 10) is None
    mine.set_user_attr(NOT_RUN_ATTR, same.reason)
    study.tell(mine, state=optuna.trial.TrialState.FAIL)
    # Ended without running on purpose: never mistaken for a trial a dead search left behind.
    assert not is_interrupted(study.trials[mine.number])


def test_of_two_retries_queued_at_once_the_earlier_runs_whichever_is_asked_first():
    from autotune.store.records import PARAMS_ATTR, RETRY_OF_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    settings = {"batch_size": 16}
    for _ in range(2):  # two processes found trial 5 dead and each queued its settings
        study.enqueue_trial({}, user_attrs={RETRY_OF_ATTR: 5})
    earlier, later = study.ask(), study.ask()
    for trial in (later, earlier):  # the later copy was asked for, and published, first
        trial.set_user_attr(PARAMS_ATTR, settings)
    assert not_to_run(study, later, settings, 10).reason.startswith(
        "trial 0 was queued for the same"
    )
    assert not_to_run(study, earlier, settings, 10) is None, "neither would run"


def test_trials_asked_for_earlier_go_first_up_to_n_trials():

    study = optuna.create_study(directions=["maximize", "minimize"])
    first, second, third = study.ask(), study.ask(), study.ask()
    # Two slots: the two smaller numbers run, the third was one too many.
    assert not_to_run(study, first, {"batch_size": 8}, 2) is None
    assert not_to_run(study, second, {"batch_size": 16}, 2) is None
    too_many = not_to_run(study, third, {"batch_size": 32}, 2)
    assert too_many.reason == "n_trials=2 were finished or running when it was asked for"
    assert not too_many.same_as_running
    study.tell(first, state=optuna.trial.TrialState.FAIL)  # interrupted: its slot is free again
    assert not_to_run(study, third, {"batch_size": 32}, 2) is None


def test_of_two_retries_queued_for_one_trial_only_the_first_runs():
    from autotune.store.records import RETRY_OF_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # trial 0, interrupted
    for _ in range(2):  # two processes recovering at the same moment each queue a retry
        study.enqueue_trial({}, user_attrs={RETRY_OF_ATTR: 0})
    first, second = study.ask(), study.ask()
    assert (first.number, second.number) == (1, 2)
    assert not_to_run(study, first, {"batch_size": 8}, 10) is None
    again = not_to_run(study, second, {"batch_size": 8}, 10)
    assert again.reason == "trial 1 was queued for the same: trial 0's settings again"


def test_of_two_baselines_queued_at_once_only_the_first_runs():
    from autotune.search.opening import enqueue_baseline
    from autotune.store.records import BASELINE_ATTR

    study = optuna.create_study(directions=["maximize", "minimize"])
    for _ in range(2):  # two workers starting on a new study at the same moment
        study.enqueue_trial({}, user_attrs={BASELINE_ATTR: True})
    enqueue_baseline(study, study.get_trials(deepcopy=False), {})  # one is queued: no third
    first, second = study.ask(), study.ask()
    assert not_to_run(study, first, {"batch_size": 8}, 10) is None
    again = not_to_run(study, second, {"batch_size": 8}, 10)
    assert again.reason == "trial 0 was queued for the same: the baseline"


def test_a_baseline_that_ran_out_of_host_memory_stands_for_hungrier_proposals():
    """The baseline sets knobs the space leaves out (attention, grad_accum) and leaves out
    some the space fixes (loader workers, at their HF default 0): its OOM still rules out
    every proposal at least as hungry, or the next proposal is hungrier still."""
    baseline = baseline_params("adamw_torch_fused", None)
    proposal = {"batch_size": 16, "gradient_checkpointing": False, "precision": "fp32",
                "optim": "adamw_torch_fused", "dataloader_num_workers": 0}  # fmt: skip
    died = [record(0, baseline, Status.HOST_OOM)]
    assert as_hungry_as_an_oom(proposal, died).reason.endswith("trial 0, which ran out of memory")
    for other in ({"batch_size": 4}, {"gradient_checkpointing": True}, {"optim": "sgd"},
                    {"attn_implementation": "eager"}, {"dataloader_num_workers": 2}):  # fmt: skip
        assert as_hungry_as_an_oom(proposal | other, died) is None, other  # lighter, or no order


def test_a_knob_without_effect_in_either_config_is_not_compared():
    oom = {**OOM, "gradient_checkpointing": True, "checkpointing_reentrant": True}
    assert at_least_as_hungry({**OOM, "batch_size": 64}, oom)  # checkpointing off: no reentrant


def not_to_run(study, trial, params, n_trials):
    from autotune.search.loop import _not_to_run

    return _not_to_run(trial, params, n_trials, study.get_trials(deepcopy=False))
