"""An inbox object's metadata: what a request's headers give it, kept with the file, sent back
with a signed GET's overrides on top."""

import pytest

from deeppod.errors import S3Error
from deeppod.s3 import metadata


def test_headers_kept_and_sent_back_with_overrides(tmp_path):
    meta = metadata.from_request({"content-type": "text/bla", "content-encoding": "gzip, aws-chunked",
                                  "x-amz-meta-camera": "3", "authorization": "AWS4 ...", "host": "h"})
    assert meta == {"content-type": "text/bla", "content-encoding": "gzip", "x-amz-meta-camera": "3"}
    f = tmp_path / "a.png"
    f.write_bytes(b"x")
    metadata.write(f, meta, f)
    assert metadata.read(f) == meta
    sent = dict(metadata.headers(meta, "a.png", {"response-content-type": "image/png"}))
    assert sent[b"content-type"] == b"image/png" and sent[b"x-amz-meta-camera"] == b"3"
    assert dict(metadata.headers({}, "cats/a.png", {}))[b"content-type"] == b"image/png"  # guessed from the key


def test_an_override_cannot_add_a_header_and_metadata_is_bounded():
    with pytest.raises(S3Error) as e:
        metadata.headers({}, "a.txt", {"response-content-type": "text/html\r\nSet-Cookie: a=b"})
    assert e.value.code == "InvalidArgument"
    with pytest.raises(S3Error) as e:
        metadata.from_request({"x-amz-meta-big": "v" * 3000})
    assert e.value.code == "MetadataTooLarge"


def test_a_part_of_a_multipart_object():
    meta = {metadata.PARTS: [5, 3], metadata.CHECKSUMS: {"x-amz-checksum-sha256": "c-2", "x-amz-checksum-type":
                                                         "COMPOSITE"}, metadata.PART_CHECKSUMS: ["p1", "p2"]}
    assert metadata.part_range(meta, 2, 8) == (5, 7, 2)
    assert metadata.part_range({}, 1, 8) == (0, 7, 1)  # part 1 of any other object is all of it
    with pytest.raises(S3Error):
        metadata.part_range(meta, 3, 8)
    assert dict(metadata.checksum_headers(meta, 2)) == {b"x-amz-checksum-sha256": b"p2",
                                                        b"x-amz-checksum-type": b"COMPOSITE"}
