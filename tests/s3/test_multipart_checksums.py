"""A multipart upload's checksum as S3 computes it: of the parts' checksums ("-N") or, for a
CRC FULL_OBJECT, of every byte; what a CompleteMultipartUpload lists is checked. The CRCs are
checked against their published check values."""

import base64
import hashlib
import zlib

import pytest

from deeppod.errors import S3Error
from deeppod.s3 import multipart_checksums as mc


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_composite_and_full_object_checksums():
    parts = [b"A" * 10, b"B" * 7]
    sha = {"algorithm": "SHA256", "type": "COMPOSITE"}
    values = [b64(hashlib.sha256(p).digest()) for p in parts]
    assert mc.combine(sha, values, 0) == b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts))
                                             .digest()) + "-2"
    crc = {"algorithm": "CRC32", "type": "FULL_OBJECT"}
    whole = zlib.crc32(b"".join(parts))
    assert mc.combine(crc, [b64(zlib.crc32(p).to_bytes(4, "big")) for p in parts], whole) == \
        b64(whole.to_bytes(4, "big"))  # the checksum of the object itself: what SDKs check a download against
    mc.check_expected(sha, {"x-amz-checksum-sha256": mc.combine(sha, values, 0).split("-")[0]},
                      mc.combine(sha, values, 0))
    with pytest.raises(S3Error) as e:
        mc.check_expected(sha, {"x-amz-checksum-sha256": "bad"}, mc.combine(sha, values, 0))
    assert e.value.code == "BadDigest"


def test_what_an_upload_asks_for_and_what_completion_lists():
    assert mc.requested({"x-amz-checksum-algorithm": "sha256"}) == {"algorithm": "SHA256", "type": "COMPOSITE"}
    assert mc.requested({"x-amz-checksum-algorithm": "CRC64NVME"}) == {"algorithm": "CRC64NVME", "type": "FULL_OBJECT"}
    assert mc.requested({"x-amz-checksum-algorithm": "crc32c", "x-amz-checksum-type": "FULL_OBJECT"}) == \
        {"algorithm": "CRC32C", "type": "FULL_OBJECT"}
    assert mc.requested({}) == {}
    for bad in ({"x-amz-checksum-algorithm": "SHA256", "x-amz-checksum-type": "FULL_OBJECT"},
                {"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-type": "WHOLE"},
                {"x-amz-checksum-algorithm": "CRC64NVME", "x-amz-checksum-type": "COMPOSITE"},  # S3: full object only
                {"x-amz-checksum-algorithm": "MD5"}):
        with pytest.raises(S3Error):
            mc.requested(bad)
    spec = {"algorithm": "SHA256", "type": "COMPOSITE"}
    mc.check_listed(spec, 1, {"sha256": "abc="}, "abc=")
    mc.check_listed(spec, 1, {}, "abc=")  # listing none is allowed: the part was checked as it arrived
    for listed, stored in (({"sha256": "xyz="}, "abc="), ({"sha256": "abc="}, None)):
        with pytest.raises(S3Error) as e:
            mc.check_listed(spec, 1, listed, stored)
        assert e.value.code == "BadDigest"
    with pytest.raises(S3Error):
        mc.part_value(spec, {})  # a part of a checksummed upload without its checksum


def test_the_crcs_give_their_check_values_and_carry_over_pieces():
    """CRC-32C (Castagnoli) and CRC-64/NVME of "123456789" are 0xE3069283 and
    0xAE8B14860A799888 (their catalogues' check values), computed whole or in pieces."""
    from deeppod.s3 import crc

    for name, check in (("crc32", 0xCBF43926), ("crc32c", 0xE3069283), ("crc64nvme", 0xAE8B14860A799888)):
        assert crc.update(name, b"123456789", 0) == check
        assert crc.update(name, memoryview(b"6789"), crc.update(name, b"12345", 0)) == check
        assert base64.b64decode(crc.encode(name, check)) == check.to_bytes(crc.WIDTH[name], "big")
    parts = [b"A" * 10, b"B" * 7]
    composite = {"algorithm": "CRC32C", "type": "COMPOSITE"}
    values = [crc.encode("crc32c", crc.update("crc32c", p, 0)) for p in parts]
    joined = b"".join(base64.b64decode(v) for v in values)
    assert mc.combine(composite, values, 0) == crc.encode("crc32c", crc.update("crc32c", joined, 0)) + "-2"
    full = {"algorithm": "CRC64NVME", "type": "FULL_OBJECT"}
    assert mc.whole_crc(full) == "crc64nvme" and mc.whole_crc(composite) is None
    whole = crc.update("crc64nvme", b"".join(parts), 0)
    assert mc.combine(full, [], whole) == crc.encode("crc64nvme", whole)
