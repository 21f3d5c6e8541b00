"""Writing the training form of a version: shards plus index (format in deeppod.runtime.data)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from deeppod.contract import SHARD_MAGIC, SHARD_RECORD_HEADER
from deeppod.runtime.data import SPLITS

TARGET_SHARD_BYTES = 64 << 20


class ShardWriter:
    def __init__(self, root: Path, target_bytes: int = TARGET_SHARD_BYTES):
        self.dir = root / "shards"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.target = target_bytes
        self.rows: list[tuple[int, int, int, int, int, int]] = []
        self._shard = -1
        self._f = None
        self._size = 0

    def _next(self) -> None:
        self._close_file()
        self._shard += 1
        self._f = open(self.dir / f"shard-{self._shard:05d}.dps", "wb")
        self._f.write(SHARD_MAGIC)
        self._size = len(SHARD_MAGIC)

    def add(self, data: bytes, label: int, split: str, width: int, height: int) -> None:
        if self._f is None or self._size >= self.target:
            self._next()
        self._f.write(SHARD_RECORD_HEADER.pack(len(data), label))
        offset = self._size + SHARD_RECORD_HEADER.size
        self._f.write(data)
        self._size = offset + len(data)
        self.rows.append((self._shard, offset, len(data), label, SPLITS[split],
                          (min(width, 0xFFFF) << 16) | min(height, 0xFFFF)))

    def _close_file(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None

    def close(self, root: Path) -> None:
        import numpy as np

        self._close_file()
        np.save(root / "index.npy", np.array(self.rows, dtype=np.int64).reshape(-1, 6))


def write_checksums(root: Path) -> None:
    """CHECKSUMS: sha256 of every file of the version; tier moves verify copies against it."""
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "CHECKSUMS"):
        lines.append(f"{file_sha256(path)}  {path.relative_to(root).as_posix()}")
    (root / "CHECKSUMS").write_text("\n".join(lines) + "\n")


def verify_checksums(root: Path) -> list[str]:
    """The files that are missing or differ from CHECKSUMS (empty: intact)."""
    bad = []
    listing = root / "CHECKSUMS"
    if not listing.is_file():
        return ["CHECKSUMS"]
    for line in listing.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        path = root / rel
        if not path.is_file() or file_sha256(path) != digest:
            bad.append(rel)
    return bad


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
