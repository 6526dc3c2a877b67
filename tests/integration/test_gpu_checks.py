"""The GPU lease's script, tried on this CPU: its plan against a real H100's facts, and every
script it runs importable (a GPU is lent rarely, for minutes: it must not fail at step one)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "tests" / "fixtures" / "probe-h100-2026-11-26.json"


def lease(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "benchmarks/gpu_checks.sh", "lease"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PROBE": str(H100), "LEASE_STAGES": "plan", "OUT": str(tmp_path), **env},
    )


def test_the_lease_plans_the_headline_search_on_the_h100_facts(tmp_path):
    # The lease's search is `autotune search model=bert-large-uncased seq_len=512` with its
    # defaults, bounded in time: its plan, made here in a second, must hold.
    done = lease(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = (tmp_path / "plan.txt").read_text()
    assert "plan on NVIDIA H100 80GB HBM3" in plan
    assert "model=bert-large-uncased seq_len=512 timeout=120s confirm_rounds=0" in plan
    for precision in ("fp32", "bf16", "fp16"):
        assert f"batch sizes of precision={precision}: 8, 16, 24, 32, 40, " in plan
    assert "skip by estimate past 78.43 GiB" in plan  # never past the card's memory


def test_the_lease_plans_a_fixed_effective_batch_on_the_h100_facts(tmp_path):
    # The first H100 lease was refused at its first command: "effective_batch_size=32: no
    # batch size of precision=fp16 divides it".
    done = lease(tmp_path, SEARCH_ARGS="effective_batch_size=32 n_trials=40")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = (tmp_path / "plan.txt").read_text()
    for precision in ("fp32", "bf16", "fp16"):
        assert f"batch sizes of precision={precision}: 8, 16, 32\n" in plan


def test_a_plan_the_search_would_refuse_fails_the_lease_before_anything_trains(tmp_path):
    done = lease(tmp_path, SEARCH_ARGS="effective_batch_size=12")
    assert done.returncode == 2
    assert "refused on NVIDIA H100 80GB HBM3: effective_batch_size=12" in done.stdout
    assert "batch sizes allowed under the rule: 8, 16, 24, ..., 256" in done.stdout


@pytest.mark.parametrize(
    "script",
    [
        "fork_cuda.py",
        "fidelity.py",
        "guide_table.py",
        "offload.py",
        "lease_plan.py",
        "trial_overhead.py",
        "landscapes/record_inprocess.py",
    ],
)
def test_every_script_of_the_lease_starts(script):
    # What the lease runs on the GPU must at least import here (fork_cuda.py once imported a
    # name the runner no longer had).
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
