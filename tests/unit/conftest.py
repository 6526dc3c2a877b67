"""Fixtures the unit tests share, and the test process that runs those importing torch."""

from pathlib import Path

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.units import GIB
from autotune.plan import hardware, software_cache

UNIT = Path(__file__).parent
TORCH_TESTS = (
    "child/test_data.py",
    "child/test_measure.py",
    "child/test_progress.py",
    "child/test_ranks.py",
    "child/test_result.py",
    "child/test_trainers.py",
    "common/test_knobs.py",
    "outputs/test_export.py",
    "plan/test_batch_rule.py",
    "plan/test_capabilities.py",
    "plan/test_data_parallel.py",
    "plan/test_run_space.py",
    "study/test_sampler.py",
    "test_replay.py",
)
"""The unit tests that import torch and transformers as they run (with peft, ~6 s of the unit
run): all in one test process (`--dist loadgroup`), so that the other never imports them. Their
modules import them on first use (`installed.Lazy`, `installed.software_facts`), and collecting
the unit tests imports neither (`tests/integration/test_parent_process.py` checks)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(UNIT) and item.path.relative_to(UNIT).as_posix() in TORCH_TESTS:
            item.add_marker(pytest.mark.xdist_group("torch"))


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
