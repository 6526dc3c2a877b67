"""Locks of torch's extension builds that a killed process left behind.

DeepSpeed builds its kernels (the CPU Adam, the shared-memory communication) with
`torch.utils.cpp_extension` the first time a trial uses them. Each build holds a `lock` file in
its build folder, made with O_EXCL and removed when the build ends; a process waiting for it
polls while the file exists, without a limit. A process killed while it built (a search's
trial at its timeout, a `kill -9`) leaves the file, and every later trial that loads that
kernel waits on it until its own timeout. Nothing but the file tells: the trial's log is
silent. So a trial that timed out names such a lock when one older than the trial is there.
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.common.knob_values import ZERO_STAGES
from autotune.common.knobs import value_of
from autotune.common.trial import TrialSpec

LOCK_NAME = "lock"
"""`torch.utils.cpp_extension`'s lock file in an extension's build folder."""


def extensions_root() -> Path:
    """Where torch builds extensions: `TORCH_EXTENSIONS_DIR`, else `torch_extensions` in the
    user's cache folder (`torch.utils.cpp_extension.get_default_build_root`, which adds a
    `py311_cu128`-like folder under it), worked out here without importing torch."""
    if explicit := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache) / "torch_extensions"


def locks_older_than(started_s: float, root: Path | None = None) -> list[Path]:
    """The build locks under `root` (default: `extensions_root()`) last touched before
    `started_s` (seconds since the epoch): made before the trial began, and still there."""
    root = extensions_root() if root is None else root
    found = [*root.glob(f"*/{LOCK_NAME}"), *root.glob(f"*/*/{LOCK_NAME}")]
    old = []
    for lock in found:
        try:
            if lock.stat().st_mtime < started_s:
                old.append(lock)
        except OSError:
            continue  # removed meanwhile: its build ended
    return sorted(old)


def builds_extensions(spec: TrialSpec) -> bool:
    """Whether the trial may build one of torch's extensions: it trains under DeepSpeed
    (ZeRO), whose kernels build on first use. A lock says nothing of another trial's wait."""
    strategy = value_of(spec.params, "strategy", devices=spec.devices)
    return strategy in ZERO_STAGES


def describe(locks: list[Path]) -> str:
    """Words for a timed-out trial's reason; empty when there is no lock. A path is shown
    as repr() shows it: a control character in a folder's name (an escape sequence) reaches
    the terminal as text, never as a command to it."""
    if not locks:
        return ""
    shown = ", ".join(repr(str(p))[1:-1] for p in locks)
    return (
        f"; a lock of torch's extension builds older than this trial is still there ({shown}): "
        "a process killed while it built a kernel leaves it, and every later build of that "
        "kernel waits on it; remove it if no build is running"
    )
