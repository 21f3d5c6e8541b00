"""How the CLI and the console write a number of bytes: one way everywhere (decimal units, as
disks and networks are sold), so a 9.1 kB dataset is never "0.0 MiB" on one page and "9 KB" in
the terminal."""

from __future__ import annotations

_UNITS = ("kB", "MB", "GB", "TB", "PB")


def size_text(n: float | None) -> str:
    """'812 B', '9.1 kB', '48.3 MB', '1.27 GB': three significant digits past a kilobyte."""
    if n is None:
        return "-"
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in _UNITS:
        n /= 1000
        if abs(n) < 1000 or unit == _UNITS[-1]:
            return f"{n:.3g} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
    return f"{n:.0f} PB"  # not reached


def duration_text(seconds: float) -> str:
    """A limit as --time reads it: '2d', '12h', '90m', '45s' (whole days, hours or minutes where it is one)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
