"""An upload's body into its temporary file (s3/upload.py): through ASGI messages or the
server's direct read, whole and checked; a client that leaves, or a body shorter than its
Content-Length, leaves no file behind."""

import hashlib
import os

import anyio
import pytest

from deeppod.errors import ClientGone, S3Error
from deeppod.s3 import sigv4, upload

SIGNED = sigv4.Signed("AKID", "20261128", "us-east-1", "s3", "20261128T120000Z", ("host",), "sig",
                      sigv4.UNSIGNED, False)


def _messages(*pieces, gone=False):
    queue = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1 or gone}
             for i, p in enumerate(pieces)] + ([{"type": "http.disconnect"}] if gone else [])

    async def receive():
        return queue.pop(0)

    return receive


def _direct(*pieces, gone=False):
    async def read(sink):
        for p in pieces:
            await anyio.to_thread.run_sync(sink, memoryview(p))
        if gone:
            raise ClientGone()
        return sum(map(len, pieces))

    return {"read": read}


def _receive(tmp, length, receive=None, direct=None):
    headers = {"content-length": str(length)}
    return anyio.run(upload.receive, receive or _messages(), headers, SIGNED, b"", tmp, direct)


@pytest.mark.parametrize("how", ["messages", "direct"])
def test_a_body_arrives_whole_and_is_checked(tmp_path, how):
    data = os.urandom(upload.DIRECT_MIN + 3 * upload.BLOCK + 5)  # past the direct read's threshold
    pieces = [data[i:i + 300_000] for i in range(0, len(data), 300_000)]
    tmp = tmp_path / "tmp" / "upload"  # its folder is made with the first block
    body = _receive(tmp, len(data), _messages(*pieces) if how == "messages" else None,
                    _direct(*pieces) if how == "direct" else None)
    body.keep()
    assert tmp.read_bytes() == data and body.digests.md5.hexdigest() == hashlib.md5(data).hexdigest()


def test_a_small_body_waits_to_be_written_with_its_placing(tmp_path):
    body = _receive(tmp_path / "upload", 5, _messages(b"hel", b"lo"))
    assert not (tmp_path / "upload").exists() and b"".join(body.pending) == b"hello"  # one hop, in keep()
    body.keep()
    assert (tmp_path / "upload").read_bytes() == b"hello"


@pytest.mark.parametrize("how", ["messages", "direct"])
def test_a_client_that_leaves_leaves_nothing(tmp_path, how):
    data = os.urandom(upload.DIRECT_MIN + 2 * upload.BLOCK)
    pieces = [data[:upload.BLOCK + 1], data[upload.BLOCK + 1:2 * upload.BLOCK + 9]]  # past a block: written
    tmp = tmp_path / "upload"
    got = _receive(tmp, len(data), _messages(*pieces, gone=True) if how == "messages" else None,
                   _direct(*pieces, gone=True) if how == "direct" else None)
    assert got is None and not tmp.exists()


def test_a_body_shorter_than_its_content_length_is_refused_and_removed(tmp_path):
    body = _receive(tmp_path / "upload", 10, _messages(b"hello"))
    with pytest.raises(S3Error) as e:
        body.keep()
    assert e.value.code == "IncompleteBody" and not (tmp_path / "upload").exists()
