"""Reading and following worker logs from the job folder."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from deeppod.job_folder import JobFolder

CHUNK = 64 * 1024


def log_file(job_dir: Path, rank: int) -> Path:
    return JobFolder(job_dir).log(rank)


def logged_ranks(job_dir: Path, current: int) -> list[int]:
    """Every rank that has a log (an elastic job may have run wider before) or runs now."""
    return sorted(set(range(current)) | set(JobFolder(job_dir).rank_logs()))


def _marks(job_dir: Path, rank: int) -> list[tuple[int, float]]:
    """(size, time) stamps of a rank's log, as its supervisor wrote them, in order."""
    out = []
    try:
        with open(JobFolder(job_dir).marks(rank)) as f:
            for line in f:
                size, _, at = line.partition(" ")
                try:
                    out.append((int(size), float(at)))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def _timed_lines(job_dir: Path, rank: int, upto: int) -> Iterator[tuple[float, int, bytes]]:
    """The whole lines of a rank's log before byte ``upto``, each with the time of the first
    stamp that covers it (when it had been written by); past the last stamp: +inf."""
    marks = _marks(job_dir, rank)
    i, offset = 0, 0
    try:
        f = open(log_file(job_dir, rank), "rb")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if offset + len(line) > upto or not line.endswith(b"\n"):
                return
            offset += len(line)
            while i < len(marks) and marks[i][0] < offset:
                i += 1
            yield (marks[i][1] if i < len(marks) else math.inf), rank, line


def interleaved(job_dir: Path, ranks: list[int], upto: dict[int, int]) -> Iterator[bytes]:
    """Every rank's lines up to ``upto`` as one stream in the order they were written (to within
    the supervisor's stamps, 0.5 s; lines of one stamp go rank by rank), ``[rank N]`` first."""
    for _, rank, line in heapq.merge(*(_timed_lines(job_dir, r, upto[r]) for r in ranks),
                                     key=lambda x: (x[0], x[1])):
        yield b"[rank %d] %s" % (rank, line)


def stream_logs(job_dir: Path, ranks: list[int], *, follow: bool, finished: Callable[[], bool],
                poll_s: float = 0.2, max_seconds: float | None = None) -> Iterator[bytes]:
    """Yield log bytes. One rank: its raw output. Several: whole lines prefixed ``[rank N]``,
    what is written so far interleaved by time, then (following) as it comes.

    With ``follow`` it keeps reading until ``finished()`` says the job ended and every
    file has been read to its end.
    """
    prefix = len(ranks) > 1
    offsets = {r: 0 for r in ranks}
    partial = {r: b"" for r in ranks}
    if prefix:  # what is there now, interleaved by time; the loop below goes on from there
        offsets = {r: _whole_lines_end(log_file(job_dir, r)) for r in ranks}
        chunk = []
        for line in interleaved(job_dir, ranks, offsets):
            chunk.append(line)
            if len(chunk) >= 256:
                yield b"".join(chunk)
                chunk = []
        if chunk:
            yield b"".join(chunk)
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


def _whole_lines_end(path: Path) -> int:
    """The offset just past the last newline of a file (0 if none or no file)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            pos = size
            while pos > 0:
                step = min(CHUNK, pos)
                f.seek(pos - step)
                block = f.read(step)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    return pos - step + nl + 1
                pos -= step
    except FileNotFoundError:
        pass
    return 0


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
