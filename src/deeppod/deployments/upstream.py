"""The router's HTTP/1.1 client to replicas: kept-alive connections per replica, one request
at a time on each, nothing else. A general client (httpx) cost the control plane about 1 ms
of CPU per prediction, most of the hop; this one writes the request in one call and reads
the answer by Content-Length.

Replicas are ours (serve/replica.py, uvicorn): answers carry Content-Length or are chunked.
A pooled connection the replica closed while idle (its keep-alive timeout) fails on first
use; that request is sent again once on a new connection, which is safe for predict.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import deque
from dataclasses import dataclass

from deeppod.contract import REPLICA_SECRET_HEADER
from deeppod.errors import UpstreamError

MAX_HEAD = 64 * 1024
MAX_IDLE_PER_REPLICA = 256


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Upstream:
    """Connections to every replica this router sends to, per event loop (one per server)."""

    def __init__(self, *, connect_timeout: float = 2.0, timeout: float = 60.0):
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}

    async def post(self, url: str, path_query: str, body: bytes, content_type: str, *, secret: str = "") -> Reply:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname or not u.port:
            raise UpstreamError(f"a replica's address must be http://host:port, not {url!r}")
        key = (u.hostname, u.port)
        auth = f"{REPLICA_SECRET_HEADER}: {secret}\r\n" if secret else ""
        head = (f"POST {u.path.rstrip('/')}{path_query} HTTP/1.1\r\nHost: {u.netloc}\r\n{auth}"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode("latin-1")
        pooled = self._take(key)
        if pooled is not None:
            try:
                return await self._exchange(key, pooled, head, body)
            except UpstreamError:
                pass  # most likely closed while idle: once more on a new connection
        conn = await self._connect(key)
        return await self._exchange(key, conn, head, body)

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*key, limit=MAX_HEAD),
                                                    self.connect_timeout)
        except (TimeoutError, OSError) as exc:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]} ({type(exc).__name__})") from None
        return _Conn(reader, writer)

    async def _exchange(self, key: tuple[str, int], conn: _Conn, head: bytes, body: bytes) -> Reply:
        try:
            reply, keep = await asyncio.wait_for(self._roundtrip(conn, head, body), self.timeout)
        except BaseException as exc:
            conn.close()  # a half-read answer leaves the connection unusable
            if isinstance(exc, (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)):
                raise UpstreamError(f"{key[0]}:{key[1]} dropped the request ({type(exc).__name__})") from None
            raise
        if keep:
            idle = self._idle.setdefault(key, deque())
            if len(idle) < MAX_IDLE_PER_REPLICA:
                idle.append(conn)
                return reply
        conn.close()
        return reply

    @staticmethod
    async def _roundtrip(conn: _Conn, head: bytes, body: bytes) -> tuple[Reply, bool]:
        conn.writer.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.writer.write(body)
        await conn.writer.drain()
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ", 2)[:2]
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await conn.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            data = await _chunked(conn.reader)
        else:  # no length: the body runs to the end of the connection
            data = await conn.reader.read()
            return Reply(int(status), headers, data), False
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        return Reply(int(status), headers, data), keep

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the end
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
