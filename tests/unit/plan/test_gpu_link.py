"""The link between a trial's GPUs: in the plan's record (the slowest between the GPUs a worker
owns), a condition of the study on resume, stored only when known, and said in the report."""

from __future__ import annotations

import dataclasses
import sys

from autotune.common.links import GpuLink
from autotune.plan import conditions, hardware
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.run_info import RunInfo
from tests.conftest import TINY_MODEL
from tests.unit.common.test_links import FakeNvml
from tests.unit.stand_ins import GPUS

NVLINK = dict(nvlinks=12, nvlink_generation=3, p2p=True, pcie_level=10)
PCIE = dict(pcie_level=50, p2p=False, pcie_generation=4, pcie_width=16)
# Four GPUs: 0-1 and 2-3 bridged by NVLink, the pairs across sockets on PCIe alone.
LINKS = tuple(
    GpuLink(a=a, b=b, **(NVLINK if (a, b) in ((0, 1), (2, 3)) else PCIE))
    for a, b in ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
)
HOST = dataclasses.replace(GPUS, gpu_links=LINKS)


def plan(tmp_path, monkeypatch, *settings):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", *settings])
    return make_plan(config, HOST)


def test_a_trial_on_two_bridged_gpus_is_told_its_nvlink(tmp_path, monkeypatch):
    two = plan(tmp_path, monkeypatch, "workers=2")  # GPUs 0-1 and 2-3
    assert two.info.gpu_link == "NVLink 3 x12, 300 GB/s a direction"


def test_a_trial_across_the_bridges_goes_at_its_slowest_links_pace(tmp_path, monkeypatch):
    four = plan(tmp_path, monkeypatch, "devices_per_trial=4")
    assert four.info.gpu_link == "PCIe 4.0 x16 across NUMA nodes, no P2P, 16 GB/s a direction"


def test_one_gpu_a_trial_has_no_link_and_stores_none(tmp_path, monkeypatch):
    one = plan(tmp_path, monkeypatch)
    assert one.info.gpu_link is None
    assert "gpu_link" not in one.info.stored()  # as a study was stored before links were
    assert RunInfo.from_stored(one.info.stored()) == one.info


def test_a_worker_on_another_link_is_refused_as_another_gpu_would_be(tmp_path, monkeypatch):
    nvlink = plan(tmp_path, monkeypatch, "workers=2").info
    pcie = plan(tmp_path, monkeypatch, "devices_per_trial=4").info
    pcie = dataclasses.replace(pcie, devices_per_trial=2)  # the same ranks, other links
    (changed,) = conditions.changed_conditions(nvlink, pcie)
    assert changed.key == "gpu_link"
    # A study stored before links were compares nothing of them.
    assert conditions.changed_conditions(dataclasses.replace(nvlink, gpu_link=None), pcie) == []


def test_estimate_reads_the_link_from_nvml_without_torch(monkeypatch):
    class Host(FakeNvml):
        def nvmlInit(self):
            pass

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetCount(self):
            return len(self.buses)

    bridged = {0: [], 1: [("0000:03:00.0", 4)] * 12, 2: [("0000:02:00.0", 4)] * 12}
    nvml = Host(buses=["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"], nvlinks=bridged)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")  # the two bridged cards
    assert hardware.link_without_torch(2).describe() == "NVLink 3 x12, 300 GB/s a direction"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert hardware.link_without_torch(2).nvlinks == 0  # GPUs 0 and 1: PCIe
    assert hardware.link_without_torch(1) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1e2a3b")  # a UUID: NVML's order unknown
    assert hardware.link_without_torch(2) is None
