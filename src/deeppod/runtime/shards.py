"""A DeepPod dataset version as it lies on disk (written by the platform at ingest;
docs/datasets.md)::

    manifest.jsonl        one JSON object per sample: path, label, bytes, sha256, width, height, split
    classes.json          ["cat", "dog", ...]: label i is classes[i]
    index.npy             int64 [N, 6]: shard, offset, length, label, split (0 train, 1 val), width*65536+height
    shards/shard-00000.dps  b"DPSHARD1" then records: <u32 length><i32 label><length bytes of image>

A record's offset in index.npy points at its image bytes, so random access is one slice of
a memory map; reading the index in order reads every shard front to back (sequential).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

from deeppod.contract import SHARD_MAGIC, SHARD_RECORD_HEADER, dataset_env_key

TRAIN, VAL = 0, 1
SPLITS = {"train": TRAIN, "val": VAL}
# index.npy columns
SHARD, OFFSET, LENGTH, LABEL, SPLIT, SIZE = range(6)


def dataset_path(name: str) -> Path:
    """The folder of a dataset the platform staged for this job (``DEEPPOD_DATA_<NAME>``)."""
    return given_folder(dataset_env_key(name), "dataset", name, "--dataset")


def given_folder(key: str, what: str, name: str, option: str) -> Path:
    """A folder the platform handed this job in ``key`` (a dataset, a model), or why not."""
    value = os.environ.get(key)
    if not value:
        raise FileNotFoundError(f"{what} {name!r} is not given to this job: submit it with {option} {name} "
                                f"(the platform sets {key})")
    return Path(value)


class ShardReader:
    """Random and sequential access to the samples of one version folder."""

    def __init__(self, root: str | os.PathLike, split: str | None = None):
        import numpy as np

        self.root = Path(root)
        if not (self.root / "index.npy").is_file():
            raise FileNotFoundError(f"{self.root} is not a DeepPod dataset version (no index.npy)")
        index = np.load(self.root / "index.npy")
        if split is not None:
            if split not in SPLITS:
                raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
            index = index[index[:, SPLIT] == SPLITS[split]]
        self.index = index
        self.classes: list[str] = json.loads((self.root / "classes.json").read_text())
        self._maps: dict[int, mmap.mmap] = {}

    def __len__(self) -> int:
        return len(self.index)

    @property
    def labels(self) -> list[int]:
        return self.index[:, LABEL].tolist()

    def _map(self, shard: int) -> mmap.mmap:
        m = self._maps.get(shard)
        if m is None:
            with open(self.root / "shards" / f"shard-{shard:05d}.dps", "rb") as f:
                m = self._maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return m

    def read(self, i: int) -> tuple[bytes, int]:
        shard, offset, length, label = (int(v) for v in self.index[i, :4])
        return self._map(shard)[offset:offset + length], label

    def size(self, i: int) -> tuple[int, int]:
        v = int(self.index[i, SIZE])
        return v >> 16, v & 0xFFFF

    def __getstate__(self):  # worker processes open their own maps
        return {**self.__dict__, "_maps": {}}

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()


def iter_shard(path: str | os.PathLike):
    """Sequential read of one shard file without its index: yields (label, image bytes)."""
    with open(path, "rb") as f:
        if f.read(len(SHARD_MAGIC)) != SHARD_MAGIC:
            raise ValueError(f"{path} is not a DeepPod shard (bad magic)")
        while head := f.read(SHARD_RECORD_HEADER.size):
            length, label = SHARD_RECORD_HEADER.unpack(head)
            yield label, f.read(length)
