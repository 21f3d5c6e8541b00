"""How the CLI and the console write a number of bytes: one way everywhere (decimal units, as
disks and networks are sold), so a 9.1 kB dataset is never "0.0 MiB" on one page and "9 KB" in
the terminal; and how both read and write a time limit."""

from __future__ import annotations

from deeppod.errors import InvalidRequest

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


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def time_limit_seconds(value: str, what: str = "the time limit") -> float:
    """A time limit as a user writes it, in seconds: '90m', '12h', '2d', or as Slurm writes it
    (M:S, H:M:S, D-H, D-H:M, D-H:M:S). Anything else, a number with no unit too, is refused."""
    v = value.strip()
    try:
        if v[-1:] in _SECONDS and v[:-1]:
            seconds = float(v[:-1]) * _SECONDS[v[-1]]
        elif ":" in v or "-" in v:
            days, dash, clock = v.rpartition("-")
            parts = [float(p) for p in clock.split(":")]
            if any(p < 0 for p in parts):
                raise ValueError(v)
            if dash:  # D-H, D-H:M, D-H:M:S
                units = (3600, 60, 1)[:len(parts)]
                seconds = float(days) * 86400 + sum(p * u for p, u in zip(parts, units, strict=True))
            else:  # M:S, H:M:S
                units = {2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
                seconds = sum(p * u for p, u in zip(parts, units, strict=True))
        else:
            raise ValueError(v)
        if 0 < seconds < float("inf"):
            return seconds
    except (ValueError, KeyError):
        pass
    raise InvalidRequest(f"{what} {value!r} is not a time limit: use e.g. 90m, 12h, 2d or as Slurm writes it, "
                         "1-12:00:00 (a number alone has no unit)")
