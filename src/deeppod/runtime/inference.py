"""Running a registered model: load its serving form, turn an image into its input, and
read answers. One implementation, used by serving replicas and by evaluation jobs, so a
model is judged on exactly what it will be served with. torch, Pillow and stdlib only."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from deeppod.errors import BadInput

MAX_PIXELS = 50_000_000  # a bigger image is refused before it is decoded


@dataclass
class Loaded:
    module: object  # a torch.nn.Module (from torch.export)
    signature: dict
    device: object

    @property
    def size(self) -> int:
        return int(self.signature["input"]["shape"][1])

    @property
    def classes(self) -> list[str]:
        return list(self.signature["classes"])


def load(folder: str | Path, device: str | None = None) -> Loaded:
    import torch

    folder = Path(folder)
    signature = json.loads((folder / "signature.json").read_text())
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    module = torch.export.load(str(folder / "model.pt2")).module().to(dev)
    return Loaded(module, signature, dev)


def decode(data: bytes, signature: dict):
    """Image bytes -> uint8 [3, S, S], with the crop the model was validated with."""
    from PIL import Image, UnidentifiedImageError

    from deeppod.runtime.data import center_box, decode_crop

    inp = signature["input"]
    size = int(inp["shape"][1])
    if not data:
        raise BadInput("the image is empty: send the bytes of a JPEG, PNG, BMP, GIF, WebP or TIFF file")
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
    except (UnidentifiedImageError, OSError, ValueError):
        raise BadInput("the data is not an image Pillow can read: "
                       "send a JPEG, PNG, BMP, GIF, WebP or TIFF file") from None
    if w * h > MAX_PIXELS:
        raise BadInput(f"the image is {w}x{h} pixels, over the {MAX_PIXELS:,}-pixel limit: scale it down first")
    box = (lambda w, h: center_box(w, h, size)) if inp.get("crop") == "center" else (lambda w, h: (0, 0, w, h))
    try:
        return decode_crop(data, box, size)
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt after the header
        raise BadInput(f"the image could not be decoded ({exc}): send a complete, valid file") from None


def tensor_input(values, signature: dict):
    """A client-made input (already preprocessed): nested lists shaped like the signature."""
    import torch

    shape = list(signature["input"]["shape"])
    try:
        t = torch.as_tensor(values, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise BadInput(f"a tensor must be nested lists of numbers shaped {shape}") from None
    if list(t.shape) != shape:
        raise BadInput(f"the tensor has shape {list(t.shape)}; this model takes {shape} "
                       f"(channels, height, width; normalised with mean {signature['input']['mean']} "
                       f"and std {signature['input']['std']})")
    if not torch.isfinite(t).all():
        raise BadInput("the tensor holds NaN or infinite values")
    return t


def forward(model: Loaded, items: list):
    """Probabilities [N, classes] for a batch of inputs, in order: uint8 [3,S,S] images
    (normalised here, on the device) and/or float tensors already normalised."""
    import torch

    from deeppod.runtime.data import normalize

    inp = model.signature["input"]
    size = model.size
    with torch.inference_mode():
        x = torch.empty((len(items), 3, size, size), dtype=torch.float32, device=model.device)
        images = [i for i, t in enumerate(items) if t.dtype == torch.uint8]
        tensors = [i for i, t in enumerate(items) if t.dtype != torch.uint8]
        if images:
            batch = torch.stack([items[i] for i in images]).to(model.device, non_blocking=True)
            x[images] = normalize(batch, inp["mean"], inp["std"])
        if tensors:
            x[tensors] = torch.stack([items[i] for i in tensors]).to(model.device)
        if model.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model.module(x.contiguous(memory_format=torch.channels_last))
        else:
            logits = model.module(x)
        return torch.softmax(logits.float(), dim=1).cpu()


def top_k(probs, classes: list[str], k: int) -> list[dict]:
    """One answer per row: the best label, its confidence, and the k best."""
    k = max(1, min(k, len(classes)))
    values, indices = probs.topk(k, dim=1)
    out = []
    for vs, ix in zip(values.tolist(), indices.tolist()):
        ranked = [{"label": classes[i], "confidence": round(v, 6)} for v, i in zip(vs, ix)]
        out.append({"label": ranked[0]["label"], "confidence": ranked[0]["confidence"], "top_k": ranked})
    return out
