"""Reading and writing the safetensors format (an 8-byte little-endian header length, a JSON
header of ``{name: {dtype, shape, data_offsets}}``, then the tensors' bytes), in PyTorch alone:
what a job writes for a language model's weights or adapters, and what the registry checks
(models/hf.py) without loading. Nothing here unpickles."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from deeppod.atomic import atomic_file

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
BY_NAME = {v: k for k, v in DTYPES.items()}


def save(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (CPU copies are made as needed) to ``path`` atomically."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which safetensors does not hold")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors start aligned
    with atomic_file(path, mode=0o644) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def load(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, on the CPU."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        dtype = BY_NAME[t["dtype"]]
        raw = torch.frombuffer(bytearray(body[start:end]), dtype=torch.uint8) if end > start else \
            torch.empty(0, dtype=torch.uint8)
        out[name] = raw.view(dtype).reshape(t["shape"])
    return out
