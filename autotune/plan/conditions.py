"""What a measurement depends on, and where a study's measurements came from.

Conditions: the steps each trial warms up and times, its sequence length, the cores it has
(CPU) or the GPU model (CUDA), and the installed torch, transformers and autotune. Two trials
measured under other conditions do not compare, so a study stores the conditions it was made
under and a resume (or a joining worker) that would change one is refused. Versions are not
refused (an upgrade should not strand a study): trials measured under other versions than the
study's are marked and kept out of its front, picks and confirmation.

Provenance: each run on a study (a search, a worker, a confirmation) records the command that
started it, every setting, the seed, the versions, the device, the host and its start and end
time, so that a shared report or recommended.json says how to measure it again.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.common.urls import safe_url
from autotune.common.version import __version__

if TYPE_CHECKING:
    from autotune.common.device import DeviceInfo
    from autotune.plan.run_info import RunInfo

MEASURED_STEPS = ("seq_len", "measure_steps", "warmup_steps", "devices_per_trial")
"""Conditions every study compares on resume."""
VERSION_KEYS = ("torch", "transformers", "autotune")
"""The software whose versions a trial is measured under (stored with each trial)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Changed:
    """A condition the study was measured under, and this run's other value for it."""

    key: str
    stored: Any
    new: Any
    how: str = ""
    """What sets it, when not a setting of its own (`cores_per_trial`: `workers=`)."""

    def describe(self) -> str:
        how = f" ({self.how})" if self.how else ""
        return f"{self.key}{how}: the study's {self.stored}, this run's {self.new}"


def compared_keys(device: str) -> tuple[str, ...]:
    """The conditions compared for a study on `device`: on CPU the cores a trial has, on CUDA
    the GPU model (a trial owns its GPUs; its host cores only feed them) and the link between
    a trial's GPUs."""
    if device == "cpu":
        return (*MEASURED_STEPS, "cores_per_trial")
    return (*MEASURED_STEPS, "device_name", "gpu_link")


def changed_conditions(stored: RunInfo, new: RunInfo) -> list[Changed]:
    """Conditions `new` changes; a condition an older study did not store (None) is not
    compared."""
    how = {"cores_per_trial": "set by workers= and the cores this process may use"}
    return [
        Changed(key=key, stored=getattr(stored, key), new=getattr(new, key), how=how.get(key, ""))
        for key in compared_keys(stored.device)
        if getattr(stored, key) is not None and getattr(stored, key) != getattr(new, key)
    ]


def refusal(study: str, changed: list[Changed]) -> str:
    """Why a resume (or a worker) is refused, and what to do instead."""
    return (
        f"study={study} was measured under other conditions, and trials measured under "
        f"these would not compare with its trials: {'; '.join(c.describe() for c in changed)}. "
        "Resume it with the study's values, or start a new study for these with another "
        "study= name (or out= folder)"
    )


def installed_versions(device_info: DeviceInfo) -> dict[str, str]:
    """The versions trials run under here (torch and transformers as the probe found them)."""
    return {
        "torch": device_info.torch_version,
        "transformers": device_info.transformers_version,
        "autotune": __version__,
    }


def other_versions(measured: dict[str, str] | None, study: dict[str, str] | None) -> str | None:
    """How the versions a trial was measured under differ from the study's, in words; None
    when they do not, or when either is unknown (made before versions were stored)."""
    if not measured or not study:
        return None
    differ = [k for k in VERSION_KEYS if measured.get(k) != study.get(k)]
    if not differ:
        return None
    return ", ".join(f"{k} {measured.get(k)} (the study's {study.get(k)})" for k in differ)


def versions_note(
    study: str, study_versions: dict[str, str] | None, installed: dict[str, str]
) -> str | None:
    """What to say when this run's versions are not the study's; None when they are."""
    differ = other_versions(installed, study_versions)
    if differ is None:
        return None
    return (
        f"study={study} was measured under other versions than this run's: {differ}. Trials "
        "run now are marked (column other_versions) and kept out of the front, the picks and "
        "the confirmation; start a new study (another study= name) to search under these"
    )


# --- provenance ------------------------------------------------------------------------------


def cli_command(argv: list[str]) -> str:
    """The command line as typed (`autotune search model=gpt2 ...`), credentials masked."""
    return shlex.join(["autotune", *(safe_url(a) for a in argv)])


def api_call(function: str, kwargs: dict[str, Any]) -> str:
    """A Python call as written (`autotune.search(model='gpt2', seq_len=64)`), credentials
    masked; paths as text."""

    def shown(value: Any) -> str:
        value = str(value) if isinstance(value, Path) else value
        return repr(safe_url(value) if isinstance(value, str) else value)

    return f"{function}({', '.join(f'{k}={shown(v)}' for k, v in kwargs.items())})"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def run_record(
    *, kind: str, command: str, settings: dict[str, Any], info: RunInfo, versions: dict[str, str]
) -> dict[str, Any]:
    """One run's provenance as stored: `kind` is search, worker, confirm or verify; `settings` are
    every setting the run had (credentials masked by the caller)."""
    return {
        "kind": kind,
        "command": command,
        "settings": settings,
        "seed": settings.get("seed"),
        "versions": versions | {"python": platform.python_version()},
        "device": info.device,
        "device_name": info.device_name,
        "cores_per_trial": info.cores_per_trial,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": now(),
        "ended": None,
    }


def provenance(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What recommended.json says of where its study came from: the command that made it, its
    first start and last end, and every run; None for a study made before runs were stored."""
    if not runs:
        return None
    ends = [r["ended"] for r in runs if r["ended"]]
    return {
        "command": runs[0]["command"],
        "started": runs[0]["started"],
        "ended": max(ends) if ends else None,
        "runs": runs,
    }


def summary_lines(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The report summary's provenance entries, the command line first; keys start with
    `provenance`."""
    if not runs:
        return {"provenance": "not recorded (the study was made by an older autotune)"}
    first, last = runs[0], runs[-1]
    more = f" (and {len(runs) - 1} later run(s); the last: {last['command']})" * (len(runs) > 1)
    versions = ", ".join(f"{k} {v}" for k, v in last["versions"].items())
    cores = f", {last['cores_per_trial']} core(s) per trial" * (last["device"] == "cpu")
    settings = " ".join(f"{k}={v}" for k, v in first["settings"].items())
    return {
        "provenance: command": first["command"] + more,
        "provenance: settings": settings,
        "provenance: seed": str(first["seed"]),
        "provenance: versions": versions,
        "provenance: device and host": (
            f"{last['device']} ({last['device_name']}){cores} on {last['host']}"
        ),
        "provenance: time": f"{first['started']} to {last['ended'] or 'still running'}",
    }
