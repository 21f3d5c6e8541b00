"""A multipart upload's checksum as S3 computes it: of the parts' checksums ("-N") or, for
CRC32 FULL_OBJECT, of every byte; what a CompleteMultipartUpload lists is checked."""

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
    assert mc.requested({"x-amz-checksum-algorithm": "CRC64NVME"}) == {}  # not computed here: none kept
    assert mc.requested({}) == {}
    for bad in ({"x-amz-checksum-algorithm": "SHA256", "x-amz-checksum-type": "FULL_OBJECT"},
                {"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-type": "WHOLE"}):
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
