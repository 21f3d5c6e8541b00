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
    whole = {metadata.CHECKSUMS: {"x-amz-checksum-crc32c": "q=="}}  # put in one request: part 1 is all of it
    assert dict(metadata.checksum_headers(whole, 1)) == {b"x-amz-checksum-crc32c": b"q=="}


def test_non_ascii_metadata_goes_back_as_the_client_reads_it():
    # botocore sends UTF-8 bytes, which arrive decoded as latin-1, and reads answers as latin-1
    wire = "Hello World\xe9".encode().decode("latin-1")
    sent = dict(metadata.headers(metadata.from_request({"x-amz-meta-meta1": wire}), "a", {}))
    assert sent[b"x-amz-meta-meta1"].decode("latin-1") == "Hello World\xe9"
    beyond = "\u732b".encode().decode("latin-1")  # not in latin-1: RFC 2047, as S3 sends it
    assert dict(metadata.headers({"x-amz-meta-cat": beyond}, "a", {}))[b"x-amz-meta-cat"] == b"=?UTF-8?B?54yr?="
    assert dict(metadata.headers({"x-amz-meta-raw": "caf\xe9"}, "a", {}))[b"x-amz-meta-raw"] == b"caf\xe9"
    assert dict(metadata.headers({}, "a", {"response-content-disposition": "\u732b"}))[
        b"content-disposition"] == b"=?UTF-8?B?54yr?="
