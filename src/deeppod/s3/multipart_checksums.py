"""A multipart upload's checksum, as S3 keeps it: the algorithm named when the upload starts
(``x-amz-checksum-algorithm``, and ``x-amz-checksum-type`` COMPOSITE or FULL_OBJECT), each
part's checksum checked as it arrives, and at completion either the checksum of the parts'
checksums ("...-N", COMPOSITE) or, for CRC32, the whole object's (FULL_OBJECT), which current
SDKs check every download against.

CRC32, SHA-1 and SHA-256 are computed here; an upload naming another algorithm (CRC32C,
CRC64NVME) completes without a checksum, as a single PUT does.
"""

from __future__ import annotations

import base64
import hashlib
import zlib

from deeppod.errors import S3Error

COMPUTED = {"CRC32": "crc32", "SHA1": "sha1", "SHA256": "sha256"}
TYPES = ("COMPOSITE", "FULL_OBJECT")


def requested(headers) -> dict:
    """What a CreateMultipartUpload asks for: {"algorithm", "type"}, or {} for none (or one
    not computed here)."""
    algorithm = headers.get("x-amz-checksum-algorithm", "").strip().upper()
    kind = headers.get("x-amz-checksum-type", "").strip().upper()
    if kind and kind not in TYPES:
        raise S3Error("InvalidRequest", f"x-amz-checksum-type must be COMPOSITE or FULL_OBJECT, not {kind!r}")
    if algorithm not in COMPUTED:
        return {}
    kind = kind or "COMPOSITE"
    if kind == "FULL_OBJECT" and algorithm != "CRC32":
        raise S3Error("InvalidRequest", f"a FULL_OBJECT checksum is a CRC: {algorithm} uploads are COMPOSITE")
    return {"algorithm": algorithm, "type": kind}


def header(spec: dict) -> str:
    return f"x-amz-checksum-{COMPUTED[spec['algorithm']]}"


def part_value(spec: dict, checksums: dict) -> str:
    """A part's checksum under the upload's algorithm, from what the part's PUT checked; a part
    sent without one is refused (every part of a checksummed upload carries it)."""
    value = checksums.get(header(spec))
    if value is None:
        raise S3Error("InvalidRequest", f"this upload's parts each need {header(spec)}: it was started with "
                      f"x-amz-checksum-algorithm {spec['algorithm']}")
    return value


def check_listed(spec: dict, number: int, listed: dict, stored: str | None) -> None:
    """A part's checksum, if a CompleteMultipartUpload lists one, is the one that part arrived
    with (listing none is allowed: the part was checked as it arrived)."""
    given = listed.get(COMPUTED[spec["algorithm"]])
    if stored is None or (given is not None and given.strip() != stored):
        raise S3Error("BadDigest", f"part {number}'s {spec['algorithm']} checksum is not the one it was uploaded "
                      "with: list each part with the checksum its UploadPart returned")


def combine(spec: dict, part_values: list[str], whole_crc32: int) -> str:
    """The object's checksum: of the parts' checksums (COMPOSITE, "-N") or of every byte
    (FULL_OBJECT: ``whole_crc32``, computed while the parts were joined)."""
    if spec["type"] == "FULL_OBJECT":
        return base64.b64encode(whole_crc32.to_bytes(4, "big")).decode()
    raw = b"".join(base64.b64decode(v) for v in part_values)
    if spec["algorithm"] == "CRC32":
        digest = zlib.crc32(raw).to_bytes(4, "big")
    else:
        digest = hashlib.new(COMPUTED[spec["algorithm"]], raw).digest()
    return f"{base64.b64encode(digest).decode()}-{len(part_values)}"


def check_expected(spec: dict, headers, value: str) -> None:
    """A CompleteMultipartUpload may say what the object's checksum must be."""
    expected = headers.get(header(spec))
    if expected is not None and expected.strip().split("-")[0] != value.split("-")[0]:
        raise S3Error("BadDigest", f"the {header(spec)} you specified is not the object's ({value}): nothing "
                      "was completed")
