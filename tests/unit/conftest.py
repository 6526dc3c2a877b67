"""Fixtures the unit tests share."""

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.units import GIB
from autotune.plan import hardware, software_cache


@pytest.fixture
def probes(monkeypatch, tmp_path):
    """Points the cache at tmp_path and counts calls to a stand-in probe."""
    monkeypatch.setenv(software_cache.CACHE_DIR_ENV, str(tmp_path))
    calls = []

    def probe(software=None):
        calls.append(software)
        if software is not None:  # told the packages' facts: it reads the device alone
            device = {
                "cuda_available": False,
                "name": "cpu",
                "total_memory_bytes": 8 * GIB,
                "free_memory_bytes": 4 * GIB,
            }
            return DeviceInfo.from_facts({**software, **device})
        return DeviceInfo(
            cuda_available=False,
            name="cpu",
            total_memory_bytes=8 * GIB,
            free_memory_bytes=4 * GIB,
            optimizer_names=("adamw_torch", f"optim_{len(calls)}"),
            compile_backends=("inductor",),
            bitsandbytes_error="no GPU library",
        )

    monkeypatch.setattr(hardware, "probe", probe)
    return calls
