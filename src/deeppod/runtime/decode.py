"""Images to tensors: where a training or evaluation crop lies (RandomResizedCrop's box, the
centre crop), a region decode of the JPEG at a reduced size (libjpeg-turbo through the
compiled ``_jpeg`` where it was built, else Pillow's ``draft``), the crop and resize in one
step, nvJPEG on the GPU for whole batches, and the normalisation that belongs on the device.
"""

from __future__ import annotations

import io
import math
import random

try:  # region decoding, compiled at install against libjpeg-turbo; Pillow when it was not built
    from deeppod.runtime import _jpeg
except ImportError:  # pragma: no cover - depends on the machine's build
    _jpeg = None

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def random_resized_crop_box(width: int, height: int, rng: random.Random, scale=(0.08, 1.0),
                            ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box sampling: (left, top, w, h)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_box(width: int, height: int, size: int, resize: float = 256 / 224) -> tuple[int, int, int, int]:
    """The evaluation crop: the central square that Resize(size*1.14) + CenterCrop(size) sees."""
    side = min(width, height) / resize
    return int((width - side) / 2), int((height - side) / 2), max(1, int(side)), max(1, int(side))


def decode_crop(data: bytes, box_fn, size: int, flip: bool = False):
    """Decode an image, crop ``box_fn(w, h)`` and resize it to size x size: uint8 [3, S, S].

    For JPEG, Pillow's draft mode decodes at 1/2, 1/4 or 1/8 scale whenever the crop still
    has at least ``size`` pixels per side at that scale (the DCT does the downscaling). The
    remaining resize is torch's antialiased bilinear on uint8 (vectorised; about twice as
    fast as Pillow's), the same filter torchvision's RandomResizedCrop uses.
    """
    import numpy as np
    import torch
    from PIL import Image

    if _jpeg is not None and data[:2] == b"\xff\xd8":
        x, box = _decode_region(data, box_fn, size)
        if x is not None:
            return _finish(x, size, flip)
        if box is not None:  # drawn already: Pillow takes the same box
            box_fn = lambda _w, _h: box  # noqa: E731
    im = Image.open(io.BytesIO(data))
    width, height = im.size
    left, top, w, h = box_fn(width, height)
    if im.format == "JPEG":
        im.draft("RGB", (max(1, math.ceil(width * size / w)), max(1, math.ceil(height * size / h))))
        sx, sy = im.size[0] / width, im.size[1] / height
        left, top, w, h = left * sx, top * sy, w * sx, h * sy
    if im.mode != "RGB":
        im = im.convert("RGB")
    box = (int(left), int(top), max(int(left) + 1, int(round(left + w))), max(int(top) + 1, int(round(top + h))))
    crop = np.array(im.crop(box))  # writable: torch shares it
    return _finish(torch.from_numpy(crop), size, flip)


def _decode_region(data: bytes, box_fn, size: int):
    """The crop's region only, at the smallest k/8 DCT scale that keeps ``size`` pixels a side
    (libjpeg-turbo, runtime/_jpeg.c): (HWC uint8, the box), or no pixels for a JPEG it cannot
    read (CMYK, corrupt), which Pillow then decodes as before."""
    import torch

    try:
        width, height = _jpeg.size(data)
    except ValueError:
        return None, None
    box = left, top, w, h = box_fn(width, height)
    try:
        rgb, rw, rh, num = _jpeg.region(data, left, top, w, h, size)
    except ValueError:
        return None, box
    s = num / 8  # the same sub-box the Pillow path takes after a draft decode
    x0, y0 = int(left * s), int(top * s)
    x1, y1 = max(x0 + 1, int(round((left + w) * s))), max(y0 + 1, int(round((top + h) * s)))
    return torch.frombuffer(rgb, dtype=torch.uint8).view(rh, rw, 3)[: y1 - y0, : x1 - x0], box


def _finish(crop, size: int, flip: bool):
    """HWC uint8 crop -> [3, size, size]: torch's antialiased bilinear on a channels_last view."""
    import torch

    x = crop.permute(2, 0, 1).unsqueeze(0)  # channels_last view: the fast uint8 path
    if x.shape[2] != size or x.shape[3] != size:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                            align_corners=False)
    if flip:
        x = x.flip(-1)
    return x[0]


def normalize(batch, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=None):
    """uint8 NCHW on the device -> normalised float, keeping channels_last."""
    import torch

    dtype = dtype or torch.float32
    m = torch.tensor(mean, device=batch.device, dtype=dtype).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, device=batch.device, dtype=dtype).view(1, -1, 1, 1) * 255
    return (batch.to(dtype) - m) / s


class DeviceDecoded:
    """Wraps a loader of encoded batches: yields each decoded on ``device`` (see :func:`loader`)."""

    def __init__(self, loader, size: int, device):
        self.loader, self.size, self.device = loader, size, device

    def __iter__(self):
        for batch in self.loader:
            yield decode_on_device(batch, self.size, self.device)

    def __len__(self) -> int:
        return len(self.loader)


def decode_on_device(batch, size: int, device):
    """An encoded batch -> (uint8 [B, 3, size, size], labels), both on ``device``."""
    import torch

    data, offsets, pixels, boxes, flips, labels = batch
    bounds, boxes, flips = offsets.tolist(), boxes.tolist(), flips.tolist()
    jpegs = [k for k in range(len(boxes)) if bounds[k + 1] > bounds[k]]
    out = torch.empty((len(boxes), 3, size, size), dtype=torch.float32, device=device)
    for k, img in zip(jpegs, _decode_jpegs([data[bounds[k]:bounds[k + 1]] for k in jpegs], device)):
        left, top, w, h = boxes[k]
        if img is None:  # nvJPEG cannot read it (CMYK, say): the CPU path, same box
            raw = data[bounds[k]:bounds[k + 1]].numpy().tobytes()
            out[k] = decode_crop(raw, lambda _w, _h, b=tuple(boxes[k]): b, size).to(device)
            continue
        x = img[:, top:top + h, left:left + w].unsqueeze(0).float()
        if (h, w) != (size, size):
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                                align_corners=False)
        out[k] = x[0]
    flipped = [k for k in jpegs if flips[k]]
    if flipped:
        out[flipped] = out[flipped].flip(-1)
    out = out.round_().clamp_(0, 255).to(torch.uint8)
    others = [k for k in range(len(boxes)) if bounds[k + 1] == bounds[k]]
    if others:  # decoded (and flipped) in the worker
        out[others] = pixels.to(device, non_blocking=True)
    return out, labels.to(device, non_blocking=True)


def _decode_jpegs(datas: list, device) -> list:
    """Decode a batch of JPEGs on ``device`` in one call; one by one (None where it fails)
    when the batch call fails."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not datas:
        return []
    try:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        out = []
        for d in datas:
            try:
                out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                out.append(None)
        return out
