"""Units of memory, and how a memory figure is written for people."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3


def format_gib(gib: float | None, digits: int = 2) -> str:
    """`3.21 GiB`; below 10 MiB `5.2 MiB`, so a small figure never reads as zero."""
    if gib is None:
        return "n/a"
    if abs(gib) * GIB < 10 * MIB:
        return f"{gib * GIB / MIB:.1f} MiB"
    return f"{gib:.{digits}f} GiB"


def format_bytes(n_bytes: float, digits: int = 2) -> str:
    return format_gib(n_bytes / GIB, digits)
