import pytest

from autotune.common.knobs import is_compiled
from autotune.common.trial import Status, TrialResult
from autotune.common.trial_settings import baseline_params
from autotune.store.records import TrialRecord
from autotune.study.checks import (
    already_measured,
    as_hungry_as_an_oom,
    cannot_run_together,
    over_budget_by_estimate,
    over_time_by_pace,
)
from tests.unit.stand_ins import OOM


def record(number, params, status):
    return TrialRecord(number=number, params=params, result=TrialResult(status=status))


def test_settings_measured_with_a_knob_left_out_are_measured_at_its_value():
    """The baseline leaves `dataloader_num_workers` (and compile, ...) out: the same settings
    with them at what training then does were measured by it."""
    records = [record(0, baseline_params("adamw_torch_fused", None), Status.OK)]
    filled = {
        **baseline_params("adamw_torch_fused", None),
        "dataloader_num_workers": 0,
        "torch_compile": "off",
    }
    assert already_measured(filled, records).repeat_of.number == 0
    assert already_measured({**filled, "dataloader_num_workers": 2}, records) is None


def test_a_config_as_hungry_as_an_oom_is_skipped_naming_that_trial():
    records = [record(3, OOM, Status.ERROR), record(5, OOM, Status.OOM)]
    skip = as_hungry_as_an_oom({**OOM, "batch_size": 64}, records)
    assert skip.reason == "at least as memory-hungry as trial 5, which ran out of memory"
    assert skip.repeat_of is None  # recorded as skipped, not told as a repeat
    assert as_hungry_as_an_oom({**OOM, "batch_size": 8}, records) is None
    assert as_hungry_as_an_oom(OOM, [record(7, OOM, Status.HOST_OOM)]).reason.endswith(
        "trial 7, which ran out of memory"
    )


def test_a_baseline_that_ran_out_of_host_memory_stands_for_hungrier_proposals():
    """The baseline sets knobs the space leaves out (attention, grad_accum) and leaves out
    some the space fixes (loader workers, at their HF default 0): its OOM still rules out
    every proposal at least as hungry, or the next proposal is hungrier still."""
    baseline = baseline_params("adamw_torch_fused", None)
    proposal = {
        "batch_size": 16,
        "gradient_checkpointing": False,
        "precision": "fp32",
        "optim": "adamw_torch_fused",
        "dataloader_num_workers": 0,
    }
    died = [record(0, baseline, Status.HOST_OOM)]
    assert as_hungry_as_an_oom(proposal, died).reason.endswith("trial 0, which ran out of memory")
    for other in (
        {"batch_size": 4},
        {"gradient_checkpointing": True},
        {"optim": "sgd"},
        {"attn_implementation": "eager"},
        {"dataloader_num_workers": 2},
    ):
        assert as_hungry_as_an_oom(proposal | other, died) is None, other  # lighter, or no order


def test_the_estimate_check_skips_what_cannot_fit_and_says_why():
    check = over_budget_by_estimate(limit_gib=4.5)
    estimate = 32 / 8  # GiB, the estimate the loop computed for batch_size 32
    record = TrialRecord(
        number=1,
        params={"batch_size": 8},
        result=TrialResult(status=Status.OK, peak_memory_gib=2.0, estimate_gib=1.0),
    )
    assert check({"batch_size": 32}, [], estimate) is None, "4 GiB, not calibrated: runs"
    assert check({"batch_size": 32}, [record], None) is None, "no estimate: runs"
    skip = check({"batch_size": 32}, [record], estimate)
    assert skip is not None and skip.repeat_of is None
    assert skip.reason.startswith("estimated at 5.00 GiB (calibrated on 1 trial(s))")
    assert check({"batch_size": 16}, [record], 16 / 8) is None


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp_grad_op"])
def test_an_optimizer_that_cannot_step_shards_is_skipped_under_sharding_only(strategy):
    skip = cannot_run_together({"strategy": strategy, "optim": "adafactor"}, [])
    assert skip is not None and skip.repeat_of is None
    assert skip.reason == f"adafactor cannot update {strategy}'s sharded parameters (DTensors)"
    assert cannot_run_together({"strategy": "ddp", "optim": "adafactor"}, []) is None
    assert cannot_run_together({"strategy": strategy, "optim": "adamw_torch"}, []) is None


def test_ddp_static_graph_with_accumulation_is_skipped_naming_the_pytorch_bug():
    """DDP's reducer asserts on the first backward under the accumulation steps' no_sync()
    (pytorch/pytorch#143580), as a search on two ranks met it."""
    params = {"strategy": "ddp", "ddp_static_graph": True, "grad_accum": 2}
    skip = cannot_run_together(params, [])
    assert skip is not None and "pytorch/pytorch#143580" in skip.reason
    assert cannot_run_together({**params, "grad_accum": 1}, []) is None
    assert cannot_run_together({**params, "ddp_static_graph": False}, []) is None


def measured(number, params, samples_per_s, wall_s):
    return TrialRecord(
        number=number,
        params=params,
        result=TrialResult(status=Status.OK, samples_per_s=samples_per_s, wall_s=wall_s),
    )


def test_a_proposal_sure_to_pass_its_time_limit_is_skipped_with_the_pace_it_was_judged_at():
    """The H100's baseline: batch 8 fp32 at 39.4 samples/s in 22.0 s of 13 steps (19.4 s of
    start-up). fp32 at batch 2048 would need 13 x 2048 / 39.4 = 676 s of steps; bf16 at the
    same batch may run at up to 989/67 of fp32's pace (the datasheet peaks): it runs."""
    rates = {"fp32": 67.0, "bf16": 989.0}
    # trial_timeout 600 s, and compile_timeout 600 s more for a compiled trial.
    check = over_time_by_pace(lambda p: 600.0 + 600.0 * is_compiled(p), 13, rates.get)
    baseline = measured(0, {"batch_size": 8, "precision": "fp32"}, 39.4, 22.0)
    big = {"batch_size": 2048, "precision": "fp32"}
    skip = check(big, [baseline], None)
    assert skip.reason == (
        "would take at least 695 s, over its 600 s limit (trial_timeout): its 13 steps at the "
        "fastest pace measured (39.40 samples/s, from trial 0) and the trials' start-up"
    )
    assert skip.repeat_of is None
    assert check({**big, "precision": "bf16"}, [baseline], None) is None
    assert check({**big, "batch_size": 1024}, [baseline], None) is None  # 357 s: it may run
    assert check(big, [], None) is None, "no pace measured yet"
    compiled = {**big, "torch_compile": "inductor", "compile_mode": "default"}
    assert check(compiled, [baseline], None) is None, "compiling adds its own allowance"
