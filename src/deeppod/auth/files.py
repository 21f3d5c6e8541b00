"""Files only the server may read: tokens, keys, its discovery file."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``path`` with mode 0600 from the start, atomically (a reader sees the old file or
    the new one, never a part)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)
