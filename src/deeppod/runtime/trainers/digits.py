"""Write scikit-learn's digits (1,797 real 8x8 handwritten digits it ships) as a
class-per-folder PNG directory: real data for tests and demos, nothing downloaded."""

from __future__ import annotations

import sys
from pathlib import Path


def write_digits(out: str | Path, limit: int | None = None) -> Path:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    out = Path(out)
    d = load_digits()
    for i, (img, label) in enumerate(zip(d.images, d.target)):
        if limit is not None and i >= limit:
            break
        folder = out / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (img / 16.0 * 255).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"digit-{i:04d}.png")
    return out


if __name__ == "__main__":
    print(write_digits(sys.argv[1] if len(sys.argv) > 1 else "digits"))
