"""The default CPU budget leaves room for the search, its fork servers and the machine; a
trial whose estimate is past what the machine can give is skipped before it starts."""

from __future__ import annotations

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError
from autotune.plan.config import load_config
from autotune.plan.plan import make_plan
from autotune.search.checks import over_budget_by_estimate

GIB = 2**30


def machine(available_gib: float, total_gib: float = 24, cuda: bool = False) -> DeviceInfo:
    available, total = int(available_gib * GIB), int(total_gib * GIB)
    return DeviceInfo(
        cuda_available=cuda, name="gpu" if cuda else "cpu", total_memory_bytes=80 * GIB,
        free_memory_bytes=80 * GIB if cuda else available, cpu_name="cpu",
        host_available_memory_bytes=available, host_total_memory_bytes=total,
        cuda_free_memory_bytes=(80 * GIB,) if cuda else (), cuda_device_names=("gpu",) * cuda,
    )  # fmt: skip


def test_the_default_cpu_budget_keeps_room_for_the_search_and_the_machine():
    # 0.5 GiB for the search, 0.75 GiB per fork server, 10% of the 24 GiB for the machine.
    name, one = machine(22).memory_for("cpu", workers=1)
    assert (name, one / GIB) == ("cpu", pytest.approx(22 - 0.5 - 0.75 - 2.4))
    two = machine(22).memory_for("cpu", workers=2)[1]
    assert two / GIB == pytest.approx((22 - 0.5 - 2 * 0.75 - 2.4) / 2)
    assert machine(22, cuda=True).memory_for("cuda", [0])[1] == 80 * GIB


def plan_for(device: DeviceInfo, *settings: str, tmp_path):
    config = load_config(["model=bert-large-uncased", "seq_len=512", f"out={tmp_path}", *settings])
    return make_plan(config, device)


def test_bert_large_at_512_on_a_24_gib_laptop_skips_the_baseline_the_kernel_would_kill(tmp_path):
    """Its baseline is estimated at 17.35 GiB (and peaked at 21.7 GiB when the kernel killed
    it). With 20 GiB free, all of it used to be the budget, and the limit 25% more: it ran."""
    plan = plan_for(machine(20), tmp_path=tmp_path)
    assert plan.info.memory_budget_gib == pytest.approx(20 - 3.65)
    assert plan.estimate_limit_gib == pytest.approx(20 - 3.65)  # no margin past the machine
    check = over_budget_by_estimate(plan.estimate_limit_gib, plan.estimate_limit_source)
    skip = check(plan.baseline, [], plan.estimate_gib(plan.baseline))
    assert skip is not None
    assert skip.reason == (
        "estimated at 17.35 GiB (not yet calibrated), over the 16.35 GiB this machine can "
        "give a trial (its free RAM less what the search keeps)"
    )


def test_an_explicit_budget_keeps_its_margin_up_to_what_the_machine_can_give(tmp_path):
    small = plan_for(machine(20), "memory_budget=8GiB", tmp_path=tmp_path)
    assert small.estimate_limit_gib == pytest.approx(10)
    assert small.estimate_limit_source == "memory_budget and estimate_margin allow"
    large = plan_for(machine(20), "memory_budget=15GiB", tmp_path=tmp_path)
    assert large.estimate_limit_gib == pytest.approx(16.35)  # not 18.75
    off = plan_for(machine(20), "estimate_margin=null", tmp_path=tmp_path)
    assert off.estimate_limit_gib is None  # skipping by estimate turned off stays off


def test_the_margin_on_a_gpu_is_not_capped_by_host_ram(tmp_path):
    plan = plan_for(machine(4, cuda=True), "memory_budget=40GiB", tmp_path=tmp_path)
    assert plan.estimate_limit_gib == pytest.approx(50)


def test_a_machine_with_nothing_left_for_a_trial_is_refused_unless_a_budget_is_given(tmp_path):
    with pytest.raises(ConfigError) as refused:
        plan_for(machine(1, total_gib=2), tmp_path=tmp_path)
    assert str(refused.value) == (
        "memory_budget: 1.00 GiB of RAM is available and a CPU search keeps 1.45 GiB for "
        "itself, its fork servers and the machine: nothing is left for a trial; free memory, "
        "use fewer workers, or give memory_budget= to take that risk"
    )
    assert plan_for(machine(1, 2), "memory_budget=1GiB", tmp_path=tmp_path).info
