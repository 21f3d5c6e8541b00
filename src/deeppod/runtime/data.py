"""``deeppod.runtime.data``: read a DeepPod dataset version and feed it to training.

On-disk format of one version (written by the platform at ingest; documented in
docs/datasets.md)::

    manifest.jsonl        one JSON object per sample: path, label, bytes, sha256, width, height, split
    classes.json          ["cat", "dog", ...]: label i is classes[i]
    index.npy             int64 [N, 6]: shard, offset, length, label, split (0 train, 1 val), width*65536+height
    shards/shard-00000.dps  b"DPSHARD1" then records: <u32 length><i32 label><length bytes of image>

A record's offset in index.npy points at its image bytes, so random access is one slice of
a memory map; reading the index in order reads every shard front to back (sequential).

The loader decodes in worker processes, asks Pillow for a reduced-size JPEG decode when the
random crop allows it (``draft``: the DCT does the downscaling), crops and resizes in one
step, and hands over one uint8 NCHW tensor per batch: normalisation (and channels_last)
belong on the device (:func:`normalize`). Sharding across workers uses :class:`ElasticSampler`.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import mmap
import os
import random
from pathlib import Path

try:  # region decoding, compiled at install against libjpeg-turbo; Pillow when it was not built
    from deeppod.runtime import _jpeg
except ImportError:  # pragma: no cover - depends on the machine's build
    _jpeg = None

from deeppod.contract import SHARD_MAGIC, SHARD_RECORD_HEADER, dataset_env_key
TRAIN, VAL = 0, 1
SPLITS = {"train": TRAIN, "val": VAL}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# index.npy columns
SHARD, OFFSET, LENGTH, LABEL, SPLIT, SIZE = range(6)


def dataset_path(name: str) -> Path:
    """The folder of a dataset the platform staged for this job (``DEEPPOD_DATA_<NAME>``)."""
    key = dataset_env_key(name)
    value = os.environ.get(key)
    if not value:
        raise FileNotFoundError(f"dataset {name!r} is not staged for this job: submit it with --dataset {name} "
                                f"(the platform sets {key})")
    return Path(value)


class ShardReader:
    """Random and sequential access to the samples of one version folder."""

    def __init__(self, root: str | os.PathLike, split: str | None = None):
        import numpy as np

        self.root = Path(root)
        if not (self.root / "index.npy").is_file():
            raise FileNotFoundError(f"{self.root} is not a DeepPod dataset version (no index.npy)")
        index = np.load(self.root / "index.npy")
        if split is not None:
            if split not in SPLITS:
                raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
            index = index[index[:, SPLIT] == SPLITS[split]]
        self.index = index
        self.classes: list[str] = json.loads((self.root / "classes.json").read_text())
        self._maps: dict[int, mmap.mmap] = {}

    def __len__(self) -> int:
        return len(self.index)

    @property
    def labels(self) -> list[int]:
        return self.index[:, LABEL].tolist()

    def _map(self, shard: int) -> mmap.mmap:
        m = self._maps.get(shard)
        if m is None:
            with open(self.root / "shards" / f"shard-{shard:05d}.dps", "rb") as f:
                m = self._maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return m

    def read(self, i: int) -> tuple[bytes, int]:
        shard, offset, length, label = (int(v) for v in self.index[i, :4])
        return self._map(shard)[offset:offset + length], label

    def size(self, i: int) -> tuple[int, int]:
        v = int(self.index[i, SIZE])
        return v >> 16, v & 0xFFFF

    def __getstate__(self):  # worker processes open their own maps
        return {**self.__dict__, "_maps": {}}

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()


def iter_shard(path: str | os.PathLike):
    """Sequential read of one shard file without its index: yields (label, image bytes)."""
    with open(path, "rb") as f:
        if f.read(len(SHARD_MAGIC)) != SHARD_MAGIC:
            raise ValueError(f"{path} is not a DeepPod shard (bad magic)")
        while head := f.read(SHARD_RECORD_HEADER.size):
            length, label = SHARD_RECORD_HEADER.unpack(head)
            yield label, f.read(length)


# -- transforms ------------------------------------------------------------------------

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


class ImageDataset:
    """Map-style dataset over one split of a version. ``train`` applies RandomResizedCrop and
    a horizontal flip; otherwise the centre crop. ``__getitems__`` builds a whole batch."""

    def __init__(self, root, split: str | None = "train", *, size: int = 224, train: bool = True,
                 seed: int = 0, scale=(0.08, 1.0), flip: bool = True):
        self.reader = root if isinstance(root, ShardReader) else ShardReader(root, split)
        self.size, self.train, self.seed, self.scale, self.flip = size, train, seed, scale, flip
        self._rng = random.Random(seed)
        self.encoded = False  # set on the copy a loader with decode_on reads

    @property
    def classes(self) -> list[str]:
        return self.reader.classes

    def __len__(self) -> int:
        return len(self.reader)

    def _pixels(self, i: int):
        data, label = self.reader.read(i)
        if self.train:
            rng = self._rng
            pixels = decode_crop(data, lambda w, h: random_resized_crop_box(w, h, rng, self.scale), self.size,
                                 flip=self.flip and rng.random() < 0.5)
        else:
            pixels = decode_crop(data, lambda w, h: center_box(w, h, self.size), self.size)
        return pixels, label

    def __getitem__(self, i: int):

        pixels, label = self._pixels(i)
        return pixels.contiguous(), label

    def _encoded(self, i: int):
        """For a decode on the device: the JPEG's bytes and the crop and flip drawn for it, from
        the same random stream in the same order as :meth:`_pixels`; another format is decoded
        here (its pixels instead of bytes, and an empty box)."""
        data, label = self.reader.read(i)
        if data[:2] != b"\xff\xd8":
            pixels, label = self._pixels(i)
            return pixels, (0, 0, 0, 0), False, label
        width, height = self.reader.size(i)
        if not width:  # a version written before sizes were indexed: read the header
            from PIL import Image

            width, height = Image.open(io.BytesIO(data)).size
        if self.train:
            flip = bool(self.flip and self._rng.random() < 0.5)
            box = random_resized_crop_box(width, height, self._rng, self.scale)
        else:
            flip, box = False, center_box(width, height, self.size)
        return data, box, flip, label

    def __getitems__(self, indices):
        """One uint8 [B, 3, S, S] tensor and the labels: one transfer per batch. Encoded (see
        :func:`loader`'s ``decode_on``): all the batch's JPEG bytes in one uint8 tensor and their
        offsets [B+1] (a sample without bytes was decoded here: its pixels are in ``pixels``),
        then boxes [B, 4], flips [B] and labels. A few tensors, not one per image: each tensor
        a worker hands over costs a shared-memory segment."""
        import torch

        if self.encoded:
            rows = [self._encoded(i) for i in indices]
            sizes = [len(r[0]) if isinstance(r[0], bytes) else 0 for r in rows]
            offsets = torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int64)
            data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
            view = memoryview(data.numpy())
            for r, a, b in zip(rows, offsets.tolist(), offsets.tolist()[1:]):
                if b > a:
                    view[a:b] = r[0]
            decoded = [r[0] for r in rows if not isinstance(r[0], bytes)]
            pixels = torch.stack(decoded) if decoded else torch.empty((0, 3, self.size, self.size), dtype=torch.uint8)
            return (data, offsets, pixels, torch.tensor([r[1] for r in rows], dtype=torch.int32),
                    torch.tensor([r[2] for r in rows]), torch.tensor([r[3] for r in rows], dtype=torch.int64))
        n, s = len(indices), self.size
        out = torch.empty((n, 3, s, s), dtype=torch.uint8)
        labels = torch.empty(n, dtype=torch.int64)
        for k, i in enumerate(indices):
            pixels, labels[k] = self._pixels(i)
            out[k].copy_(pixels)
        return out, labels


def _seed_worker(worker_id: int) -> None:
    import torch

    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    ds._rng = random.Random(hash((ds.seed, info.seed, worker_id)))


def _first(batch):
    return batch


def loader(dataset: ImageDataset, *, batch_size: int, sampler=None, workers: int = 2, pin_memory: bool | None = None,
           prefetch: int = 4, drop_last: bool = False, decode_on=None):
    """A DataLoader that yields (uint8 [B,3,S,S], int64 labels) batches.

    ``sampler`` is an iterable of indices (e.g. :class:`ElasticSampler` or its ``rest()``);
    default: all samples in order. Pinned memory is on when CUDA is available.

    ``decode_on`` (a device, e.g. ``"cuda"``): the worker processes only read the JPEG bytes
    and draw each crop; the batch is decoded on that device (nvJPEG, through
    torchvision.io.decode_jpeg), cropped and resized there with the same antialiased
    bilinear filter, and both tensors arrive on the device. For when the CPU cores cannot
    keep the GPU fed; the crops come from the same distribution and random stream.
    """
    import copy

    import torch

    order = list(sampler) if sampler is not None else list(range(len(dataset)))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if decode_on is not None:
        dataset = copy.copy(dataset)
        dataset.encoded = True
    kw = dict(prefetch_factor=prefetch, persistent_workers=False, worker_init_fn=_seed_worker) if workers else {}
    out = stop_safe_loader(dataset, num_workers=workers, batch_sampler=batches, collate_fn=_first,
                           pin_memory=pin_memory, **kw)
    return out if decode_on is None else DeviceDecoded(out, dataset.size, torch.device(decode_on))


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


# What a loader worker imports before it can unpickle its dataset: the fork server imports it
# once, and each worker forked from it starts with it loaded.
_PRELOAD = ("deeppod.runtime._loader_server", "torch", "torch.utils.data", "deeppod.runtime.data", "torchvision")


def worker_context():
    """The multiprocessing context loader workers start from: a fork server, started once per
    process (at the first call), single-threaded, with torch imported, ignoring SIGTERM.

    Not plain fork: a training process has native threads (gloo's, the autograd engine's)
    that may take Python's thread-state lock at any moment, and on CPython before 3.12 a
    child forked while one holds it hangs before it runs a line (python/cpython#112275; it
    hung one test run in 12 here, and a CI run). :func:`prestart` before ``runtime.init()``
    makes the server a fork of this process while it has no threads yet (it costs a fork);
    started later, it is a new interpreter that imports torch (runtime/_workers.py).
    Datasets, samplers and ``collate_fn`` must pickle, as under Python 3.14's default start
    method."""
    import importlib.util
    import multiprocessing

    from deeppod.runtime import _workers

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([m for m in _PRELOAD if importlib.util.find_spec(m.split(".")[0])])
    _workers.ensure_running()
    return ctx


def prestart() -> None:
    """Start the loader workers' fork server now, as a fork of this process: call it before
    ``runtime.init()`` (after importing torch and what the dataset needs) in a job that
    builds loaders."""
    worker_context()


def stop_safe_loader(dataset, *, num_workers: int = 0, worker_init_fn=None, **kw):
    """``torch.utils.data.DataLoader(dataset, ...)`` whose worker processes ignore the SIGTERM
    meant for the training process (see :class:`StopSafeLoader`) and start from
    :func:`worker_context` unless ``multiprocessing_context`` says otherwise."""
    import functools

    import torch

    if num_workers:  # a partial of a module function: picklable under any start method
        kw["worker_init_fn"] = functools.partial(_init_stop_safe_worker, worker_init_fn)
        if kw.get("multiprocessing_context") is None:
            kw["multiprocessing_context"] = worker_context()
    return StopSafeLoader(torch.utils.data.DataLoader(dataset, num_workers=num_workers, **kw))


def _init_stop_safe_worker(user_init, worker_id: int) -> None:
    from deeppod.runtime.stop import loader_worker_init

    loader_worker_init(worker_id)
    if user_init is not None:
        user_init(worker_id)


class StopSafeLoader:
    """A DataLoader whose worker processes survive a SIGTERM meant for the training process
    (build it with :func:`stop_safe_loader`, whose workers ignore SIGTERM). By default they
    come from :func:`worker_context`'s server, which ignores SIGTERM already; with
    ``multiprocessing_context="fork"`` iterating forks them with SIGTERM held back, so none
    dies of one before it ignores it. Everything else is the wrapped DataLoader's."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        from deeppod.runtime.stop import holding_sigterm

        with holding_sigterm():
            return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):
        if name == "loader":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
