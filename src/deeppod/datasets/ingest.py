"""Building one dataset version from an uploaded archive, in a staging folder (images here;
an archive of JSON Lines is a text dataset: datasets/text.py).

Every image is decoded; what fails (corrupt, truncated, unsupported, too large, no label)
goes to ``quarantine/`` with its reason in the report, the rest through the policy into the
manifest, the shards and (once per content) the object store. Nothing here touches the
database or the final folders: the service moves the result into place atomically.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from deeppod.datasets import text
from deeppod.datasets.archive import LABEL_FILES, Archive, Member, parse_labels, strip_common_root
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import SUFFIX, Policy, apply, splits
from deeppod.datasets.shards import ShardWriter, write_checksums
from deeppod.errors import InvalidRequest

log = logging.getLogger(__name__)

MAX_PIXELS = 178_956_970  # Pillow's own decompression-bomb bound
SIZE_BUCKETS = [(16 << 10, "<16KB"), (64 << 10, "<64KB"), (256 << 10, "<256KB"), (1 << 20, "<1MB"),
                (4 << 20, "<4MB"), (float("inf"), ">=4MB")]


@dataclass
class Limits:
    max_file_bytes: int
    max_ingest_bytes: int


@dataclass
class Built:
    samples: int = 0
    bytes: int = 0
    classes: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    report: dict = field(default_factory=dict)
    new_objects: list[str] = field(default_factory=list)


def _skipped(path: str) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in path.split("/"))


def _decode(data: bytes):
    """(image, None) or (None, reason). The image is fully decoded: truncation shows here."""
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data))
        if im.format not in SUFFIX:
            return None, f"unsupported image format {im.format}; use JPEG, PNG, WEBP, BMP, GIF or TIFF"
        if im.width * im.height > MAX_PIXELS:
            return None, f"{im.width}x{im.height} pixels is over the {MAX_PIXELS} pixel limit"
        im.load()
        return im, None
    except Image.UnidentifiedImageError:
        return None, "not an image (or a format Pillow cannot read)"
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError... for damaged files
        return None, f"cannot decode: {exc}"


def build(upload: Path, out: Path, objects: ObjectStore, policy: Policy, limits: Limits,
          *, threads: int | None = None) -> Built:
    out.mkdir(parents=True, exist_ok=True)
    with Archive(upload) as archive:
        files = [m for m in archive.members if not _skipped(m.path)]
        total = sum(m.size for m in files)
        if total > limits.max_ingest_bytes:
            raise InvalidRequest(f"the archive holds {total} bytes of files, over the per-ingest limit of "
                                 f"{limits.max_ingest_bytes} (DEEPPOD_DATA_MAX_INGEST_BYTES): split it")
        prefix = strip_common_root([m.path for m in files])
        items: list[tuple[str, Member]] = [(m.path[len(prefix):], m) for m in files]
        if text.is_text([rel for rel, _ in items]):
            built = Built()
            text.build(items, out, objects, policy, max_line=limits.max_file_bytes, built=built)
            return built
        label_files = [(rel, m) for rel, m in items if rel in LABEL_FILES]
        labels: dict[str, str] | None = None
        if label_files:
            labels = {}
            for rel, m in label_files:
                labels.update(parse_labels(rel, m.read()))
        items = [(rel, m) for rel, m in items if rel not in LABEL_FILES]
        return _build(items, labels, out, objects, policy, limits, threads or min(8, os.cpu_count() or 1))


def _label(rel: str, labels: dict[str, str] | None) -> tuple[str | None, str | None]:
    if labels is not None:
        if rel in labels:
            return labels[rel], None
        return None, "not listed in labels.csv/labels.jsonl"
    if "/" not in rel:
        return None, "no label: put the file in a class folder, or list it in labels.csv"
    return rel.split("/", 1)[0], None


def _build(items, labels, out: Path, objects: ObjectStore, policy: Policy, limits: Limits, threads: int) -> Built:
    built = Built()
    quarantined: list[dict] = []
    candidates = []
    # labels.csv rows naming files the source does not hold: reported, never silently dropped
    orphans = sorted(set(labels) - {rel for rel, _ in items}) if labels else []
    for rel, m in items:
        label, why = _label(rel, labels)
        if why:
            quarantined.append({"path": rel, "reason": why, "_member": m})
        elif m.size > limits.max_file_bytes:
            quarantined.append({"path": rel, "reason": f"{m.size} bytes is over the per-file limit of "
                                f"{limits.max_file_bytes} (DEEPPOD_DATA_MAX_FILE_BYTES)", "_member": None})
        else:
            candidates.append((rel, label, m))
    classes = sorted({label for _, label, _ in candidates})
    side = splits([(rel, label) for rel, label, _ in candidates], policy)  # exact per class
    index = {c: i for i, c in enumerate(classes)}
    writer = ShardWriter(out)
    sizes, formats, per_class, per_split = Counter(), Counter(), Counter(), Counter()
    widths, heights = [], []
    seen_new: set[str] = set()

    # Reads happen on this thread (archives are not thread-safe); decoding and the policy in the pool.
    with ThreadPoolExecutor(threads) as pool, open(out / "manifest.jsonl", "w") as manifest:
        for start in range(0, len(candidates), 64):
            chunk = [(rel, label, _Loaded(m.read())) for rel, label, m in candidates[start:start + 64]]
            for rel, label, data, why, result in pool.map(functools.partial(_prepare, policy=policy), chunk):
                if why:
                    quarantined.append({"path": rel, "reason": why, "_data": data})
                    continue
                fmt, pieces = result
                split = side[rel]
                for suffix, stored, w, h in pieces:
                    sha = hashlib.sha256(stored).hexdigest()
                    if sha not in seen_new:
                        seen_new.add(sha)
                        # written either way (beside the version, not in it): an ingest of bytes another
                        # tenant holds costs what any other does, so its time says nothing of theirs
                        known = objects.has(sha)
                        objects.stage(out.parent, sha, stored, known=known)
                        if not known:
                            built.new_objects.append(sha)
                    writer.add(stored, index[label], split, w, h)
                    row = {"path": rel + suffix, "label": label, "bytes": len(stored), "sha256": sha,
                           "md5": hashlib.md5(stored).hexdigest(),  # the object's ETag through S3
                           "width": w, "height": h, "split": split}
                    manifest.write(json.dumps(row) + "\n")
                    built.samples += 1
                    built.bytes += len(stored)
                    sizes[next(name for limit, name in SIZE_BUCKETS if len(stored) < limit)] += 1
                    formats[fmt] += 1
                    per_class[label] += 1
                    per_split[split] += 1
                    widths.append(w)
                    heights.append(h)
    writer.close(out)
    (out / "classes.json").write_text(json.dumps(classes))
    report = _keep_quarantined(quarantined, out / "quarantine")
    built.classes = classes
    built.report = {"quarantined": report, "ingested": built.samples, "labels_without_file": orphans}
    built.stats = {
        "samples": built.samples, "bytes": built.bytes, "classes": len(classes),
        "per_class": {c: per_class[c] for c in classes}, "per_split": dict(per_split),
        "size_histogram": {name: sizes[name] for _, name in SIZE_BUCKETS},
        "formats": dict(formats),
        "width": _summary(widths), "height": _summary(heights), "quarantined": len(report),
    }
    (out / "report.json").write_text(json.dumps(built.report, indent=1))
    (out / "stats.json").write_text(json.dumps(built.stats, indent=1))
    write_checksums(out)
    return built


def _prepare(item, policy: Policy):
    """One candidate, in the pool: decoded and the policy applied, or why not."""
    rel, label, m = item
    data = m.read()
    im, why = _decode(data)
    if why:
        return rel, label, data, why, None
    try:
        return rel, label, data, None, (im.format, apply(im, data, policy))
    except Exception as exc:
        return rel, label, data, f"policy could not be applied: {exc}", None


def _keep_quarantined(quarantined: list[dict], folder: Path) -> list[dict]:
    """Copy each refused file into the version's quarantine folder; the report's rows."""
    report = []
    for q in quarantined:
        data = q.pop("_data", None)
        member = q.pop("_member", None)
        if data is None and member is not None:
            data = member.read()
        if data is not None:
            dest = folder / q["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        report.append(q)
    return report


class _Loaded:
    """A member already read on the reading thread."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self) -> bytes:
        return self.data


def _summary(values: list[int]) -> dict:
    if not values:
        return {}
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 1)}
