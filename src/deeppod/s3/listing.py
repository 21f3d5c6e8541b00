"""Listings as S3 gives them: ListBuckets, ListObjects (V1 and V2: prefix, delimiter, pages of
at most max-keys, continuation tokens, start-after, URL encoding), ListParts,
ListMultipartUploads, and the bodies of DeleteObjects and CompleteMultipartUpload."""

from __future__ import annotations

import base64
import bisect
from dataclasses import dataclass, field
from urllib.parse import quote
from xml.sax.saxutils import escape

from deeppod.errors import S3Error
from deeppod.s3 import xml
from deeppod.s3.namespace import Entry

CREATED = "2026-01-01T00:00:00.000Z"  # the buckets are fixed: one creation date for all
MAX_KEYS = 1000
OWNER = "<Owner><ID>deeppod</ID><DisplayName>deeppod</DisplayName></Owner>"  # every object's: one owner here


def buckets(names) -> bytes:
    body = OWNER + "<Buckets>"
    body += "".join(f"<Bucket>{xml.element('Name', n)}{xml.element('CreationDate', CREATED)}</Bucket>"
                                  for n in names) + "</Buckets>"
    return xml.document("ListAllMyBucketsResult", body)


@dataclass
class Page:
    contents: list[Entry] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_marker: str = ""  # the last key or common prefix of this page


def _max_keys(q: dict) -> int:
    raw = q.get("max-keys", str(MAX_KEYS))
    if not raw.lstrip("-").isdigit() or int(raw) < 0:
        raise S3Error("InvalidArgument", "max-keys must be a non-negative integer")
    return min(int(raw), MAX_KEYS)


def _token(q: dict) -> str:
    if "continuation-token" in q:
        try:
            return base64.urlsafe_b64decode(q["continuation-token"].encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise S3Error("InvalidArgument", "the continuation token is not one this server gave") from None
    return ""


def page(entries: list[Entry], q: dict) -> Page:
    """One page of ``entries`` (sorted by their keys' bytes, as S3 orders them) under q's
    prefix, delimiter, marker and max-keys."""
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    v2 = q.get("list-type") == "2"
    after = max(_token(q), q.get("start-after", "")) if v2 else q.get("marker", "")
    limit = _max_keys(q)
    out = Page()
    if limit == 0:  # S3 answers an empty page, not a truncated one
        return out
    seen_prefixes = set()
    first = bisect.bisect_right(entries, after.encode(), key=lambda e: e.key.encode()) if after else 0
    count = 0
    for e in entries[first:]:
        if not e.key.startswith(prefix):
            continue
        if delimiter:
            cut = e.key.find(delimiter, len(prefix))
            if cut >= 0:
                common = e.key[:cut + len(delimiter)]
                if common in seen_prefixes or common.encode() <= after.encode():
                    continue
                if count == limit:
                    out.truncated = True
                    break
                seen_prefixes.add(common)
                out.prefixes.append(common)
                out.next_marker = common
                count += 1
                continue
        if count == limit:
            out.truncated = True
            break
        out.contents.append(e)
        out.next_marker = e.key
        count += 1
    return out


def render(bucket: str, q: dict, p: Page, etag_of) -> bytes:
    v2 = q.get("list-type") == "2"
    url = q.get("encoding-type") == "url"
    enc = (lambda s: quote(s, safe="/")) if url else (lambda s: s)
    # ListObjects (v1) sends its Prefix back as it came, encoding-type or not (AWS does, and
    # botocore decodes only Delimiter, Marker and NextMarker there)
    body = xml.element("Name", bucket) + xml.element("Prefix", enc(q.get("prefix", "")) if v2 else q.get("prefix", ""))
    if q.get("delimiter"):
        body += xml.element("Delimiter", enc(q["delimiter"]))
    body += xml.element("MaxKeys", _max_keys(q))
    if url:
        body += xml.element("EncodingType", "url")
    body += xml.element("IsTruncated", p.truncated)
    if v2:
        body += xml.element("KeyCount", len(p.contents) + len(p.prefixes))
        if "continuation-token" in q:
            body += xml.element("ContinuationToken", q["continuation-token"])
        if "start-after" in q:
            body += xml.element("StartAfter", enc(q["start-after"]))
        if p.truncated:
            body += xml.element("NextContinuationToken", base64.urlsafe_b64encode(p.next_marker.encode()).decode())
    else:
        body += xml.element("Marker", enc(q.get("marker", "")))
        if p.truncated and q.get("delimiter"):
            body += xml.element("NextMarker", enc(p.next_marker))
    owner = OWNER if not v2 or q.get("fetch-owner") == "true" else ""
    rows = [body]
    for e in p.contents:  # the page's bulk: plain string work, escaping only keys
        rows.append(f"<Contents><Key>{escape(enc(e.key))}</Key><LastModified>{xml.iso(e.mtime)}</LastModified>"
                    f"<ETag>&quot;{etag_of(e)}&quot;</ETag><Size>{e.size}</Size>{owner}"
                    "<StorageClass>STANDARD</StorageClass></Contents>")
    rows += [f"<CommonPrefixes><Prefix>{escape(enc(c))}</Prefix></CommonPrefixes>" for c in p.prefixes]
    return xml.document("ListBucketResult", "".join(rows))


def completed_parts(body: bytes) -> list[tuple[int, str, dict]]:
    """(number, ETag, {"sha256": checksum, ...}) of each Part a CompleteMultipartUpload lists."""
    root = xml.parse(body, "CompleteMultipartUpload")
    out = []
    for part in root.findall("Part"):
        number, etag = part.findtext("PartNumber"), part.findtext("ETag")
        if not (number or "").strip().isdigit() or etag is None:
            raise S3Error("MalformedXML", "each Part needs a PartNumber and an ETag")
        sums = {child.tag.removeprefix("Checksum").lower(): (child.text or "").strip() for child in part
                if child.tag.startswith("Checksum")}
        out.append((int(number), etag.strip(), sums))
    return out


def delete_request(body: bytes) -> tuple[list[str], bool]:
    root = xml.parse(body, "Delete")
    keys = [o.findtext("Key") or "" for o in root.findall("Object")]
    if not keys or len(keys) > 1000:
        raise S3Error("MalformedXML", "DeleteObjects takes 1 to 1000 keys")
    return keys, (root.findtext("Quiet") or "").strip().lower() == "true"


def deleted(done: list[str], failed: list[tuple[str, str, str]], quiet: bool) -> bytes:
    body = "" if quiet else "".join(f"<Deleted>{xml.element('Key', k)}</Deleted>" for k in done)
    body += "".join(f"<Error>{xml.element('Key', k)}{xml.element('Code', c)}{xml.element('Message', m)}</Error>"
                    for k, c, m in failed)
    return xml.document("DeleteResult", body)


def parts(bucket: str, key: str, upload_id: str, have, sums: dict[int, str] | None = None) -> bytes:
    """ListParts; ``sums``: each part's checksums as XML elements (ChecksumSHA256...)."""
    body = xml.element("Bucket", bucket) + xml.element("Key", key) + xml.element("UploadId", upload_id)
    body += xml.element("PartNumberMarker", 0) + xml.element("MaxParts", 10000) + xml.element("IsTruncated", False)
    for number, size, etag, mtime in have:
        body += ("<Part>" + xml.element("PartNumber", number) + xml.element("LastModified", xml.iso(mtime))
                 + xml.element("ETag", f'"{etag}"') + xml.element("Size", size) + (sums or {}).get(number, "")
                 + "</Part>")
    return xml.document("ListPartsResult", body)


def uploads(ns, tenant_id: int, bucket: str) -> bytes:
    body = xml.element("Bucket", bucket) + xml.element("IsTruncated", False)
    root = ns.uploads_root(tenant_id)
    for folder in sorted(root.iterdir()) if root.is_dir() and bucket == "inbox" else ():
        key_file = folder / "key"
        if key_file.is_file():
            body += ("<Upload>" + xml.element("Key", key_file.read_text()) + xml.element("UploadId", folder.name)
                     + xml.element("Initiated", xml.iso(folder.stat().st_mtime)) + "</Upload>")
    return xml.document("ListMultipartUploadsResult", body)
