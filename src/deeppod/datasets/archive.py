"""Reading an uploaded archive (tar, tar.gz or zip) safely, and finding each file's label.

Anything that could write or read outside the dataset is refused before a byte is
ingested: absolute paths, ``..`` components, symlinks and hard links, device files; and so
are names with control characters.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from deeppod.errors import InvalidRequest

LABEL_FILES = ("labels.csv", "labels.jsonl")
UPLOADED_LINES = "upload.jsonl"  # the name a JSON Lines body's lines are reported under
# C0, DEL and C1: no name of a dataset's file holds one (nor an S3 key: s3.namespace.request_key)
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")


@dataclass
class Member:
    path: str  # relative, POSIX, checked
    size: int
    read: Callable[[], bytes]
    open: Callable[[], BinaryIO] | None = None  # streamed (a text dataset's lines); None: read() whole

    def stream(self) -> BinaryIO:
        return self.open() if self.open is not None else io.BytesIO(self.read())


def safe_path(name: str) -> str:
    """A member name as a relative POSIX path, or an error naming the offending entry."""
    raw = name.replace("\\", "/")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise InvalidRequest(f"archive entry {name!r} has an absolute path; an archive may only hold relative "
                             "paths (re-create it from inside the folder)")
    if m := CONTROL_CHARACTERS.search(raw):
        raise InvalidRequest(f"archive entry {name!r} has the control character U+{ord(m.group()):04X} in its name; "
                             "rename the file without control characters and upload again")
    parts = [p for p in PurePosixPath(raw).parts if p not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"archive entry {name!r} climbs out of the archive with '..' (zip-slip); "
                             "remove it and upload again")
    return "/".join(parts)


def kind_of(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):
        return "jsonl"  # one JSON Lines file as the body: a text dataset (datasets/text.py)
    raise InvalidRequest("the upload is not a tar, tar.gz or zip archive, nor JSON Lines; send one of those "
                         "(deeppod data ingest packs folders for you)")


class Archive:
    """The checked members of an archive, listed up front; read them while it is open."""

    def __init__(self, path: Path):
        self.kind = "folder" if path.is_dir() else kind_of(path)
        self._zip = self._tar = None
        try:
            if self.kind == "folder":  # an S3 inbox (s3/namespace.py): only the server writes there
                self.members = list(_folder_members(path))
            elif self.kind == "jsonl":
                self.members = [Member(UPLOADED_LINES, path.stat().st_size, path.read_bytes,
                                       lambda: open(path, "rb"))]
            elif self.kind == "zip":
                self._zip = zipfile.ZipFile(path)
                self.members = list(self._zip_members())
            else:
                self._tar = tarfile.open(path, "r:*")
                self.members = list(self._tar_members())
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
            self.close()
            raise InvalidRequest(f"the {self.kind} archive is damaged ({exc}); upload it again") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for f in (self._zip, self._tar):
            if f is not None:
                f.close()

    def _tar_members(self) -> Iterator[Member]:
        tar = self._tar
        for info in tar:
            rel = safe_path(info.name)
            if info.issym() or info.islnk():
                raise InvalidRequest(f"archive entry {info.name!r} is a link (to {info.linkname!r}); links are "
                                     "refused because they can point outside the dataset: copy the file instead")
            if info.isdir() or not rel:
                continue
            if not info.isfile():
                raise InvalidRequest(f"archive entry {info.name!r} is not a regular file; remove it")
            yield Member(rel, info.size, lambda info=info: tar.extractfile(info).read(),
                         lambda info=info: tar.extractfile(info))

    def _zip_members(self) -> Iterator[Member]:
        zf = self._zip
        for info in zf.infolist():
            rel = safe_path(info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise InvalidRequest(f"archive entry {info.filename!r} is a symlink; links are refused because "
                                     "they can point outside the dataset: copy the file instead")
            if info.is_dir() or not rel:
                continue
            yield Member(rel, info.file_size, lambda info=info: zf.read(info), lambda info=info: zf.open(info))


def strip_common_root(paths: list[str]) -> str:
    """The single top folder every entry shares (archives of a folder usually have one), or ''."""
    tops = {p.split("/", 1)[0] for p in paths}
    if len(tops) == 1 and all("/" in p for p in paths):
        top = tops.pop()
        inner = [p.split("/", 1)[1] for p in paths]
        if any("/" in p for p in inner) or any(p in LABEL_FILES for p in inner):
            return top + "/"
    return ""


def parse_labels(name: str, data: bytes) -> dict[str, str]:
    """labels.csv (path,label; a header row is optional) or labels.jsonl ({"path", "label"})."""
    text = data.decode("utf-8-sig", errors="replace")
    out: dict[str, str] = {}
    if name.endswith(".jsonl"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out[safe_path(str(row["path"]))] = str(row["label"])
            except (ValueError, KeyError, TypeError):
                raise InvalidRequest(f"{name} line {n} is not a JSON object with 'path' and 'label': {line[:80]!r}")
        return out
    rows = list(csv.reader(io.StringIO(text)))
    if rows and [c.strip().lower() for c in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]
    for n, row in enumerate(rows, 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2 or not row[1].strip():
            raise InvalidRequest(f"{name} row {n} needs two columns, path and label: {row!r}")
        out[safe_path(row[0].strip())] = row[1].strip()
    return out


def _folder_members(root: Path) -> Iterator[Member]:
    for folder, dirs, files in os.walk(root):  # os.walk does not follow links into folders
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise InvalidRequest(f"{path.relative_to(root)} is not a regular file; remove it")
            yield Member(safe_path(path.relative_to(root).as_posix()), st.st_size, path.read_bytes,
                         lambda path=path: open(path, "rb"))
