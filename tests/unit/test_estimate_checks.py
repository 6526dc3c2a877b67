"""`autotune estimate` refuses what the search refuses, every problem named at once."""

from __future__ import annotations

import sys

import pytest

from autotune import hardware
from autotune.errors import DeviceError


def test_estimate_device_cuda_without_a_gpu_suggests_memory_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: import fails as without a GPU
    with pytest.raises(DeviceError, match=r"device=cuda memory_budget="):
        hardware.memory_without_torch("cuda")
