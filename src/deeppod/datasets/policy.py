"""Ingest policies: what every new version of a dataset gets done to its images.

resize    "max:1024" (longest side at most) or "short:256" (shortest side exactly, never upscaled)
format    keep | jpeg | png | webp          quality  1-100 (jpeg, webp)
mode      keep | RGB | L                    tile     N: cut images larger than N into N x N tiles
val       fraction in [0, 1) for the validation split, chosen by a hash of the source path,
          so an image stays on the same side in every version; split_seed changes the draw
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import asdict, dataclass, fields

from deeppod.errors import InvalidRequest

FORMATS = ("keep", "jpeg", "png", "webp")
MODES = ("keep", "RGB", "L")
SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp", "GIF": ".gif", "TIFF": ".tif"}


@dataclass(frozen=True)
class Policy:
    resize: str | None = None
    format: str = "keep"
    quality: int = 90
    mode: str = "keep"
    tile: int | None = None
    val: float = 0.0
    split_seed: int = 0

    @property
    def identity(self) -> bool:
        """Stores the uploaded bytes as they are."""
        return self.resize is None and self.format == "keep" and self.mode == "keep" and self.tile is None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def parse(cls, raw: dict | None) -> Policy:
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidRequest(f"unknown policy key {unknown[0]!r}: use {', '.join(sorted(known))}")
        p = cls(**{k: v for k, v in raw.items() if v is not None})
        if p.resize is not None:
            how, _, n = str(p.resize).partition(":")
            if how not in ("max", "short") or not n.isdigit() or not 8 <= int(n) <= 16384:
                raise InvalidRequest(f"resize={p.resize!r}: use max:N or short:N with N from 8 to 16384")
        if p.format not in FORMATS:
            raise InvalidRequest(f"format={p.format!r}: use one of {', '.join(FORMATS)}")
        if p.mode not in MODES:
            raise InvalidRequest(f"mode={p.mode!r}: use one of {', '.join(MODES)}")
        try:
            quality, val, seed = int(p.quality), float(p.val), int(p.split_seed)
            tile = None if p.tile is None else int(p.tile)
        except (TypeError, ValueError):
            raise InvalidRequest("quality, tile and split_seed are whole numbers and val is a fraction") from None
        if not 1 <= quality <= 100:
            raise InvalidRequest(f"quality={quality}: use 1 to 100")
        if tile is not None and not 16 <= tile <= 16384:
            raise InvalidRequest(f"tile={tile}: use 16 to 16384 pixels")
        if not 0.0 <= val < 1.0:
            raise InvalidRequest(f"val={val}: the validation fraction must be at least 0 and below 1")
        return cls(p.resize, p.format, quality, p.mode, tile, val, seed)


def _rank(source_path: str, policy: Policy) -> float:
    """Where a file falls in [0, 1): a hash of the seed and its path, the same in every version."""
    h = hashlib.sha256(f"{policy.split_seed}:{source_path}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2 ** 64


def splits(files: list[tuple[str, str]], policy: Policy) -> dict[str, str]:
    """(path, label) -> side: in each class exactly round(n x val) files go to validation, those
    that rank first by their hash (so the same files stay there when a version adds others, but
    those near the cut). 40 images at val=0.2 give 8, not anywhere from 4 to 15."""
    by_class: dict[str, list[str]] = {}
    for path, label in files:
        by_class.setdefault(label, []).append(path)
    out = {}
    for paths in by_class.values():
        ranked = sorted(paths, key=lambda p: (_rank(p, policy), p))
        k = math.floor(len(ranked) * policy.val + 0.5)
        out.update({p: "val" if i < k else "train" for i, p in enumerate(ranked)})
    return out


def apply(im, original: bytes, policy: Policy) -> list[tuple[str, bytes, int, int]]:
    """A decoded image -> [(name suffix, stored bytes, width, height)]: one item, or one per tile."""
    from PIL import Image

    if policy.identity:
        return [("", original, im.width, im.height)]
    fmt = im.format or "PNG"
    if policy.mode != "keep" and im.mode != policy.mode:
        im = im.convert(policy.mode)
    if policy.resize:
        how, _, n = policy.resize.partition(":")
        n = int(n)
        side = max(im.size) if how == "max" else min(im.size)
        if side > n:
            scale = n / side
            im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.BILINEAR)
    out_fmt = fmt if policy.format == "keep" else policy.format.upper()
    if out_fmt == "JPEG" and im.mode not in ("RGB", "L"):
        im = im.convert("RGB")
    if out_fmt not in SUFFIX:
        out_fmt = "PNG"
    pieces = [("", im)]
    t = policy.tile
    if t and (im.width > t or im.height > t):
        pieces = [(f"#tile={r},{c}", im.crop((c * t, r * t, min(im.width, (c + 1) * t), min(im.height, (r + 1) * t))))
                  for r in range((im.height + t - 1) // t) for c in range((im.width + t - 1) // t)]
    out = []
    for suffix, piece in pieces:
        buf = io.BytesIO()
        kw = {"quality": policy.quality} if out_fmt in ("JPEG", "WEBP") else {}
        piece.save(buf, format=out_fmt, **kw)
        out.append((suffix, buf.getvalue(), piece.width, piece.height))
    return out
