"""CUDA left uninitialised in the processes that fork: the fork server and a trial's worker.

A process forked after CUDA was initialised cannot use CUDA ("Cannot re-initialize CUDA in
forked subprocess"). Trials are forked from the fork server, and a multi-device trial's ranks
from its worker, so neither may initialise it. Importing torch or transformers does not.
Importing `transformers.trainer` did, on an H100 (torch 2.11, transformers 5.17, torchao
0.18): the Trainer imports the model code, whose quantizers import torchao, and
`torchao.prototype.mx_formats.kernels` asks `torch.cuda.get_device_capability()` at import
(`torchao.utils.is_sm_at_least_100`); that call initialises CUDA. bitsandbytes asks the same
at import (`bitsandbytes.cuda_specs`), and the server imports it too: with peft installed
(`peft=lora`), `transformers.trainer` imports peft, which imports bitsandbytes.
`tests/integration/test_parent_process.py` finds such calls on a CPU by pretending a GPU is
there.

`install` answers that one question from NVML while CUDA is uninitialised (the same answer,
without a context), and records the first call that does initialise CUDA, so that
`refuse_fork` can name the import to blame instead of failing in the forked child.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.cuda

_first_init: str | None = None
"""Where CUDA was first initialised in this process (or in the process it was forked from)."""


class CudaInitialised(Exception):
    """A fork would inherit an initialised CUDA context: its child could not use the GPU."""


def install() -> None:
    """Answer `torch.cuda.get_device_capability` from NVML while CUDA is uninitialised, and
    watch CUDA's lazy initialisation. Idempotent; harmless where there is no GPU."""
    if getattr(torch.cuda._lazy_init, "_autotune_watched", False):
        return
    torch.cuda._lazy_init = _watched(torch.cuda._lazy_init)
    torch.cuda.get_device_capability = _quiet_capability(torch.cuda.get_device_capability)


def first_init() -> str | None:
    return _first_init


def initialised() -> bool:
    """Whether this process holds a CUDA context, or inherited one by a fork (unusable)."""
    return torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork()


def refuse_fork(what: str) -> None:
    """Raise CudaInitialised, naming what initialised CUDA, if `what` (a fork) would inherit
    an initialised CUDA context."""
    if initialised():
        raise CudaInitialised(
            f"CUDA was initialised in this process by {_first_init or 'a call not seen'}, so "
            f"{what} could not use the GPU (a forked child cannot re-initialise CUDA); keep "
            "that import or call out of the fork server and the trial's worker"
        )


def _watched(lazy_init: Callable[[], None]) -> Callable[[], None]:
    def watched() -> None:
        global _first_init
        if _first_init is None and not torch.cuda.is_initialized():
            _first_init = _caller()
        lazy_init()

    watched._autotune_watched = True  # type: ignore[attr-defined]
    return watched


def _quiet_capability(capability: Callable[..., tuple[int, int]]) -> Callable[..., Any]:
    def quiet(device: Any = None) -> tuple[int, int]:
        if not initialised() and torch.cuda.is_available():
            answer = nvml_capability(_index(device))
            if answer is not None:
                return answer
        return capability(device)  # initialises CUDA where it was not: `watch` names it

    quiet.__doc__ = capability.__doc__
    return quiet


def nvml_capability(index: int) -> tuple[int, int] | None:
    """The compute capability of visible CUDA device `index`, from NVML (which creates no
    CUDA context); None where NVML cannot say."""
    try:
        import pynvml

        nvml_index = torch.cuda._get_nvml_device_index(index)  # after CUDA_VISIBLE_DEVICES
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception:  # noqa: BLE001 - no NVML, an odd CUDA_VISIBLE_DEVICES: ask CUDA itself
        return None
    return int(major), int(minor)


def _index(device: Any) -> int:
    """A device argument's index; before CUDA starts the current device is 0."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index or 0


def _caller() -> str:
    """The modules being imported when CUDA started (outermost first) and the line that
    started it, outside torch."""
    frame = sys._getframe(2)
    importing: list[str] = []
    line = ""
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not line and not name.startswith(("torch.", "autotune.child.cuda_free")):
            line = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        if frame.f_code.co_name == "<module>" and not name.startswith("importlib"):
            importing.append(name)
        frame = frame.f_back
    chain = " -> ".join(reversed(importing))
    return f"importing {chain} ({line})" if importing else line
