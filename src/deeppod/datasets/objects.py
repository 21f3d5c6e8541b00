"""The content-addressed object store: every stored image once, by sha256, whatever the
dataset or version. New objects wait in the ingest's staging folder until it commits."""

from __future__ import annotations

import shutil
from pathlib import Path

from deeppod.atomic import move_into_place


class ObjectStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha

    def has(self, sha: str) -> bool:
        return self.path(sha).is_file()

    @staticmethod
    def stage(staging: Path, sha: str, data: bytes, *, known: bool = False) -> None:
        """Write an object of an ingest beside it; one the store holds already (``known``) is
        written too, and dropped at the commit (datasets/ingest.py says why)."""
        d = staging / ("known-objects" if known else "new-objects")
        d.mkdir(exist_ok=True)
        (d / sha).write_bytes(data)

    @staticmethod
    def stage_file(staging: Path, sha: str, path: Path, *, known: bool = False) -> None:
        """:meth:`stage` for an object already written as a file (a text dataset's split)."""
        d = staging / ("known-objects" if known else "new-objects")
        d.mkdir(exist_ok=True)
        shutil.copyfile(path, d / sha)

    def commit(self, staging: Path) -> list[str]:
        """Move staged objects into the store (rename: atomic per object)."""
        shutil.rmtree(staging / "known-objects", ignore_errors=True)
        d = staging / "new-objects"
        moved = []
        if d.is_dir():
            for f in d.iterdir():
                dest = self.path(f.name)
                dest.parent.mkdir(parents=True, exist_ok=True)
                move_into_place(f, dest)
                moved.append(f.name)
            d.rmdir()
        return moved

    def remove(self, shas) -> None:
        for sha in shas:
            try:
                self.path(sha).unlink()
            except FileNotFoundError:
                pass

    def count(self) -> int:
        return sum(1 for _ in self.root.glob("*/*")) if self.root.is_dir() else 0
