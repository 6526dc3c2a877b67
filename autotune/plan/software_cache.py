"""What the installed packages accept, cached per user: `autotune validate` and `autotune
estimate` start no torch, and a search's device probe imports torch alone.

`TrainingArguments.optim` values, `torch.compile` backends, transformers' model types and heads
and whether bitsandbytes and DeepSpeed import change only when the packages do, so the device
probe's answer is kept under the versions that produced it (read with `importlib.metadata`,
which imports none of them) and probed again when they differ. Only these software facts are cached,
never memory or CUDA state: `autotune search` probes the device afresh every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from autotune.common.device import SOFTWARE_FACTS, DeviceInfo
from autotune.common.errors import StudyError
from autotune.common.trial import write_json_atomic
from autotune.plan import hardware
from autotune.plan.space_file import SoftwareFacts

CACHE_DIR_ENV = "AUTOTUNE_CACHE_DIR"
"""Overrides the cache folder (tests point it at a temporary one)."""
SCHEMA_VERSION = 7


def file_name() -> str:
    """One cache file per Python environment (`sys.prefix`): two virtual environments with
    other packages would otherwise overwrite each other's facts and each probe again (~30 s)."""
    prefix = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return f"software-facts-{prefix}.json"


def cache_dir() -> Path:
    """$AUTOTUNE_CACHE_DIR, else $XDG_CACHE_HOME/autotune, else ~/.cache/autotune."""
    if explicit := os.environ.get(CACHE_DIR_ENV):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG base directory spec says to ignore a relative path.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "autotune"


def installed_key() -> dict[str, Any]:
    """What the cached names depend on: the torch and transformers versions, and the compile
    backends other packages register (`torch._dynamo.list_backends` lists their entry points)."""
    plugins = metadata.entry_points(group="torch_dynamo_backends")
    return {
        "torch": metadata.version("torch"),
        "transformers": metadata.version("transformers"),
        "bitsandbytes": _version("bitsandbytes"),
        "deepspeed": _version("deepspeed"),
        "torchao": _version("torchao"),
        "flash_attn": _version("flash_attn"),
        "liger_kernel": _version("liger_kernel"),
        "compile_backend_plugins": sorted(plugins.names),
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def software_facts() -> SoftwareFacts:
    """From the cache when it was written for the installed packages, else from the probe
    (which fills the cache)."""
    cached = _cached()
    if cached is not None:
        return SoftwareFacts.from_probe(cached["software"])
    return SoftwareFacts.from_probe(dataclasses.asdict(probe_device()))


def probe_device() -> DeviceInfo:
    """The device probe (always run: memory and CUDA state are never cached), given the
    installed packages' facts when the cache has them for these versions (reading them takes
    the probe seconds: transformers, torch._dynamo, bitsandbytes); a full probe fills it."""
    cached = _cached()
    if cached is not None:
        return hardware.probe(software=cached["software"])
    info = hardware.probe()
    facts = dataclasses.asdict(info)
    record = {
        "schema_version": SCHEMA_VERSION,
        "key": installed_key(),
        "optimizer_names": list(info.optimizer_names),
        "compile_backends": list(info.compile_backends),
        "software": {k: facts[k] for k in SOFTWARE_FACTS},
    }
    try:
        write_json_atomic(cache_dir() / file_name(), record)
    except StudyError:
        pass  # a read-only home or a full disk: the same answer, the next run probes again
    return info


def _cached() -> dict[str, Any] | None:
    """The cache's record when it was written for the installed packages."""
    cached = _read(cache_dir() / file_name())
    if cached.get("schema_version") == SCHEMA_VERSION and cached.get("key") == installed_key():
        return cached
    return None


def _read(path: Path) -> dict[str, Any]:
    """The cache file's contents; {} (a miss) when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
