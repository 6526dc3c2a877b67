"""The links between a host's GPUs, as NVML reports them: NVLink (its links and generation,
direct or through an NVSwitch) or PCIe (how far apart on the bus, and whether the GPUs may
reach each other's memory directly, peer to peer). What a gradient all-reduce, DataParallel's
scatter and gather, or tensor parallelism's per-layer all-reduces cost depends on it: the HF
multi-GPU guide measured 2-GPU DDP at 101 s with NVLink and 131 s without.

`read_links` asks NVML (the `pynvml` module, or a stand-in with its names) and is called by the
device probe; the rest reads its answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# NVML's topology levels (nvmlGpuTopologyLevel_t), nearest first, in words.
PCIE_PATHS = {
    0: "on one board",
    10: "behind one PCIe switch",
    20: "behind several PCIe switches",
    30: "through a PCIe host bridge",
    40: "across host bridges of one NUMA node",
    50: "across NUMA nodes",
}

NVLINK_GENERATIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
"""NVML's NVLink version (nvmlNvlinkVersion_t: 2.2 and 3.1 are revisions) -> the generation."""

NVLINK_GB_S_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0, 6: 100.0}
"""One link, one direction (GB/s), by generation: V100 has 6 links of NVLink 2 (150 GB/s a
direction), A100 12 of NVLink 3 (300), H100 18 of NVLink 4 (450), B200 18 of NVLink 5 (900)."""

PCIE_GB_S_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""One PCIe lane, one direction (GB/s), by generation."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuLink:
    """How two GPUs of the host (`a`, `b`: CUDA's indices in the probe) reach each other."""

    a: int
    b: int
    nvlinks: int = 0
    """Active NVLink links of `a` that carry its traffic to `b` (0: none)."""
    nvlink_generation: int | None = None
    nvswitch: bool = False
    """Through an NVSwitch (every GPU of an HGX board to every other): its links go to the
    switch, and carry its traffic to each GPU."""
    pcie_level: int | None = None
    """NVML's topology level between them (`PCIE_PATHS`); None when NVML did not say."""
    p2p: bool = False
    """Peer-to-peer reads between them allowed: without, NCCL copies through host memory."""
    pcie_generation: int | None = None
    pcie_width: int | None = None
    """The slower GPU's PCIe link as the GPU and its slot allow (generation, lanes): an idle
    GPU trains its link down, so the current one would tell the idle rate."""

    @property
    def nvlink(self) -> bool:
        return self.nvlinks > 0

    @property
    def gb_s(self) -> float | None:
        """What one direction carries (GB/s): NVLink's links at their generation's rate, or
        the PCIe link's lanes (half without P2P: each transfer crosses host memory); None when
        NVML did not say."""
        if self.nvlink:
            return self.nvlinks * NVLINK_GB_S_PER_LINK.get(self.nvlink_generation or 0, 25.0)
        if self.pcie_generation is None or self.pcie_width is None:
            return None
        lanes = PCIE_GB_S_PER_LANE.get(self.pcie_generation, 0.985) * self.pcie_width
        return lanes if self.p2p else lanes / 2

    def describe(self) -> str:
        """`NVLink 4 x18 through an NVSwitch, 450 GB/s a direction` or `PCIe 4.0 x16 through
        a PCIe host bridge, no P2P, 16 GB/s a direction` (the links' nominal rates)."""
        if self.nvlink:
            generation = f" {self.nvlink_generation}" if self.nvlink_generation else ""
            switch = " through an NVSwitch" if self.nvswitch else ""
            words = f"NVLink{generation} x{self.nvlinks}{switch}"
        else:
            bus = "PCIe"
            if self.pcie_generation and self.pcie_width:
                bus = f"PCIe {self.pcie_generation}.0 x{self.pcie_width}"
            path = "" if self.pcie_level is None else PCIE_PATHS.get(self.pcie_level, "")
            words = f"{f'{bus} {path}'.strip()}, {'P2P' if self.p2p else 'no P2P'}"
        if self.gb_s is not None:
            words += f", {self.gb_s:.0f} GB/s a direction"
        return words

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> GpuLink:
        return cls(**facts)


def slowest(links: Sequence[GpuLink], devices: Sequence[int]) -> GpuLink | None:
    """The slowest link between any two of `devices` (a ring all-reduce runs at its pace);
    None for fewer than two devices, or when the probe found none of their links."""
    wanted = {frozenset(pair) for pair in itertools.combinations(devices, 2)}
    among = [link for link in links if frozenset((link.a, link.b)) in wanted]
    if not among:
        return None
    return min(among, key=lambda link: (link.gb_s or 0.0, link.nvlinks))


def read_links(nvml: Any, nvml_indices: Sequence[int]) -> tuple[GpuLink, ...]:
    """Every pair's link among the GPUs CUDA numbers 0, 1, ... (NVML numbers them
    `nvml_indices`: CUDA_VISIBLE_DEVICES may reorder them), read through `nvml` (initialised
    by the caller). A question NVML cannot answer (an old driver, a GPU without NVLink) leaves
    its part unknown."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in nvml_indices]
    buses = [_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    outgoing = [_nvlinks(nvml, h) for h in handles]
    pcie = [_pcie(nvml, h) for h in handles]
    links = []
    for (a, ha), (b, hb) in itertools.combinations(enumerate(handles), 2):
        to_peer = [remote for remote in outgoing[a] if remote[0] == buses[b]]
        # On an NVSwitch board a GPU's links end at the switches (no GPU's bus), and reach
        # every GPU whose links do too.
        to_switch = [[r for r in outgoing[g] if r[0] not in buses] for g in (a, b)]
        nvswitch = (
            not to_peer and all(to_switch) and _p2p(nvml, ha, hb, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        )
        used = to_switch[0] if nvswitch else to_peer
        versions = [version for _, version in used if version]
        links.append(
            GpuLink(
                a=a,
                b=b,
                nvlinks=len(used),
                nvlink_generation=NVLINK_GENERATIONS.get(min(versions)) if versions else None,
                nvswitch=nvswitch,
                pcie_level=_ask(nvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb),
                p2p=_p2p(nvml, ha, hb, nvml.NVML_P2P_CAPS_INDEX_READ),
                pcie_generation=_least(g for g, _ in (pcie[a], pcie[b])),
                pcie_width=_least(w for _, w in (pcie[a], pcie[b])),
            )
        )
    return tuple(links)


def _nvlinks(nvml: Any, handle: Any) -> list[tuple[str, int | None]]:
    """The GPU's active NVLink links: (the PCI bus of the far end, NVML's version)."""
    found = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        if _ask(nvml.nvmlDeviceGetNvLinkState, handle, link) != nvml.NVML_FEATURE_ENABLED:
            continue
        remote = _ask(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        bus = _bus_id(remote.busId) if remote is not None else ""
        found.append((bus, _ask(nvml.nvmlDeviceGetNvLinkVersion, handle, link)))
    return found


def _pcie(nvml: Any, handle: Any) -> tuple[int | None, int | None]:
    return (
        _ask(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        _ask(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    )


def _p2p(nvml: Any, a: Any, b: Any, index: int) -> bool:
    return _ask(nvml.nvmlDeviceGetP2PStatus, a, b, index) == nvml.NVML_P2P_STATUS_OK


def _ask(question: Any, *args: Any) -> Any:
    """NVML's answer, None where it has none (NVMLError: not supported, no such link)."""
    try:
        return question(*args)
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses per code
        return None


def _least(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _bus_id(bus: bytes | str) -> str:
    """A PCI bus id in one spelling (`0000:3b:00.0`): NVML gives bytes or str, with 4- or
    8-digit domains (`00000000:3B:00.0`)."""
    text = (bus.decode() if isinstance(bus, bytes) else bus).lower()
    *domain, number, device = text.split(":")
    return f"{int(domain[-1] if domain else '0', 16):04x}:{number}:{device}"
