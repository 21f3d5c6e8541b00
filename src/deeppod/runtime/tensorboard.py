"""TensorBoard event files for scalars, with the standard library only (no tensorboard
package in the job): TFRecord framing with masked CRC32C around hand-encoded Event protos."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    return _varint(num << 3 | wire) + payload


def _len_delimited(num: int, data: bytes) -> bytes:
    return _field(num, 2, _varint(len(data)) + data)


def encode_event(wall_time: float, step: int, *, scalars: dict[str, float] | None = None,
                 file_version: str | None = None) -> bytes:
    """tensorflow.Event: wall_time=1 (double), step=2 (int64), file_version=3, summary=5."""
    msg = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step & (2**64 - 1)))
    if file_version is not None:
        msg += _len_delimited(3, file_version.encode())
    if scalars:
        values = b"".join(
            _len_delimited(1, _len_delimited(1, tag.encode()) + _field(2, 5, struct.pack("<f", float(v))))
            for tag, v in scalars.items())
        msg += _len_delimited(5, values)
    return msg


def frame(record: bytes) -> bytes:
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", _masked(header)) + record + struct.pack("<I", _masked(record))


def read_records(path: str | os.PathLike) -> list[bytes]:
    """Read a TFRecord file back, checking every CRC (for tests and tools)."""
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        if struct.unpack_from("<I", data, i + 8)[0] != _masked(data[i:i + 8]):
            raise ValueError(f"bad length CRC at byte {i}")
        rec = data[i + 12:i + 12 + n]
        if struct.unpack_from("<I", data, i + 12 + n)[0] != _masked(rec):
            raise ValueError(f"bad data CRC at byte {i}")
        out.append(rec)
        i += 16 + n
    return out


class EventWriter:
    """Appends scalar events to ``events.out.tfevents.<time>.<host>`` in ``logdir``."""

    def __init__(self, logdir: str | os.PathLike):
        self.dir = Path(logdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._f = open(self.path, "ab")
        self._f.write(frame(encode_event(time.time(), 0, file_version="brain.Event:2")))
        self._f.flush()

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        self._f.write(frame(encode_event(wall_time or time.time(), step, scalars=values)))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()
