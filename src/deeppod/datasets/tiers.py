"""Hot and cold storage roots, and crash-safe moves of a version between them.

A move copies into a hidden folder next to the destination, verifies every file against the
version's CHECKSUMS, renames it into place, lets the caller switch the database, and only
then deletes the source. A crash at any point leaves the copy the database names intact;
``sweep`` removes what a crash left over.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deeppod.datasets.shards import verify_checksums
from deeppod.errors import MoveFailed

log = logging.getLogger(__name__)
TIERS = ("hot", "cold")


@dataclass(frozen=True)
class Tiers:
    hot: Path
    cold: Path

    def root(self, tier: str) -> Path:
        return self.hot if tier == "hot" else self.cold

    def path(self, tier: str, key: str) -> Path:
        return self.root(tier) / key

    @property
    def staging(self) -> Path:
        return self.hot / ".staging"

    @property
    def objects(self) -> Path:
        return self.cold / "objects"  # the archival copy lives on the capacity tier


def _copy(src: Path, dst: Path, on_file: Callable[[Path], None] | None) -> None:
    dst.mkdir(parents=True)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir():
            (dst / rel).mkdir(exist_ok=True)
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst / rel)
        with open(dst / rel, "rb+") as f:
            os.fsync(f.fileno())
        if on_file:
            on_file(path)


def move(tiers: Tiers, key: str, src_tier: str, dst_tier: str, switch: Callable[[], None],
         *, on_file: Callable[[Path], None] | None = None) -> None:
    """Copy, verify, rename, ``switch()`` (the caller's database commit), then delete the source."""
    src, dst = tiers.path(src_tier, key), tiers.path(dst_tier, key)
    if not src.is_dir():
        raise MoveFailed(f"{src} is missing: the {src_tier} copy of {key} is gone; run the server's recovery "
                         "(restart it) and check the storage")
    tmp = dst.parent / f".{dst.name}.moving-{uuid.uuid4().hex[:8]}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        _copy(src, tmp, on_file)
        bad = verify_checksums(tmp)
        if bad:
            raise MoveFailed(f"the copy of {key} to {dst_tier} does not match its checksums ({', '.join(bad[:3])}); "
                             "the source is untouched: check the destination storage and retry")
        if dst.exists():
            shutil.rmtree(dst)  # a leftover of an earlier interrupted move
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        switch()
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    shutil.rmtree(src, ignore_errors=True)


def sweep(tiers: Tiers, live: dict[str, str]) -> list[Path]:
    """Delete what interrupted moves left: hidden ``.moving-`` copies, and any version folder
    in a tier the database does not place it in. ``live``: key -> tier of every version."""
    removed = []
    for tier in TIERS:
        root = tiers.root(tier)
        if not root.is_dir():
            continue
        for path in root.glob("*/*/.*.moving-*"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        for path in root.glob("*/*/v*"):
            key = path.relative_to(root).as_posix()
            if key.startswith("."):  # the tier's own folders (.staging, .s3's inboxes): not versions
                continue
            if live.get(key) != tier:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    for path in removed:
        log.info("removed %s (left by an interrupted ingest or move)", path)
    return removed
