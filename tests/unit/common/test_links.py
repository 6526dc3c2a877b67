"""The links between GPUs, read through a stand-in for NVML with pynvml's names and values:
an HGX board (NVSwitch), two PCIe cards joined by NVLink bridges, and PCIe cards alone."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from autotune.common.links import GpuLink, read_links, slowest


class NVMLError(Exception):
    """What pynvml raises, as NVMLError_NotSupported."""


@dataclass
class Pci:
    busId: bytes


@dataclass
class FakeNvml:
    """A host of GPUs: each its bus id, its NVLink links (far end's bus, NVML version), its
    PCIe link; the topology level and P2P between any two."""

    buses: list[str]
    nvlinks: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    level: int = 30
    p2p_read: bool = True
    p2p_nvlink: bool = False
    pcie: tuple[int, int] = (4, 16)
    asked: list[str] = field(default_factory=list)

    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetPciInfo(self, handle):
        return Pci(self.buses[handle].encode())

    def _link(self, handle, link):
        links = self.nvlinks.get(handle)
        if links is None:
            raise NVMLError("Not Supported")  # a GPU without NVLink
        if link >= len(links):
            return None
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle, link):
        return 1 if self._link(handle, link) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        return Pci(self._link(handle, link)[0].encode())

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        return self._link(handle, link)[1]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.level

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        ok = self.p2p_nvlink if index == self.NVML_P2P_CAPS_INDEX_NVLINK else self.p2p_read
        return 0 if ok else 4  # NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self.pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self.pcie[1]


def test_an_hgx_board_is_nvlink_4_through_its_switches_between_every_pair():
    gpus = [f"00000000:{bus:02X}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D)]
    switch = "00000000:C6:00.0"
    nvml = FakeNvml(
        buses=gpus,
        nvlinks={g: [(switch, 6)] * 18 for g in range(4)},  # 6: NVML_NVLINK_VERSION_4_0
        level=50,
        p2p_nvlink=True,
    )
    links = read_links(nvml, [0, 1, 2, 3])
    assert len(links) == 6  # every pair
    assert {(link.nvlinks, link.nvlink_generation, link.nvswitch) for link in links} == {
        (18, 4, True)
    }
    assert links[0].gb_s == 450
    assert links[0].describe() == "NVLink 4 x18 through an NVSwitch, 450 GB/s a direction"


def test_two_cards_bridged_by_nvlink_count_the_links_that_end_at_the_other():
    a, b, c = "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"
    nvml = FakeNvml(
        buses=[a, b, c],
        nvlinks={0: [(b, 4)] * 12, 1: [(a, 4)] * 12, 2: []},  # 4: NVLink 3.0 (A100)
        p2p_nvlink=True,
    )
    links = {(link.a, link.b): link for link in read_links(nvml, [0, 1, 2])}
    assert (links[0, 1].nvlinks, links[0, 1].nvlink_generation) == (12, 3)
    assert links[0, 1].describe() == "NVLink 3 x12, 300 GB/s a direction"
    # The third card has no bridge: PCIe alone, whatever NVML says of NVLink P2P.
    assert links[0, 2].nvlinks == 0 and links[1, 2].nvlinks == 0
    assert slowest(list(links.values()), [0, 1]) is links[0, 1]
    assert slowest(list(links.values()), [0, 1, 2]).nvlinks == 0


@pytest.mark.parametrize(
    ("p2p", "says"),
    [
        (True, "PCIe 4.0 x16 through a PCIe host bridge, P2P, 32 GB/s a direction"),
        (False, "PCIe 4.0 x16 through a PCIe host bridge, no P2P, 16 GB/s a direction"),
    ],
)
def test_pcie_cards_are_their_path_and_lanes_halved_without_p2p(p2p, says):
    nvml = FakeNvml(buses=["0000:01:00.0", "0000:02:00.0"], p2p_read=p2p)  # no NVLink at all
    (link,) = read_links(nvml, [0, 1])
    assert not link.nvlink and link.pcie_level == 30 and link.p2p is p2p
    assert link.describe() == says


def test_cuda_numbers_the_gpus_as_visible_devices_order_them():
    nvml = FakeNvml(
        buses=["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"],
        nvlinks={0: [], 1: [("0000:03:00.0", 6)] * 4, 2: [("0000:02:00.0", 6)] * 4},
    )
    (link,) = read_links(nvml, [2, 1])  # CUDA_VISIBLE_DEVICES=2,1: CUDA's 0 is NVML's 2
    assert (link.a, link.b, link.nvlinks) == (0, 1, 4)


def test_what_nvml_cannot_answer_stays_unknown():
    class Silent(FakeNvml):
        def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
            raise NVMLError("Not Supported")

        def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
            raise NVMLError("Not Supported")

    (link,) = read_links(Silent(buses=["0000:01:00.0", "0000:02:00.0"]), [0, 1])
    assert (link.pcie_generation, link.pcie_level, link.gb_s) == (None, None, None)
    assert link.describe() == "PCIe, P2P"


def test_a_link_survives_the_probes_json():
    link = GpuLink(a=0, b=1, nvlinks=18, nvlink_generation=4, nvswitch=True, p2p=True)
    from dataclasses import asdict

    assert GpuLink.from_facts(asdict(link)) == link
