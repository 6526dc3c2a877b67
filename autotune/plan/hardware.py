"""Device facts from a short probe subprocess, so the parent never imports torch or touches CUDA.

`python -m autotune.plan.hardware` prints one JSON object; `probe()` runs it and returns `DeviceInfo`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.common.errors import DeviceError
from autotune.common.knobs import precision_parts, sixteen_bit

if TYPE_CHECKING:
    from autotune.workers import Slot

PROBE_TIMEOUT_S = 120.0
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


TRANSFORMERS_DEFAULT_OPTIM = "adamw_torch_fused"
"""transformers 5's `TrainingArguments().optim`: stands only where the probe did not read the
installed one (a `DeviceInfo` made by hand, a software cache without it)."""


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
    compile_backends: tuple[str, ...] = ()
    """`torch.compile` backends this torch offers (`torch._dynamo.list_backends`)."""
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

    def compute_tflops(self, device: str, precision: str) -> float | None:
        """The fastest a training step can compute here (TFLOP/s): the GPU's datasheet peak
        for the precision, or the CPU's measured matmul rate; None when unknown."""
        if device == "cuda":
            return peak_tflops(self.name, precision)
        return self.matmul_tflops

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

    def memory_for(self, device: str, slots: Sequence[Slot] = ()) -> tuple[str, int]:
        """(device name, bytes a trial may use) for the resolved device, shared by `slots`
        (the workers): on CUDA the least free of their devices, on CPU an equal share of the
        RAM available less what the search, its fork servers and the machine need
        (`cpu_budget_bytes`; their trials run at the same time)."""
        if device == "cuda":
            free = self.cuda_free_memory_bytes
            chosen = [s.cuda_index for s in slots if s.cuda_index is not None]
            if free and chosen and all(i < len(free) for i in chosen):
                return self.cuda_device_names[chosen[0]], min(free[i] for i in chosen)
            return self.name, self.free_memory_bytes
        budget = cpu_budget_bytes(
            self.host_available_memory_bytes, self.host_total_memory_bytes, max(1, len(slots))
        )
        return self.cpu_name, budget

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> DeviceInfo:
        """From the probe's JSON (lists become tuples)."""
        facts = dict(facts)
        facts["task_model_types"] = {k: tuple(v) for k, v in facts["task_model_types"].items()}
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
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "16bit": 71.0}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "16bit": 165.2}),
)


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
        if piece.lower() in device_name.lower():
            return peaks[key]
    return None


def cpu_reserve_bytes(total_bytes: int, workers: int = 1) -> int:
    """Host RAM a CPU search keeps out of its trials' budget: the search process, each
    worker's fork server, and a share of the machine's RAM."""
    return (SEARCH_RESERVE_BYTES + FORK_SERVER_RESERVE_BYTES * workers
            + int(MACHINE_RESERVE_SHARE * total_bytes))  # fmt: skip


def cpu_budget_bytes(available_bytes: int, total_bytes: int, workers: int = 1) -> int:
    """The default memory budget of each of `workers` trials on CPU: the RAM available now
    less `cpu_reserve_bytes` (of the total, or of the available RAM when the total is not
    known), shared equally; 0 when nothing is left."""
    reserve = cpu_reserve_bytes(total_bytes or available_bytes, workers)
    return max(0, available_bytes - reserve) // workers


def probe(*, software: dict[str, Any] | None = None) -> DeviceInfo:
    """Run the probe in a subprocess; CUDA is initialised there, never here.

    `software`, the facts of the installed packages when known (`SOFTWARE_FACTS`, cached by
    `software_cache` per version), spares the probe reading them: it then imports torch alone,
    not transformers, torch._dynamo and bitsandbytes (about 2 s instead of 5 here)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune.plan.hardware", *([DEVICE_ONLY] * bool(software))],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DeviceError(f"the device probe did not answer in {PROBE_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0:
        raise DeviceError(f"the device probe failed:\n{proc.stderr[-2000:]}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    return DeviceInfo.from_facts({**(software or {}), **facts})


def memory_without_torch(device: str) -> tuple[str, str, int]:
    """(`cuda` or `cpu`, the device's name, the default budget of a search's trial in bytes:
    the GPU's free memory, or the RAM available less `cpu_reserve_bytes`) from NVML or the OS,
    in milliseconds: for answers that must not wait for the probe (`autotune estimate`). `auto`
    is CUDA when NVML sees a GPU (the first of CUDA_VISIBLE_DEVICES when that is an index)."""
    import psutil

    if device in ("auto", "cuda"):
        try:
            import pynvml

            pynvml.nvmlInit()
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)
            name = pynvml.nvmlDeviceGetName(handle)
            free = pynvml.nvmlDeviceGetMemoryInfo(handle).free
            return "cuda", name.decode() if isinstance(name, bytes) else name, int(free)
        except Exception as exc:  # no driver, no GPU, no NVML: each means "no GPU"
            if device == "cuda":
                raise DeviceError(
                    f"device=cuda: NVML sees no GPU here ({exc}); to estimate for a GPU on "
                    "another machine, give its memory: device=cuda memory_budget=80GiB"
                ) from exc
    host = psutil.virtual_memory()
    return "cpu", _cpu_name(), cpu_budget_bytes(host.available, host.total)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's answer below is the best we have
    return platform.processor() or platform.machine()


def _bitsandbytes_error() -> str | None:
    try:
        # bitsandbytes prints notices on stdout at import; keep stdout for the probe's JSON.
        with contextlib.redirect_stdout(sys.stderr):
            import bitsandbytes  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not usable here"
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


DEVICE_ONLY = "--device-only"
SOFTWARE_FACTS = (
    "torch_version", "transformers_version", "bitsandbytes_error", "compile_backends",
    "optimizer_names", "default_optim", "model_types", "task_model_types",
)  # fmt: skip
"""What the probe reads from the installed packages rather than the device: the same until
they change."""


def _software_facts() -> dict[str, Any]:
    import torch
    import torch._dynamo
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto
    from transformers.training_args import OptimizerNames

    from autotune.plan.models import TASK_CLASSES

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "bitsandbytes_error": _bitsandbytes_error(),
        # exclude_tags=() also lists the debugging backends (eager, aot_eager) users may name.
        "compile_backends": sorted(torch._dynamo.list_backends(exclude_tags=())),
        "optimizer_names": [o.value for o in OptimizerNames],
        "default_optim": str(transformers.TrainingArguments.__dataclass_fields__["optim"].default),
        "model_types": sorted(configuration_auto.CONFIG_MAPPING_NAMES),
        "task_model_types": {
            task: sorted(getattr(modeling_auto, table)) for task, (_, table) in TASK_CLASSES.items()
        },
    }


def _probe_here(device_only: bool = False) -> dict:
    import psutil
    import torch

    host = psutil.virtual_memory()
    facts = {
        "cuda_available": torch.cuda.is_available(),
        "cpu_name": _cpu_name(),
        "host_available_memory_bytes": host.available,
        "host_total_memory_bytes": host.total,
        **({} if device_only else _software_facts()),
    }
    if facts["cuda_available"]:
        free, total = torch.cuda.mem_get_info(0)
        major, minor = torch.cuda.get_device_capability(0)
        count = torch.cuda.device_count()
        facts |= {
            "cuda_device_names": [torch.cuda.get_device_name(i) for i in range(count)],
            "cuda_free_memory_bytes": [torch.cuda.mem_get_info(i)[0] for i in range(count)],
            "name": torch.cuda.get_device_name(0),
            "total_memory_bytes": total,
            "free_memory_bytes": free,
            "compute_capability": f"{major}.{minor}",
            # Native bf16 and tf32 tensor cores start with Ampere (8.0); older parts emulate
            # bf16 slowly, so it is treated as unsupported.
            "bf16_supported": major >= 8,
            "tf32_supported": major >= 8,
        }
    else:
        facts |= {
            "name": facts["cpu_name"],
            "total_memory_bytes": host.total,
            "free_memory_bytes": host.available,
            # The Trainer runs bf16 autocast on CPU (with use_cpu=True).
            "bf16_supported": True,
            "matmul_tflops": _cpu_matmul_tflops(),
        }
    return facts


def _cpu_matmul_tflops(n: int = 1024, repeats: int = 5) -> float:
    """This CPU's fp32 matmul rate, the best of `repeats` n x n products after one untimed
    (~0.1 s here): no training step computes faster, so time at this rate is a floor."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e12


if __name__ == "__main__":
    print(json.dumps(_probe_here(device_only=DEVICE_ONLY in sys.argv[1:])))
