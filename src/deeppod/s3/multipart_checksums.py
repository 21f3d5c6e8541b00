"""A multipart upload's checksum, as S3 keeps it: the algorithm named when the upload starts
(``x-amz-checksum-algorithm``, and ``x-amz-checksum-type`` COMPOSITE or FULL_OBJECT), each
part's checksum checked as it arrives, and at completion either the checksum of the parts'
checksums ("...-N", COMPOSITE) or, for a CRC, the whole object's (FULL_OBJECT), which current
SDKs check every download against. CRC64NVME is FULL_OBJECT only, as on S3.
"""

from __future__ import annotations

import base64
import hashlib

from deeppod.errors import S3Error
from deeppod.s3 import crc

COMPUTED = {"CRC32": "crc32", "CRC32C": "crc32c", "CRC64NVME": "crc64nvme", "SHA1": "sha1", "SHA256": "sha256"}
TYPES = ("COMPOSITE", "FULL_OBJECT")


def requested(headers) -> dict:
    """What a CreateMultipartUpload asks for: {"algorithm", "type"}, or {} for none."""
    algorithm = headers.get("x-amz-checksum-algorithm", "").strip().upper()
    kind = headers.get("x-amz-checksum-type", "").strip().upper()
    if kind and kind not in TYPES:
        raise S3Error("InvalidRequest", f"x-amz-checksum-type must be COMPOSITE or FULL_OBJECT, not {kind!r}")
    if not algorithm:
        return {}
    if algorithm not in COMPUTED:
        raise S3Error("InvalidRequest", f"x-amz-checksum-algorithm must be one of {', '.join(COMPUTED)}, "
                      f"not {algorithm!r}")
    kind = kind or ("FULL_OBJECT" if algorithm == "CRC64NVME" else "COMPOSITE")
    if kind == "FULL_OBJECT" and COMPUTED[algorithm] not in crc.WIDTH:
        raise S3Error("InvalidRequest", f"a FULL_OBJECT checksum is a CRC: {algorithm} uploads are COMPOSITE")
    if kind == "COMPOSITE" and algorithm == "CRC64NVME":
        raise S3Error("InvalidRequest", "CRC64NVME uploads are FULL_OBJECT (the whole object's CRC)")
    return {"algorithm": algorithm, "type": kind}


def whole_crc(spec: dict) -> str | None:
    """The CRC to compute over every byte as the parts are joined (FULL_OBJECT), or None."""
    return COMPUTED[spec["algorithm"]] if spec.get("type") == "FULL_OBJECT" else None


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


def combine(spec: dict, part_values: list[str], whole: int) -> str:
    """The object's checksum: of the parts' checksums (COMPOSITE, "-N") or of every byte
    (FULL_OBJECT: ``whole``, the CRC computed while the parts were joined)."""
    name = COMPUTED[spec["algorithm"]]
    if spec["type"] == "FULL_OBJECT":
        return crc.encode(name, whole)
    raw = b"".join(base64.b64decode(v) for v in part_values)
    value = crc.encode(name, crc.update(name, raw, 0)) if name in crc.WIDTH else \
        base64.b64encode(hashlib.new(name, raw).digest()).decode()
    return f"{value}-{len(part_values)}"


def check_expected(spec: dict, headers, value: str) -> None:
    """A CompleteMultipartUpload may say what the object's checksum must be."""
    expected = headers.get(header(spec))
    if expected is not None and expected.strip().split("-")[0] != value.split("-")[0]:
        raise S3Error("BadDigest", f"the {header(spec)} you specified is not the object's ({value}): nothing "
                      "was completed")
