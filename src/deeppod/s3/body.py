"""An upload's body as it arrives: plain, or in ``aws-chunked`` framing (what current AWS SDKs
send for PutObject and UploadPart: chunks, each signed in a chain or unsigned, then trailing
checksums). The bytes of the object come out; its MD5 (the ETag), and the SHA-256, SHA-1 and
CRCs the request declares, are computed on the way, and what the client declared is checked
at the end."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from deeppod.errors import S3Error
from deeppod.s3 import crc, sigv4

MAX_LINE = 4096  # a chunk header or trailer line
SPLIT_MIN = 256 << 10  # a smaller piece is hashed in one thread: a helper's wake-up would cost more
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_helpers = threading.BoundedSemaphore(_CPUS)  # busy helpers mean busy cores: hash in the caller's thread
_pool = ThreadPoolExecutor(_CPUS, thread_name_prefix="s3-digests")  # its threads start with the first piece


class Digests:
    """The MD5 (the ETag) always; SHA-256, SHA-1, CRC32, CRC32C and CRC64NVME only where the
    request declares them (each costs a pass over the bytes: four halved a 64 MiB PUT's rate)."""

    def __init__(self, want: set[str] = frozenset({"sha256", "sha1", *crc.WIDTH})):
        self.md5, self.size = hashlib.md5(), 0
        self.sha256 = hashlib.sha256() if "sha256" in want else None
        self.sha1 = hashlib.sha1() if "sha1" in want else None
        self.crcs = {name: 0 for name in crc.WIDTH if name in want}
        self.declared: set[str] = set()  # the checksums the client sent (kept with the object)

    @classmethod
    def for_request(cls, headers: dict[str, str], payload: str) -> Digests:
        named = {k.removeprefix("x-amz-checksum-") for k in headers if k.startswith("x-amz-checksum-")}
        named |= {t.strip().lower().removeprefix("x-amz-checksum-") for t in headers.get("x-amz-trailer",
                                                                                         "").split(",")}
        digests = cls(named | ({"sha256"} if len(payload) == 64 else set()))
        digests.declared = named
        return digests

    def values(self) -> dict[str, str]:
        """What was computed, by the header that declares it."""
        ours = {"content-md5": base64.b64encode(self.md5.digest()).decode()}
        for name, value in self.crcs.items():
            ours[f"x-amz-checksum-{name}"] = crc.encode(name, value)
        if self.sha1 is not None:
            ours["x-amz-checksum-sha1"] = base64.b64encode(self.sha1.digest()).decode()
        if self.sha256 is not None:
            ours["x-amz-checksum-sha256"] = base64.b64encode(self.sha256.digest()).decode()
        return ours

    def checksums(self) -> dict[str, str]:
        """The declared checksums computed here (so checked): S3 keeps them and returns them."""
        return {k: v for k, v in self.values().items() if k.removeprefix("x-amz-checksum-") in self.declared}

    def update(self, data: bytes | memoryview) -> None:
        """A large piece's other digests are computed by a helper thread while this one
        computes its MD5, where a helper is free (each lets go of the GIL): an upload signed
        with its SHA-256 and a CRC (boto3's over HTTP) is then hashed in the time of its MD5."""
        if len(data) >= SPLIT_MIN and (self.sha256 or self.sha1 or self.crcs) and _helpers.acquire(blocking=False):
            try:
                others = _pool.submit(self._others, data)
                self.md5.update(data)
                others.result()
            finally:
                _helpers.release()
        else:
            self.md5.update(data)
            self._others(data)
        self.size += len(data)

    def _others(self, data: bytes | memoryview) -> None:
        if self.sha256 is not None:
            self.sha256.update(data)
        if self.sha1 is not None:
            self.sha1.update(data)
        for name, value in self.crcs.items():
            self.crcs[name] = crc.update(name, data, value)

    @staticmethod
    def check_md5_header(headers: dict[str, str]) -> None:
        """A Content-MD5 that is not the base64 of 16 bytes is refused before the body is read."""
        if "content-md5" not in headers:
            return
        try:
            ok = len(base64.b64decode(headers["content-md5"].strip(), validate=True)) == 16
        except ValueError:
            ok = False
        if not ok:
            raise S3Error("InvalidDigest", "the Content-MD5 you specified is not valid: send the base64 of the "
                          "body's 16-byte MD5")

    def check(self, declared: dict[str, str]) -> None:
        """``declared``: lower-case header or trailer names to values (Content-MD5, checksums)."""
        ours = self.values()
        for name, value in declared.items():
            if name in ours and value.strip() != ours[name]:
                raise S3Error("BadDigest", f"the {name} you specified did not match what we received: the upload was "
                              "damaged on the way; send it again")


class Decoder:
    """Feed it what arrives; it returns the object's bytes. ``finish()`` checks the end."""

    def __init__(self, mode: str, signed: sigv4.Signed | None = None, key: bytes | None = None):
        self.mode = mode  # "plain", or one of sigv4's STREAMING_* values
        self.signed, self.key = signed, key
        self.previous = signed.signature if signed else ""
        self.buf = bytearray()
        self.left = -1  # bytes of the current chunk still to come; -1: a header is next
        self.chunk_signature = ""
        self.chunk = hashlib.sha256()
        self.done = False
        self.trailers: dict[str, str] = {}
        self.signed_chunks = mode in (sigv4.STREAMING_SIGNED, sigv4.STREAMING_SIGNED_TRAILER)

    def feed(self, data: bytes) -> bytes:
        if self.mode == "plain":
            return data
        self.buf += data
        out = bytearray()
        while True:
            if self.done:
                if not self._trailers():
                    return bytes(out)
                continue
            if self.left < 0:
                line = self._line()
                if line is None:
                    return bytes(out)
                size, _, ext = line.partition(";")
                try:
                    self.left = int(size, 16)
                except ValueError:
                    raise S3Error("IncompleteBody", "the aws-chunked body is malformed (a chunk size is not "
                                  "hexadecimal)") from None
                self.chunk_signature = ext.partition("chunk-signature=")[2]
                self.chunk = hashlib.sha256()
                if self.left == 0:
                    self._verify_chunk()
                    self.done = True
                continue
            if self.left > 0:
                take = bytes(self.buf[:self.left])
                del self.buf[:len(take)]
                self.left -= len(take)
                if self.signed_chunks:  # each chunk's SHA-256 goes into its signature
                    self.chunk.update(take)
                out += take
                if self.left > 0:
                    return bytes(out)
            if len(self.buf) < 2:
                return bytes(out)
            if self.buf[:2] != b"\r\n":
                raise S3Error("IncompleteBody", "the aws-chunked body is malformed (a chunk does not end in CRLF)")
            del self.buf[:2]
            self._verify_chunk()
            self.left = -1

    def _line(self) -> str | None:
        end = self.buf.find(b"\r\n")
        if end < 0:
            if len(self.buf) > MAX_LINE:
                raise S3Error("IncompleteBody", "the aws-chunked body is malformed (a header line is too long)")
            return None
        line = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[:end + 2]
        return line

    def _trailers(self) -> bool:
        line = self._line()
        if line is None:
            return False
        if line:
            name, _, value = line.partition(":")
            self.trailers[name.strip().lower()] = value.strip()
        return True

    def _verify_chunk(self) -> None:
        if not self.signed_chunks:
            return
        expected = sigv4.chunk_signature(self.key, self.signed, self.previous, self.chunk.hexdigest())
        if not hmac.compare_digest(expected, self.chunk_signature):
            raise S3Error("SignatureDoesNotMatch", "a chunk's signature does not match: the upload was changed on "
                          "the way or signed with another key")
        self.previous = expected

    def finish(self) -> dict[str, str]:
        """The trailers; IncompleteBody when the framing did not end."""
        if self.mode != "plain" and (not self.done or self.buf.strip()):
            raise S3Error("IncompleteBody", "the upload ended before its last chunk: send it again")
        return self.trailers
