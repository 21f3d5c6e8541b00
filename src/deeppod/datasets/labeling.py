"""Labeling a version: every image with its label (and the images quarantined for having
none), and the corrected labels written as the archive of the next version. Versions stay
immutable: a correction is a new version whose lineage names the version it came from and
the model that proposed labels."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from deeppod.datasets.archive import safe_path
from deeppod.datasets.images import VersionImages
from deeppod.errors import InvalidRequest, NotFound

NO_LABEL = ("no label", "not listed in labels")  # quarantine reasons of images that only lack a label


@dataclass(frozen=True)
class Item:
    key: str  # "i:N" (image N of the version) or "q:PATH" (a quarantined, unlabeled file)
    path: str
    label: str | None


class Workspace:
    """One version's images as labeling sees them."""

    def __init__(self, folder: Path, report: dict):
        self.folder = folder
        self.images = VersionImages(folder)
        self.unlabeled = [q["path"] for q in (report or {}).get("quarantined", [])
                          if str(q.get("reason", "")).startswith(NO_LABEL)]

    def items(self) -> list[Item]:
        out = [Item(f"i:{i}", r["path"], r["label"]) for i, r in enumerate(self.images.rows)]
        return out + [Item(f"q:{p}", p, None) for p in self.unlabeled]

    def read(self, key: str) -> bytes:
        kind, _, rest = key.partition(":")
        if kind == "i" and rest.isdigit():
            return self.images.read(int(rest))
        if kind == "q" and rest in self.unlabeled:
            try:
                return (self.folder / "quarantine" / safe_path(rest)).read_bytes()
            except OSError:
                raise NotFound(f"the unlabeled file {rest!r} is not kept with this version") from None
        raise NotFound(f"{key!r} is not an image of this version: use i:N for image N, q:PATH for an unlabeled file")

    def write_archive(self, changes: dict[str, str | None], out: Path) -> dict:
        """The next version's archive: every image at its path, with its label after
        ``changes`` (key -> label; None drops the image; unlabeled files join once labeled and
        are kept unlabeled otherwise), listed in labels.jsonl. What changed, counted."""
        items = {it.key: it for it in self.items()}
        unknown = sorted(set(changes) - set(items))
        if unknown:
            raise InvalidRequest(f"{len(unknown)} labels name no image of this version (e.g. {unknown[0]!r}): "
                                 "reload the page and label again")
        for key, label in changes.items():
            if label is not None and (not isinstance(label, str) or not label.strip() or "/" in label
                                      or len(label) > 128):
                raise InvalidRequest(f"label {label!r} for {items[key].path} is not a class name: use 1-128 "
                                     "characters, no '/'")
        counts = {"relabeled": 0, "labeled": 0, "dropped": 0, "images": 0}
        rows = []
        with tarfile.open(out, "w") as tar:
            for key, it in items.items():
                label = changes[key] if key in changes else it.label
                if label is None and (key in changes or it.label is not None):  # dropped
                    counts["dropped"] += 1
                    continue
                data = self.read(key)
                info = tarfile.TarInfo(it.path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                if label is None:  # still unlabeled: kept, and quarantined again for it
                    continue
                label = label.strip()
                if label != it.label:
                    counts["labeled" if it.label is None else "relabeled"] += 1
                rows.append({"path": it.path, "label": label})
                counts["images"] += 1
            if not rows:
                raise InvalidRequest("every image would be dropped: keep at least one")
            listing = "".join(json.dumps(r) + "\n" for r in rows).encode()
            info = tarfile.TarInfo("labels.jsonl")
            info.size = len(listing)
            tar.addfile(info, io.BytesIO(listing))
        return counts
