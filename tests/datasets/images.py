"""Test images made on the spot: small JPEGs and PNGs with distinct content, and broken files."""

from __future__ import annotations

import io
import random
from pathlib import Path


def image_bytes(seed: int, size=(48, 40), fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = random.Random(seed)
    im = Image.new(mode, size,
                   tuple(rng.randrange(256) for _ in range(len(mode))) if mode != "L" else rng.randrange(256))
    px = im.load()
    for _ in range(60):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        px[x, y] = tuple(rng.randrange(256) for _ in range(3)) if mode == "RGB" else rng.randrange(256)
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def class_folders(root: Path, classes=("cat", "dog"), per_class: int = 6, seed: int = 0, size=(48, 40)) -> Path:
    for c, name in enumerate(classes):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            fmt = "PNG" if i % 3 == 2 else "JPEG"
            (d / f"{name}{i}.{'png' if fmt == 'PNG' else 'jpg'}").write_bytes(
                image_bytes(seed * 1000 + c * 100 + i, size, fmt))
    return root


def truncated_jpeg(seed: int = 99) -> bytes:
    data = image_bytes(seed, (64, 64))
    return data[: len(data) // 2]
