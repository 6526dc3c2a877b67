"""Device facts as both sides see them: `DeviceInfo` (what the probe found), the GPUs' peak
rates, and the host RAM a CPU search keeps for itself. The probe that fills `DeviceInfo` runs
in a child process (`autotune.child.probe`); `autotune.plan.hardware` starts it.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.common.errors import DeviceError
from autotune.common.knob_values import TRANSFORMERS_DEFAULT_OPTIM, precision_parts, sixteen_bit
from autotune.common.links import GpuLink, slowest

MIB = 2**20


SEARCH_RESERVE_BYTES = 512 * MIB
"""Host RAM kept for the search process on CPU (0.1 GiB measured; more while it writes the
report)."""


FORK_SERVER_RESERVE_BYTES = 768 * MIB
"""Host RAM kept for each worker's fork server, which holds torch and transformers (0.45 GiB
measured)."""


MACHINE_RESERVE_SHARE = 0.10
"""Share of the host's RAM kept for the rest of the machine and for what a trial grows
between two looks of the watchdog: past the budget the watchdog ends the trial, past the
machine's RAM the kernel's OOM killer does, sometimes to the search itself."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    cuda_available: bool
    name: str
    """The CUDA device's name, or the CPU model on a machine without CUDA."""
    total_memory_bytes: int
    free_memory_bytes: int
    """What a trial can use now: free GPU memory, or available host RAM."""
    compute_capability: str | None = None
    bf16_supported: bool = False
    tf32_supported: bool = False
    torch_version: str = ""
    transformers_version: str = ""
    cpu_name: str = ""
    host_available_memory_bytes: int = 0
    host_total_memory_bytes: int = 0
    bitsandbytes_error: str | None = None
    """Why `import bitsandbytes` failed; None when it imports."""
    deepspeed_error: str | None = None
    """Why `import deepspeed` failed (the optional extra); None when it imports."""
    torchao_error: str | None = None
    """Why torchao's low-bit optimizers do not import (the optional extra); None when they do."""
    flash_attn_error: str | None = "not probed"
    """Why `import flash_attn` (FlashAttention 2) failed; None when it imports."""
    flash_attn_3_error: str | None = "not probed"
    """Why `import flash_attn_interface` (FlashAttention 3) failed; None when it imports."""
    liger_error: str | None = "not probed"
    """Why `import liger_kernel` failed; None when it imports."""
    liger_model_types: tuple[str, ...] = ()
    """The model types Liger's kernels patch."""
    tp_model_types: tuple[str, ...] = ()
    """The model types whose config carries a tensor-parallel plan (`base_model_tp_plan`) in
    the installed transformers: those `strategy=tp` can split."""
    compile_backends: tuple[str, ...] = ()
    """`torch.compile` backends this torch offers (`torch._dynamo.list_backends`)."""
    training_argument_fields: tuple[str, ...] = ()
    """The installed transformers' `TrainingArguments` fields: the knobs' arguments are named
    by them (`knobs.training_args`); empty where the probe did not read them."""
    optimizer_names: tuple[str, ...] = ()
    """Values `TrainingArguments.optim` accepts in the installed transformers."""
    default_optim: str = TRANSFORMERS_DEFAULT_OPTIM
    """`TrainingArguments().optim` in the installed transformers: the baseline's optimizer
    (the probe reads it)."""
    model_types: tuple[str, ...] = ()
    """`model_type` values the installed transformers can build."""
    task_model_types: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Task -> the model types with that head in the installed transformers."""
    cuda_device_names: tuple[str, ...] = ()
    """Every visible CUDA device's name, in CUDA's order (device 0 is `name`)."""
    cuda_free_memory_bytes: tuple[int, ...] = ()
    """Free memory on each visible CUDA device."""
    matmul_tflops: float | None = None
    """On CPU, the fp32 matmul rate the probe measured (TFLOP/s); None on CUDA, whose peak is
    in PEAK_TFLOPS."""
    gpu_links: tuple[GpuLink, ...] = ()
    """How each pair of visible GPUs reach each other (NVLink or PCIe), as NVML told the probe;
    empty with one GPU, or where NVML could not say (`gpu_links_error`)."""
    gpu_links_error: str | None = None
    """Why the probe could not read the links (NVML missing or failing); None otherwise."""

    def link_between(self, devices: Sequence[int]) -> GpuLink | None:
        """The slowest link among these GPUs (a ring all-reduce goes at its pace); None for
        one GPU, or links not probed."""
        return slowest(self.gpu_links, devices)

    def compute_tflops(self, device: str, precision: str) -> float | None:
        """The fastest a training step can compute here (TFLOP/s): the GPU's datasheet peak
        for the precision, or the CPU's measured matmul rate; None when unknown."""
        if device == "cuda":
            return peak_tflops(self.name, precision)
        return self.matmul_tflops

    def capability_at_least(self, major: int, minor: int = 0) -> bool:
        """A CUDA device of this compute capability or newer (False without one)."""
        if self.compute_capability is None:
            return False
        return tuple(int(p) for p in self.compute_capability.split(".")) >= (major, minor)

    @property
    def tensor_core_64(self) -> bool:
        """A100/H100-class GPU (compute capability 8.0, 9.0, 10.0): 16-bit matmuls tile best
        with dimensions in multiples of 64. The x.6/x.9 parts (A10G, L4, RTX) are not."""
        if self.compute_capability is None:
            return False
        major, minor = (int(p) for p in self.compute_capability.split("."))
        return major >= 8 and minor == 0

    def resolve(self, requested: str) -> str:
        """`auto` -> cuda when present; refuses `cuda` on a machine without it."""
        if requested == "cuda" and not self.cuda_available:
            raise DeviceError(
                "device=cuda: no CUDA device is visible to PyTorch here; use device=cpu or auto"
            )
        if requested == "auto":
            return "cuda" if self.cuda_available else "cpu"
        return requested

    def memory_for(
        self, device: str, cuda_indices: Sequence[int] = (), workers: int = 1
    ) -> tuple[str, int]:
        """(device name, bytes a trial may use) for the resolved device, shared by `workers`
        (on CUDA, those on `cuda_indices`): on CUDA the least free of their devices, on CPU an
        equal share of the RAM available less what the search, its fork servers and the machine
        need (`cpu_budget_bytes`; their trials run at the same time)."""
        if device == "cuda":
            free = self.cuda_free_memory_bytes
            chosen = list(cuda_indices)
            if free and chosen and all(i < len(free) for i in chosen):
                return self.cuda_device_names[chosen[0]], min(free[i] for i in chosen)
            return self.name, self.free_memory_bytes
        budget = cpu_budget_bytes(
            self.host_available_memory_bytes, self.host_total_memory_bytes, max(1, workers)
        )
        return self.cpu_name, budget

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> DeviceInfo:
        """From the probe's JSON (lists become tuples)."""
        facts = dict(facts)
        facts["task_model_types"] = {k: tuple(v) for k, v in facts["task_model_types"].items()}
        facts["gpu_links"] = [GpuLink.from_facts(link) for link in facts.get("gpu_links", [])]
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in facts.items()})


# Dense peak TFLOP/s (no 2:4 sparsity) from NVIDIA datasheets and whitepapers, keyed by a
# piece of the NVML name; the first match wins, so specific names come first. GeForce parts
# accumulate 16-bit matmuls in fp32 at half rate: that rate is the one PyTorch gets.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "16bit": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "16bit": 835.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "16bit": 989.4}),
    ("H200", {"fp32": 66.9, "tf32": 494.7, "16bit": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "16bit": 312.0}),
    ("A10G", {"fp32": 31.2, "tf32": 62.5, "16bit": 125.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "16bit": 362.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "16bit": 121.0}),
    ("V100-PCIE", {"fp32": 14.0, "tf32": 14.0, "16bit": 112.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "16bit": 125.0}),
    ("T4", {"fp32": 8.1, "tf32": 8.1, "16bit": 65.0}),
    ("TITAN RTX", {"fp32": 16.3, "tf32": 16.3, "16bit": 130.5}),
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "16bit": 71.0}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "16bit": 165.2}),
)


GPU_MEMORY_MIB: tuple[tuple[str, int], ...] = (
    ("H200", 143_771), ("H100", 81_559), ("A100-80GB", 81_920), ("A100-SXM4-80GB", 81_920),
    ("A100 80GB", 81_920), ("A100", 40_960),
    ("L40S", 46_068), ("L4", 23_034), ("A10G", 23_028), ("V100-32GB", 32_510),
    ("V100-SXM2-32GB", 32_510), ("V100", 16_160), ("T4", 15_360), ("TITAN RTX", 24_576),
    ("RTX 3090", 24_576), ("RTX 4090", 24_564),
)  # fmt: skip
"""Total memory (nvidia-smi's MiB) of the GPUs `autotune estimate gpu=NAME` (and the GPU twin)
plans for without one in hand, keyed by a piece of the name (as users write it, and as NVML
reports it: `NVIDIA A100-SXM4-80GB`); the first match wins, so specific names come first."""


def gpu_memory_bytes(name: str) -> int | None:
    """A GPU's total memory by (a piece of) its name; None for one not in the table."""
    for piece, mib in GPU_MEMORY_MIB:
        if _names(piece, name):
            return mib * 2**20
    return None


def _names(piece: str, name: str) -> bool:
    """Whether `name` holds `piece`, whatever the case, spaces and hyphens (`RTX4090`, `RTX
    4090`, `NVIDIA GeForce RTX 4090`)."""
    return bare_name(piece) in bare_name(name)


def bare_name(name: str) -> str:
    """A GPU's name without case, spaces or hyphens: `RTX 4090` and `rtx-4090` are one."""
    return re.sub(r"[\s-]", "", name).lower()


def tensor_peak_tflops(device_name: str) -> float | None:
    """The device's dense 16-bit tensor-core peak: the one denominator of every trial's MFU,
    whatever its precision, so that trials compare (an fp32 trial at 60% of fp32's peak is
    7x slower than a bf16 one at 36% of this); None for a device not in the table."""
    return peak_tflops(device_name, "bf16")


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak for the precision in use, or None for a device not in the table."""
    key = (
        "16bit"
        if sixteen_bit(precision)
        else "tf32"
        if "tf32" in precision_parts(precision)
        else "fp32"
    )
    for piece, peaks in PEAK_TFLOPS:
        if _names(piece, device_name):
            return peaks[key]
    return None


def cpu_reserve_bytes(total_bytes: int, workers: int = 1) -> int:
    """Host RAM a CPU search keeps out of its trials' budget: the search process, each
    worker's fork server, and a share of the machine's RAM."""
    return (
        SEARCH_RESERVE_BYTES
        + FORK_SERVER_RESERVE_BYTES * workers
        + int(MACHINE_RESERVE_SHARE * total_bytes)
    )


def cpu_budget_bytes(available_bytes: int, total_bytes: int, workers: int = 1) -> int:
    """The default memory budget of each of `workers` trials on CPU: the RAM available now
    less `cpu_reserve_bytes` (of the total, or of the available RAM when the total is not
    known), shared equally; 0 when nothing is left."""
    reserve = cpu_reserve_bytes(total_bytes or available_bytes, workers)
    return max(0, available_bytes - reserve) // workers


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's answer below is the best we have
    return platform.processor() or platform.machine()


DEVICE_ONLY = "--device-only"


SOFTWARE_FACTS = (
    "torch_version", "transformers_version", "bitsandbytes_error", "deepspeed_error",
    "torchao_error", "flash_attn_error", "flash_attn_3_error", "liger_error", "liger_model_types",
    "tp_model_types", "compile_backends", "training_argument_fields",
    "optimizer_names", "default_optim", "model_types", "task_model_types",
)  # fmt: skip
"""What the probe reads from the installed packages rather than the device: the same until
they change."""
