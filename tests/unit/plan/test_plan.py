"""The default CPU budget leaves room for the search, its fork servers and the machine; a
trial whose estimate is past what the machine can give is skipped before it starts."""

from __future__ import annotations

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError
from autotune.plan.overrides import load_config
from autotune.plan.plan import default_study_name, make_plan
from autotune.store.storage import heartbeat_interval_s
from autotune.study.checks import over_budget_by_estimate
from tests.conftest import TINY_MODEL
from tests.unit.stand_ins import CPU, GPUS, machine


def plan_on(device: DeviceInfo, *settings: str, tmp_path):
    config = load_config(["model=bert-large-uncased", "seq_len=512", f"out={tmp_path}", *settings])
    return make_plan(config, device)


def test_bert_large_at_512_on_a_24_gib_laptop_skips_the_baseline_the_kernel_would_kill(tmp_path):
    """Its baseline is estimated at 17.35 GiB (and peaked at 21.7 GiB when the kernel killed
    it). With 20 GiB free, all of it used to be the budget, and the limit 25% more: it ran."""
    plan = plan_on(machine(20), tmp_path=tmp_path)
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
    small = plan_on(machine(20), "memory_budget=8GiB", tmp_path=tmp_path)
    assert small.estimate_limit_gib == pytest.approx(10)
    assert small.estimate_limit_source == "memory_budget and estimate_margin allow"
    large = plan_on(machine(20), "memory_budget=15GiB", tmp_path=tmp_path)
    assert large.estimate_limit_gib == pytest.approx(16.35)  # not 18.75
    off = plan_on(machine(20), "estimate_margin=null", tmp_path=tmp_path)
    assert off.estimate_limit_gib is None  # skipping by estimate turned off stays off


def test_the_margin_on_a_gpu_is_not_capped_by_host_ram(tmp_path):
    plan = plan_on(machine(4, cuda=True), "memory_budget=40GiB", tmp_path=tmp_path)
    assert plan.estimate_limit_gib == pytest.approx(50)


def test_a_machine_with_nothing_left_for_a_trial_is_refused_unless_a_budget_is_given(tmp_path):
    with pytest.raises(ConfigError) as refused:
        plan_on(machine(1, total_gib=2), tmp_path=tmp_path)
    assert str(refused.value) == (
        "memory_budget: 1.00 GiB of RAM is available and a CPU search keeps 1.45 GiB for "
        "itself, its fork servers and the machine: nothing is left for a trial; free memory, "
        "use fewer workers, or give memory_budget= to take that risk"
    )
    assert plan_on(machine(1, 2), "memory_budget=1GiB", tmp_path=tmp_path).info


def test_a_default_study_name_stays_a_folder_inside_out(tmp_path, monkeypatch):
    nested = tmp_path / "models" / "inner"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    assert default_study_name("..", "cpu", 64) == "models-cpu-s64"
    assert default_study_name(".", "cpu", 64) == "inner-cpu-s64"
    long = default_study_name("org/" + "m" * 200, "cpu", 64)
    assert len(long) == 100 and long.endswith("-cpu-s64")


def test_the_memory_budget_is_what_every_worker_can_have(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    plan = make_plan(
        load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "device=cuda", "devices=0,1"]), GPUS
    )
    assert plan.info.memory_budget_bytes == 70 * 2**30  # the least free of their devices
    plan = make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "workers=4"]), CPU)
    # Their trials run at the same time; the search and 4 fork servers keep 3.5 GiB, and the
    # machine 10% of the 16 GiB of RAM the fake machine has available (its total unknown).
    assert plan.info.memory_budget_bytes == (2**34 - int(3.5 * 2**30) - int(0.1 * 2**34)) // 4


def test_workers_settings_are_checked_with_the_others():
    with pytest.raises(ConfigError) as error:
        load_config(["model=x", "workers=0", "devices=0,0", "stale_after=2s"])
    assert str(error.value).splitlines()[1:] == [
        "  - workers=0: expected auto or a number of processes, 1 or more",
        "  - devices=0,0: a device is named twice (each worker owns its own)",
        "  - stale_after=2s: at least 3s: heartbeats come once a second at most",
    ]
    assert heartbeat_interval_s(60) == 10 and heartbeat_interval_s(3) == 1


def test_a_missing_model_and_an_out_under_a_file_are_refused_before_the_device_is_probed(
    tmp_path, monkeypatch
):
    """Both need no device facts: they are named together, before the probe's seconds."""
    from autotune import api
    from autotune.plan import software_cache

    def probe():
        raise AssertionError("probed before refusing")

    monkeypatch.setattr(software_cache, "probe_device", probe)
    (tmp_path / "file").write_text("")
    config = load_config(["model=no-such-model", f"out={tmp_path / 'file' / 'reports'}"])
    with pytest.raises(ConfigError) as refused:
        api.run(config)
    problems = str(refused.value).splitlines()
    assert problems[0].startswith("model=no-such-model: not in the catalogue")
    assert problems[1] == (
        f"out={tmp_path / 'file' / 'reports'}: {tmp_path / 'file'} is not a folder, so no "
        "study folder can be made in it"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def test_an_out_this_user_cannot_write_into_is_refused_naming_the_folder(tmp_path, monkeypatch):
    import os

    from autotune.plan.plan import out_problems

    readable = tmp_path / "shared"
    readable.mkdir()
    # As root every folder is writable: the refusal is read from os.access, as a user meets it.
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != str(readable))
    assert out_problems(readable / "a" / "b") == [
        f"out={readable / 'a' / 'b'}: {readable} is not writable by this user, so no study "
        "folder can be made in it; use an out= folder of your own"
    ]
    assert out_problems(tmp_path / "mine") == []
