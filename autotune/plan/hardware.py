"""Device facts from a short probe subprocess (`autotune.child.probe`), so the search process
never imports torch or touches CUDA: `probe()` runs it and returns `DeviceInfo`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from autotune.common.device import DEVICE_ONLY, DeviceInfo, cpu_budget_bytes, cpu_name
from autotune.common.errors import DeviceError
from autotune.common.links import GpuLink, read_links, slowest

PROBE_TIMEOUT_S = 120.0


def probe(*, software: dict[str, Any] | None = None) -> DeviceInfo:
    """Run the probe in a subprocess; CUDA is initialised there, never here.

    `software`, the facts of the installed packages when known (`SOFTWARE_FACTS`, cached by
    `software_cache` per version), spares the probe reading them: it then imports torch alone,
    not transformers, torch._dynamo and bitsandbytes (about 2 s instead of 5 here)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune.child.probe", *([DEVICE_ONLY] * bool(software))],
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
    return "cpu", cpu_name(), cpu_budget_bytes(host.available, host.total)


def link_without_torch(devices: int) -> GpuLink | None:
    """The slowest link between the first `devices` GPUs CUDA would number (as
    CUDA_VISIBLE_DEVICES names them, when by index), from NVML in milliseconds; None for one
    GPU, or where NVML cannot tell."""
    if devices < 2:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = list(range(count))
            if visible is not None:  # UUIDs or MIG names: CUDA's numbering is not NVML's
                indices = [int(v) for v in visible.split(",") if v.strip()]
            links = read_links(pynvml, indices[:devices])
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no NVML, names not indices: not known
        return None
    return slowest(links, range(min(devices, len(indices))))
