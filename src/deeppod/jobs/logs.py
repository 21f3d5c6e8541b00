"""Reading and following worker logs from the job folder."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

CHUNK = 64 * 1024


def log_file(job_dir: Path, rank: int) -> Path:
    return job_dir / "logs" / f"rank-{rank}.log"


def logged_ranks(job_dir: Path, current: int) -> list[int]:
    """Every rank that has a log (an elastic job may have run wider before) or runs now."""
    ranks = set(range(current))
    for f in (job_dir / "logs").glob("rank-*.log"):
        try:
            ranks.add(int(f.stem.split("-", 1)[1]))
        except ValueError:
            continue
    return sorted(ranks)


def stream_logs(job_dir: Path, ranks: list[int], *, follow: bool, finished: Callable[[], bool],
                poll_s: float = 0.2, max_seconds: float | None = None) -> Iterator[bytes]:
    """Yield log bytes. One rank: its raw output. Several: whole lines prefixed ``[rank N]``.

    With ``follow`` it keeps reading until ``finished()`` says the job ended and every
    file has been read to its end.
    """
    prefix = len(ranks) > 1
    offsets = {r: 0 for r in ranks}
    partial = {r: b"" for r in ranks}
    started = time.monotonic()
    while True:
        done = finished() if follow else True  # look before reading, so no tail is missed
        got = False
        for r in ranks:
            path = log_file(job_dir, r)
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[r])
                    data = f.read(CHUNK)
            except FileNotFoundError:
                continue
            if not data:
                continue
            got = True
            offsets[r] += len(data)
            if not prefix:
                yield data
                continue
            data = partial[r] + data
            lines = data.split(b"\n")
            partial[r] = lines.pop()
            if lines:
                yield b"".join(b"[rank %d] %s\n" % (r, line) for line in lines)
        if got:
            continue
        if done:
            for r in ranks:
                if partial[r]:
                    yield b"[rank %d] %s\n" % (r, partial[r])
            return
        if max_seconds is not None and time.monotonic() - started > max_seconds:
            return
        time.sleep(poll_s)


def tail(job_dir: Path, rank: int, max_bytes: int = 16384) -> str:
    """The end of one rank's log (whole lines, at most ``max_bytes``), for a page to show."""
    try:
        with open(log_file(job_dir, rank), "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    if size > max_bytes:  # drop the cut first line
        data = data.split(b"\n", 1)[-1]
    return data.decode("utf-8", "replace")
