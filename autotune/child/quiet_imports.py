"""Drops the log lines that importing the Trainer prints about nothing a trial does.

transformers' quantizers import torchao whenever it is installed (and peft, with it
bitsandbytes, whose CPU backend says it could not fetch a kernel from the hub), and torchao's
import logs two kinds of lines: one per prebuilt kernel library it cannot load, and torch's
deprecation notice for each of its Enums it registers as a pytree constant. The fork server
imports the Trainer for every trial, so they opened every search's terminal; a trial started
as a fresh process printed them into its log. Each is dropped by its logger and message
alone, so the same libraries' other warnings still show.

Installed before the Trainer's import: by `fork_server_init` and `python -m autotune.child`.
"""

from __future__ import annotations

import enum
import logging
import re

_KERNEL_NOT_LOADED = re.compile(r"Failed to load \S+\.so: ")
"""torchao/__init__.py: its libraries built for another Python or torch than the installed
ones (`_C_mxfp8.cpython-310-...so` under Python 3.11). A trial that needs such a kernel fails
with an error of its own."""
_HUB_KERNEL = "Failed to load CPU gemm_4bit_forward from kernels-community"
"""bitsandbytes/backends/cpu/ops.py (0.50, on a CPU with AVX-512 BF16): at import, it fetches
an optional 4-bit matmul kernel from the hub through the `kernels` package, and says so when it
cannot (not installed, or offline); 4-bit layers then run on its own CPU path. peft imports
bitsandbytes with the Trainer, so every trial printed it."""
_ENUM_CONSTANT = "is an Enum subclass and is now natively supported"
"""torch/utils/_pytree.py, `register_constant` called on an Enum (torch >= 2.13)."""


def _not_a_kernel_torchao_failed_to_load(record: logging.LogRecord) -> bool:
    return _KERNEL_NOT_LOADED.match(record.getMessage()) is None


def _not_torchaos_enum_registered(record: logging.LogRecord) -> bool:
    registered = record.args[0] if isinstance(record.args, tuple) and record.args else None
    from_torchao = (
        isinstance(registered, type)
        and issubclass(registered, enum.Enum)
        and registered.__module__.split(".")[0] == "torchao"
    )
    return not (from_torchao and _ENUM_CONSTANT in str(record.msg))


def _not_bitsandbytes_hub_kernel(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_HUB_KERNEL)


def install() -> None:
    """Drop those lines in this process and in the processes it forks."""
    logging.getLogger("torchao").addFilter(_not_a_kernel_torchao_failed_to_load)
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_bitsandbytes_hub_kernel)
    logging.getLogger("torch.utils._pytree").addFilter(_not_torchaos_enum_registered)
