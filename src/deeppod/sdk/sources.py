"""Turning an ingest SOURCE into the byte stream the server ingests (client side).

A folder is packed into a tar on the fly (no temporary copy), an S3 prefix likewise while
it downloads; a .zip or .tar(.gz) file is sent as it is. The server re-checks everything.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deeppod.errors import InvalidRequest

CHUNK = 1 << 20
Progress = Callable[[int, int, int, int], None]  # files done, files total, bytes done, bytes total


@dataclass
class Source:
    description: str
    files: int
    bytes: int
    content_type: str
    chunks: Callable[[Progress | None], Iterator[bytes]]
    length: int  # exactly what chunks() yields: sent as the Content-Length (the server reads such a body off its loop)


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = size, 0o644, tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _pad(size: int) -> bytes:
    return b"\0" * ((512 - size % 512) % 512)


def _tar_length(members: list[tuple[str, int]]) -> int:
    """The length of what _tar_stream yields for these (name, size) members."""
    return sum(len(_header(name, size)) + size + len(_pad(size)) for name, size in members) + 1024


def _file_blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            yield block


def _tar_stream(members, progress: Progress | None) -> Iterator[bytes]:
    """A tar archive, member by member, as it is read: members are (name, size, blocks(), where)."""
    done_bytes, total = 0, sum(m[1] for m in members)
    for i, (name, size, blocks, where) in enumerate(members, 1):
        yield _header(name, size)
        sent = 0
        for block in blocks():
            block = block[: size - sent]
            sent += len(block)
            yield block
            if sent == size:
                break
        if sent != size:
            raise InvalidRequest(f"{where} changed size while it was being sent; ingest again")
        yield _pad(size)
        done_bytes += size
        if progress:
            progress(i, len(members), done_bytes, total)
    yield b"\0" * 1024


def _folder(root: Path) -> Source:
    root = root.resolve()
    entries = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for d in list(dirnames):
            full = Path(dirpath) / d
            if full.is_symlink():
                target = full.resolve()
                if not target.is_relative_to(root):
                    raise InvalidRequest(f"{full} is a symlink to {target}, outside {root}; links may not leave "
                                         "the source folder: copy the files in instead")
                dirnames.remove(d)  # inside the source: its files are already walked
        for f in sorted(filenames):
            full = Path(dirpath) / f
            if full.is_symlink():
                target = full.resolve()
                if not target.is_relative_to(root):
                    raise InvalidRequest(f"{full} is a symlink to {target}, outside {root}; links may not leave "
                                         "the source folder: copy the file in instead")
            if not full.is_file():
                continue
            entries.append((full.relative_to(root).as_posix(), full, full.stat().st_size))
    if not entries:
        raise InvalidRequest(f"{root} holds no files: point at a folder of class folders, or of images "
                             "plus labels.csv")

    def chunks(progress: Progress | None) -> Iterator[bytes]:
        return _tar_stream([(rel, size, lambda full=full: _file_blocks(full), str(full)) for rel, full,
                            size in entries],
                           progress)

    return Source(f"folder {root}", len(entries), sum(e[2] for e in entries), "application/x-tar", chunks,
                  _tar_length([(rel, size) for rel, _, size in entries]))


def _lines_file(path: Path) -> Source:
    """One JSON Lines file (a text dataset), sent as a tar that holds it."""
    path = path.resolve()
    size = path.stat().st_size

    def chunks(progress: Progress | None) -> Iterator[bytes]:
        return _tar_stream([(path.name, size, lambda: _file_blocks(path), str(path))], progress)

    return Source(f"file {path}", 1, size, "application/x-tar", chunks, _tar_length([(path.name, size)]))


def _archive(path: Path) -> Source:
    size = path.stat().st_size

    def chunks(progress: Progress | None) -> Iterator[bytes]:
        done = 0
        with open(path, "rb") as fh:
            while done < size and (block := fh.read(min(CHUNK, size - done))):
                done += len(block)
                if progress:
                    progress(0, 0, done, size)
                yield block
            if done != size or fh.read(1):
                raise InvalidRequest(f"{path} changed size while it was being sent; ingest again")

    kind = "application/zip" if path.suffix == ".zip" else "application/x-tar"
    return Source(f"archive {path.resolve()}", 0, size, kind, chunks, size)


def _s3(url: str, endpoint: str | None, key_id: str | None, secret: str | None) -> Source:
    try:
        import boto3
    except ImportError:
        raise InvalidRequest("s3:// sources need boto3: pip install boto3") from None
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise InvalidRequest(f"{url}: write s3://BUCKET/PREFIX")
    kw = {"endpoint_url": endpoint}  # the client resolves DEEPPOD_S3_ENDPOINT (settings.ClientSettings)
    if key_id or secret:
        kw.update(aws_access_key_id=key_id, aws_secret_access_key=secret)
    s3 = boto3.client("s3", **{k: v for k, v in kw.items() if v})
    base = prefix.rstrip("/") + "/" if prefix else ""
    objects = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(base):]
                if rel and not rel.endswith("/"):
                    objects.append((rel, obj["Key"], obj["Size"]))
    except Exception as exc:  # botocore raises many kinds; all mean the same to the user
        raise InvalidRequest(f"cannot list {url} ({exc}); check the bucket, the endpoint (--s3-endpoint) and "
                             "the keys (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from None
    if not objects:
        raise InvalidRequest(f"{url} holds no objects")

    def chunks(progress: Progress | None) -> Iterator[bytes]:
        return _tar_stream([(rel, size, lambda key=key: s3.get_object(Bucket=bucket,
                                                                      Key=key)["Body"].iter_chunks(CHUNK),
                             f"s3://{bucket}/{key}") for rel, key, size in objects], progress)

    return Source(url, len(objects), sum(o[2] for o in objects), "application/x-tar", chunks,
                  _tar_length([(rel, size) for rel, _, size in objects]))


def open_source(source: str, *, s3_endpoint: str | None = None, s3_key_id: str | None = None,
                s3_secret: str | None = None) -> Source:
    if source.startswith("s3://"):
        return _s3(source, s3_endpoint, s3_key_id, s3_secret)
    path = Path(source).expanduser()
    if path.is_dir():
        return _folder(path)
    if path.is_file():
        name = path.name.lower()
        if name.endswith((".zip", ".tar", ".tar.gz", ".tgz")):
            return _archive(path)
        if name.endswith(".jsonl"):
            return _lines_file(path)
        raise InvalidRequest(f"{path} is not a folder, .zip, .tar, .tar.gz or .jsonl (a text dataset): ingest "
                             "one of those")
    raise InvalidRequest(f"{source} does not exist: give a folder, an archive or s3://bucket/prefix")
