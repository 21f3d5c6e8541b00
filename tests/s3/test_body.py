"""Upload bodies: AWS's own signed streaming example (seed signature and chunk chain) decodes
and verifies, a changed chunk or a cut body does not, and unsigned chunked bodies with a
trailing checksum are checked against what arrived."""

import base64
import zlib
from datetime import UTC, datetime

import pytest

from deeppod.errors import S3Error
from deeppod.s3 import sigv4
from deeppod.s3.body import Decoder, Digests

# https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html (the example PUT)
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
CHUNKS = [("10000", "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648", b"a" * 65536),
          ("400", "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497", b"a" * 1024),
          ("0", "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9", b"")]


def example():
    headers = {"host": "s3.amazonaws.com", "x-amz-date": "20130524T000000Z",
               "x-amz-storage-class": "REDUCED_REDUNDANCY",
               "x-amz-content-sha256": sigv4.STREAMING_SIGNED, "content-encoding": "aws-chunked",
               "x-amz-decoded-content-length": "66560", "content-length": "66824",
               "authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                                "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
                                f"x-amz-decoded-content-length;x-amz-storage-class,Signature={SEED}"}
    req = sigv4.Request("PUT", "/examplebucket/chunkObject.txt", [], headers)
    signed = sigv4.parse(req, datetime(2013, 5, 24, tzinfo=UTC))
    return signed, sigv4.verify(req, signed, SECRET)


def body(chunks):
    return b"".join(f"{size};chunk-signature={sig}\r\n".encode() + data + b"\r\n" for size, sig, data in chunks)


def feed(decoder, raw, step):
    out = b"".join(decoder.feed(raw[i:i + step]) for i in range(0, len(raw), step))
    decoder.finish()
    return out


@pytest.mark.parametrize("step", [1 << 20, 7, 4096])
def test_awss_signed_streaming_example_decodes_in_any_pieces(step):
    signed, key = example()
    assert feed(Decoder(signed.payload, signed, key), body(CHUNKS), step) == b"a" * 66560


def test_a_changed_chunk_or_a_cut_body_is_refused():
    signed, key = example()
    changed = [CHUNKS[0], (CHUNKS[1][0], CHUNKS[1][1], b"b" * 1024), CHUNKS[2]]
    with pytest.raises(S3Error) as e:
        feed(Decoder(signed.payload, signed, key), body(changed), 1 << 20)
    assert e.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3Error) as e:
        feed(Decoder(signed.payload, signed, key), body(CHUNKS)[:-40], 1 << 20)
    assert e.value.code == "IncompleteBody"


def test_unsigned_chunks_with_a_trailing_checksum():
    data = b"hello world" * 1000
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    raw = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n" + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    d = Decoder(sigv4.STREAMING_UNSIGNED_TRAILER)
    got = feed(d, raw, 100)
    digests = Digests()
    digests.update(got)
    digests.check(d.trailers)
    assert got == data and d.trailers == {"x-amz-checksum-crc32": crc}
    bad = Digests()
    bad.update(data[:-1] + b"X")
    with pytest.raises(S3Error):
        bad.check(d.trailers)


def test_a_content_md5_that_is_no_md5_is_invalid_not_bad():
    """s3-tests' bad_md5_invalid_short / _empty: InvalidDigest before the body, BadDigest after it."""
    from deeppod.s3.body import Digests

    for value in ("", "YWJjZA==", "not base64!"):
        with pytest.raises(S3Error) as e:
            Digests.check_md5_header({"content-md5": value})
        assert e.value.code == "InvalidDigest"
    good = base64.b64encode(b"\0" * 16).decode()
    Digests.check_md5_header({"content-md5": good})
    d = Digests(set())
    d.update(b"x")
    with pytest.raises(S3Error) as e:
        d.check({"content-md5": good})
    assert e.value.code == "BadDigest"


def test_large_pieces_hashed_beside_their_md5_give_the_same_digests(monkeypatch):
    import hashlib
    import os

    from deeppod.s3 import body

    data = os.urandom(3 * body.SPLIT_MIN + 11)
    want = {"sha256", "sha1", "crc32", "crc32c", "crc64nvme"}
    alone = Digests(want)
    for i in range(0, len(data), 1000):  # small pieces: one thread
        alone.update(data[i:i + 1000])
    split = Digests(want)
    split.update(memoryview(data)[:2 * body.SPLIT_MIN])  # a helper thread's
    monkeypatch.setattr(body, "_helpers", body.threading.BoundedSemaphore(1))
    body._helpers.acquire()  # every helper busy: the caller's thread does all of it
    split.update(memoryview(data)[2 * body.SPLIT_MIN:])
    assert split.values() == alone.values() and split.size == alone.size == len(data)
    assert split.md5.hexdigest() == hashlib.md5(data).hexdigest()
    assert split.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
