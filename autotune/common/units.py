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


def format_bytes_apart(a_bytes: float, b_bytes: float, digits: int = 2) -> tuple[str, str]:
    """Both figures written with as many digits as it takes for different sizes to read
    differently (`0.1501 GiB` exceeded `0.1500 GiB`, not `0.15` exceeded `0.15`); in bytes
    when even 9 digits do not tell them apart."""
    for more in range(digits, 10):
        shown = format_bytes(a_bytes, more), format_bytes(b_bytes, more)
        if shown[0] != shown[1] or a_bytes == b_bytes:
            return shown
    return f"{a_bytes:.0f} bytes", f"{b_bytes:.0f} bytes"


def plural(count: int, word: str) -> str:
    """`1 round`, `3 rounds`: a count with its noun."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
