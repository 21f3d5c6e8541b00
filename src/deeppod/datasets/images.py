"""A version's images one by one, for people: the manifest says what each is (path, label,
sha256, split), the index where its bytes lie in the shards. Thumbnails are made once per
content (sha256) and kept beside the hot tier, so a gallery of thousands stays cheap."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from deeppod.atomic import atomic_write
from deeppod.contract import SHARD_RECORD_HEADER
from deeppod.errors import InvalidRequest, NotFound

THUMB_PX = 128


@dataclass(frozen=True)
class Image:
    index: int  # its row in the version (manifest line, index row)
    path: str
    label: str
    sha256: str
    split: str
    width: int
    height: int


class VersionImages:
    def __init__(self, folder: Path):
        self.folder = folder
        self._rows: list[dict] | None = None

    @property
    def rows(self) -> list[dict]:
        if self._rows is None:
            try:
                with open(self.folder / "manifest.jsonl") as f:
                    self._rows = [json.loads(line) for line in f if line.strip()]
            except FileNotFoundError:
                raise NotFound("this version's files are not on the server (moved or removed)") from None
        return self._rows

    def page(self, offset: int = 0, limit: int = 60, label: str | None = None) -> tuple[list[Image], int]:
        """Images ``offset`` .. ``offset + limit`` (of one class, if given), and how many match."""
        chosen = [(i, r) for i, r in enumerate(self.rows) if label is None or r["label"] == label]
        return [self._image(i, r) for i, r in chosen[offset:offset + limit]], len(chosen)

    def image(self, index: int) -> Image:
        if not 0 <= index < len(self.rows):
            raise NotFound(f"this version has images 0..{len(self.rows) - 1}; {index} is not one")
        return self._image(index, self.rows[index])

    @staticmethod
    def _image(i: int, r: dict) -> Image:
        return Image(i, r["path"], r["label"], r["sha256"], r.get("split", "train"), r.get("width", 0),
                     r.get("height", 0))

    def read(self, index: int) -> bytes:
        """The image's stored bytes, from its shard."""
        import numpy as np

        self.image(index)  # a clear error for a bad index
        row = np.load(self.folder / "index.npy", mmap_mode="r")[index]
        shard, offset, length = int(row[0]), int(row[1]), int(row[2])
        with open(self.folder / "shards" / f"shard-{shard:05d}.dps", "rb") as f:
            f.seek(offset - SHARD_RECORD_HEADER.size)
            size, _ = SHARD_RECORD_HEADER.unpack(f.read(SHARD_RECORD_HEADER.size))
            data = f.read(length)
        if size != length or len(data) != length:
            raise InvalidRequest(f"image {index}'s shard record does not match the index: the version is damaged")
        return data


def thumbnail(cache: Path, sha256: str, read, px: int = THUMB_PX) -> Path:
    """The JPEG thumbnail of the image with this content; ``read()`` gives its bytes the first
    time. Written atomically: two requests at once both get a whole file."""
    if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
        raise InvalidRequest("not an image's sha256")
    path = cache / sha256[:2] / f"{sha256}-{px}.jpg"
    if path.exists():
        return path
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(read())) as im:
        im.draft("RGB", (px, px))  # JPEG: decode at a reduced scale
        im = im.convert("RGB")
        im.thumbnail((px, px))
        out = io.BytesIO()
        im.save(out, "JPEG", quality=80)
    atomic_write(path, out.getvalue(), mode=0o644)
    return path
