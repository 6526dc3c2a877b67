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
With that answered, an H200 (the same software, 2026-12-04) showed the next one: the same
torchao module asks `torch.utils._triton.has_triton()` at import, which reads the device's
properties (`major >= 7`) through dynamo's device interface, and that initialises CUDA too.
`tests/integration/test_parent_process.py` finds such calls on a CPU by pretending a GPU is
there.

`install` answers those two questions from NVML while CUDA is uninitialised (the same
answers, without a context), and records the first call that does initialise CUDA, so that
`refuse_fork` can name the import to blame instead of failing in the forked child.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.cuda
import torch.utils._triton

TRITON_MIN_MAJOR = 7
"""torch's own test in `has_triton`: Triton runs on CUDA devices of compute capability 7.0 and
later."""

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
    torch.utils._triton.has_triton = _quiet_has_triton(torch.utils._triton.has_triton)


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


def _quiet_has_triton(has_triton: Callable[[], bool]) -> Callable[[], bool]:
    """`has_triton` answered as torch answers it on a CUDA device (the Triton package is
    there, device detection is on, and the current device, 0 before CUDA starts, is of compute
    capability 7.0 or later), from NVML while CUDA is uninitialised; torch's own answer
    otherwise. Cached as torch caches it: the device does not change."""

    @functools.cache
    def quiet() -> bool:
        if not initialised() and torch.cuda.is_available() and _triton_detects_devices():
            answer = nvml_capability(0)
            if answer is not None and answer[0] >= TRITON_MIN_MAJOR:
                return True
        return has_triton()

    quiet.__doc__ = has_triton.__doc__
    return quiet


def _triton_detects_devices() -> bool:
    if not torch.utils._triton.has_triton_package():
        return False
    from torch._inductor.config import triton_disable_device_detection

    return not triton_disable_device_detection


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
