"""An upload's body into its temporary file: received on the event loop, hashed and written
off it, a block at a time (hashlib lets go of the GIL, so the loop reads on meanwhile). What
is left after the last block (all of a small upload) is hashed, written and checked in the
same call off the loop that puts the object in place: one hop for a small PUT, not two
(each costs a wake-up of the loop and of a worker thread)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from deeppod.errors import ClientGone, S3Error
from deeppod.s3 import inbox, sigv4
from deeppod.s3.body import Decoder, Digests

BLOCK = 1 << 20  # what the loop gathers before a worker thread hashes and writes it
DIRECT_MIN = 4 << 20  # a larger upload is read off the loop where the server offers it (the connection closes after)


@dataclass
class Body:
    """A received upload; :meth:`keep` (off the loop) finishes its file and checks it."""

    tmp: Path
    digests: Digests
    headers: dict[str, str]
    payload: str  # the signed x-amz-content-sha256 value
    plain: bool  # not aws-chunked: the Content-Length is the object's size
    trailers: dict[str, str]
    out: object = None  # the open file, once a block was written
    pending: list[bytes] = field(default_factory=list)  # received, not yet hashed and written
    received: int = 0  # the object's bytes so far

    def keep(self) -> None:
        """Write and hash what is pending, close the file and check it against what the client
        declared (Content-Length, the signed SHA-256, Content-MD5, checksums); on any failure
        the file is gone."""
        try:
            self.out = absorb(self.out, self.tmp, self.digests, self.pending, last=True)
            self.pending = []
            h, d = self.headers, self.digests
            declared = h.get("content-length")
            if declared is not None and self.plain and d.size != int(declared):
                raise S3Error("IncompleteBody", "you did not provide the number of bytes specified by the "
                              "Content-Length HTTP header")
            if d.sha256 is not None and len(self.payload) == 64 and self.payload != d.sha256.hexdigest():
                raise S3Error("XAmzContentSHA256Mismatch", "the provided 'x-amz-content-sha256' header does not "
                              "match what was computed: the upload was changed on the way")
            d.check({**{k: v for k, v in h.items() if k == "content-md5" or k.startswith("x-amz-checksum-")},
                     **self.trailers})
        except BaseException:
            self.discard()
            raise

    def arrived(self, data):
        """``data``, counted: EntityTooLarge past S3's largest object."""
        self.received += len(data)
        if self.received > inbox.MAX_OBJECT:
            raise S3Error("EntityTooLarge", "the upload is over 5 GiB: upload it in parts (multipart)")
        return data

    def discard(self) -> None:
        if self.out is not None:
            self.out.close()
        self.tmp.unlink(missing_ok=True)


async def receive(receive, headers: dict[str, str], signed: sigv4.Signed, signing_key: bytes,
                  tmp: Path, direct=None) -> Body | None:
    """The body of a PUT into ``tmp``, a block at a time; what the last block leaves is pending
    (see :meth:`Body.keep`). None if the client went away (nothing is kept). ``direct``: the
    server's offer to read a body off the loop (transport/direct_body.py), taken for one over
    ``DIRECT_MIN``, where the loop's share of the work would be most of it."""
    h = headers
    declared = h.get("content-length")
    if declared is None and "chunked" not in h.get("transfer-encoding", ""):
        raise S3Error("MissingContentLength", "a PUT needs a Content-Length header")
    size_hint = int(h.get("x-amz-decoded-content-length") or declared or 0)
    if size_hint > inbox.MAX_OBJECT:
        raise S3Error("EntityTooLarge", f"your proposed upload ({size_hint} bytes) exceeds the maximum allowed "
                      "object size of 5 GiB: upload it in parts (multipart)")
    Digests.check_md5_header(h)
    mode = signed.payload if signed.payload.startswith("STREAMING-") else "plain"
    decoder = Decoder(mode, signed, signing_key)
    body = Body(tmp, Digests.for_request(h, signed.payload), h, signed.payload, mode == "plain", {})
    try:
        if direct is not None and size_hint > DIRECT_MIN:
            await _read_direct(direct, decoder, body)
        else:
            await _read_messages(receive, decoder, body)
        body.trailers = decoder.finish()
        return body
    except ClientGone:
        body.discard()
        return None
    except BaseException:
        body.discard()  # here, not off the loop: a cancelled request cannot wait for a thread
        raise


async def _read_messages(receive, decoder: Decoder, body: Body) -> None:
    """ASGI's body messages, gathered on the loop and written a block at a time off it; the
    last block is left pending."""
    waiting = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        data = body.arrived(decoder.feed(message.get("body", b"")))
        body.pending.append(data)
        waiting += len(data)
        if not message.get("more_body"):
            return
        if waiting >= BLOCK:
            body.out = await anyio.to_thread.run_sync(absorb, body.out, body.tmp, body.digests, body.pending, False)
            body.pending, waiting = [], 0


async def _read_direct(direct, decoder: Decoder, body: Body) -> None:
    """The body read, decoded, hashed and written in worker threads, none of it on the loop."""
    def sink(piece: memoryview) -> None:  # in a worker thread
        body.out = absorb(body.out, body.tmp, body.digests, [body.arrived(decoder.feed(piece))], False)

    await direct["read"](sink)


def absorb(out, tmp: Path, digests: Digests, pieces: list[bytes], last: bool):
    """Pieces of an upload's body: into its digests and its file (``tmp``, opened with the
    first pieces; its folder made if it is not there), in order; the file closed after the
    ``last``. Returns the file."""
    if out is None:
        try:
            out = open(tmp, "wb")
        except FileNotFoundError:
            os.makedirs(tmp.parent, exist_ok=True)
            out = open(tmp, "wb")
    try:
        for piece in pieces:
            digests.update(piece)
        out.writelines(pieces)
    except BaseException:
        out.close()  # the caller's unlink follows
        raise
    if last:
        out.close()
    return out
