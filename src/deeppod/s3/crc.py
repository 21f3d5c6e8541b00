"""The CRCs S3 keeps as object checksums: CRC32 (zlib's), CRC32C and CRC64NVME (the AWS Common
Runtime's, the code the AWS SDKs compute them with). A value is an int while bytes go by, and
is sent as the base64 of its big-endian bytes."""

from __future__ import annotations

import base64
import zlib

from awscrt import checksums as _crt

WIDTH = {"crc32": 4, "crc32c": 4, "crc64nvme": 8}  # bytes of each


def update(name: str, data: bytes | memoryview, value: int) -> int:
    """``value`` carried over ``data`` (0 to begin)."""
    if name == "crc32":
        return zlib.crc32(data, value)
    if name == "crc32c":
        return _crt.crc32c(data, value)
    return _crt.crc64nvme(data, value)


def encode(name: str, value: int) -> str:
    return base64.b64encode(value.to_bytes(WIDTH[name], "big")).decode()
