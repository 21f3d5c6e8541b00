"""An inbox object's metadata, as S3 keeps it: the headers a PUT (or a multipart upload's
start, or a copy) gave it (Content-Type, Content-Encoding, Content-Disposition,
Content-Language, Cache-Control, Expires) and its user metadata (``x-amz-meta-*``, 2 KB at
most), returned on every GET and HEAD, with a signed GET's ``response-*`` overrides on top.

Kept with the file, as its ETag is: an extended attribute, or where the file system keeps
none, a hidden file beside it (``.NAME.meta``). Objects of the read-only buckets have none:
their Content-Type is guessed from the key. A multipart object also records its parts' sizes,
so a GET of one part (``partNumber``) can answer it.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
from pathlib import Path

from deeppod.errors import S3Error

STORED = ("content-type", "content-encoding", "content-disposition", "content-language", "cache-control", "expires")
USER = "x-amz-meta-"
MAX_USER_BYTES = 2048  # S3's limit on user metadata
PARTS = "parts"  # the record's part sizes (a multipart object), not a header
CHECKSUMS = "checksums"  # the checksums checked at upload ({"x-amz-checksum-crc32": ...}), sent when asked
PART_CHECKSUMS = "part_checksums"  # a checksummed multipart object's parts' own, in order
XATTR = "user.deeppod.meta"
SUFFIX = ".meta"
OVERRIDES = {"response-content-type": "content-type", "response-content-language": "content-language",
             "response-expires": "expires", "response-cache-control": "cache-control",
             "response-content-disposition": "content-disposition",
             "response-content-encoding": "content-encoding"}


def from_request(headers) -> dict:
    """What of a request's headers the object keeps."""
    meta = {k: headers[k] for k in STORED if k in headers}
    if "content-encoding" in meta:  # aws-chunked names the upload's framing, not the object's encoding
        kept = [c.strip() for c in meta["content-encoding"].split(",") if c.strip().lower() != "aws-chunked"]
        meta["content-encoding"] = ", ".join(kept)
        if not kept:
            del meta["content-encoding"]
    user = {k: v for k, v in headers.items() if k.startswith(USER)}
    if sum(len(k) - len(USER) + len(v) for k, v in user.items()) > MAX_USER_BYTES:
        raise S3Error("MetadataTooLarge", f"your metadata headers exceed the maximum allowed metadata size "
                      f"({MAX_USER_BYTES} bytes of x-amz-meta-* names and values)")
    return {**meta, **user}


def sidecar(path: Path) -> Path:
    return path.with_name("." + path.name + SUFFIX)


def write(path: Path, meta: dict, dest: Path) -> None:
    """Keep ``meta`` with the file ``path`` that is about to become ``dest`` (replacing what
    ``dest`` had)."""
    raw = json.dumps(meta, separators=(",", ":")).encode()
    try:
        if meta:
            os.setxattr(path, XATTR, raw)
        sidecar(dest).unlink(missing_ok=True)
    except OSError:
        sidecar(dest).write_bytes(raw)


def read(path: Path | str) -> dict:
    try:
        raw = os.getxattr(path, XATTR, follow_symlinks=False)
    except OSError:
        try:
            raw = sidecar(Path(path)).read_bytes()
        except OSError:
            return {}
    try:
        meta = json.loads(raw)
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def headers(meta: dict, key: str, query: dict) -> list[tuple[bytes, bytes]]:
    """The GET or HEAD answer's headers for an object with ``meta``."""
    out = {"content-type": mimetypes.guess_type(key)[0] or "application/octet-stream"}
    out.update({k: v for k, v in meta.items() if k in STORED or k.startswith(USER)})
    for name, header in OVERRIDES.items():
        if name in query:
            # a query parameter's value decoded: a control character would end the header early
            if any(ord(c) < 32 or ord(c) == 127 for c in query[name]):
                raise S3Error("InvalidArgument", f"{name} holds a control character")
            out[header] = query[name]
    return [(k.encode(), _value(str(v))) for k, v in out.items()]


def _value(text: str) -> bytes:
    """A header value as a client reads it back. A request's headers arrive decoded as latin-1,
    and botocore sends a non-ASCII value as its UTF-8 bytes but decodes answers as latin-1: the
    value it meant goes back as latin-1 where it can ("Hello World\xe9" round-trips), else
    RFC 2047-encoded, as S3 sends non-ASCII metadata."""
    if text.isascii():
        return text.encode()
    try:
        meant = text.encode("latin-1").decode("utf-8")
    except UnicodeError:  # not UTF-8 on the wire (raw latin-1 bytes, or a decoded query value)
        meant = text
    try:
        return meant.encode("latin-1")
    except UnicodeEncodeError:
        return f"=?UTF-8?B?{base64.b64encode(meant.encode()).decode()}?=".encode()


def checksum_headers(meta: dict, part: int | None = None) -> list[tuple[bytes, bytes]]:
    """The checksums checked at upload, for an answer that is the whole object, or (``part``) the
    checksum of that part of a checksummed multipart object (part 1 of an object put whole is
    all of it: its own checksums)."""
    sums = dict(meta.get(CHECKSUMS) or {})
    if part is not None and (meta.get(PARTS) or part != 1):
        parts = meta.get(PART_CHECKSUMS) or []
        if not 1 <= part <= len(parts):
            return []
        sums = {k: (parts[part - 1] if k != "x-amz-checksum-type" else v) for k, v in sums.items()}
    return [(k.encode(), str(v).encode()) for k, v in sums.items()]


def part_range(meta: dict, number: int, size: int) -> tuple[int, int, int]:
    """(first byte, last byte, parts) of part ``number``: a multipart object's recorded part, or
    part 1 of any other object being the whole of it."""
    sizes = meta.get(PARTS) or [size]
    if not 1 <= number <= len(sizes):
        raise S3Error("InvalidPart", f"the object has {len(sizes)} part(s); part {number} is not one of them")
    start = sum(sizes[:number - 1])
    return start, start + sizes[number - 1] - 1, len(sizes)
