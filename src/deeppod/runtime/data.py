"""``deeppod.runtime.data``: feed a DeepPod dataset version to training.

The loader decodes in worker processes, asks for a reduced-size JPEG decode when the random
crop allows it, crops and resizes in one step, and hands over one uint8 NCHW tensor per
batch: normalisation (and channels_last) belong on the device (:func:`normalize`).
Sharding across workers uses :class:`ElasticSampler`. The version's on-disk format is
``runtime/shards.py``; decoding and crops are ``runtime/decode.py``; this module holds the
dataset, the loader and its worker processes (started from a fork server, stop-safe).
"""

from __future__ import annotations

import io
import itertools
import math
import random

from deeppod.runtime.decode import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DeviceDecoded,
    center_box,
    decode_crop,
    decode_on_device,
    normalize,
    random_resized_crop_box,
)
from deeppod.runtime.shards import SPLITS, TRAIN, VAL, ShardReader, dataset_path, iter_shard

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "SPLITS", "TRAIN", "VAL", "DeviceDecoded", "ImageDataset", "ShardReader",
           "StopSafeLoader", "center_box", "dataset_path", "decode_crop", "decode_on_device", "iter_shard", "loader",
           "normalize", "prestart", "random_resized_crop_box", "stop_safe_loader", "worker_context"]


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
        out = _batch_tensor((n, 3, s, s))
        labels = torch.empty(n, dtype=torch.int64)
        for k, i in enumerate(indices):
            pixels, labels[k] = self._pixels(i)
            out[k].copy_(pixels)
        return out, labels


def _batch_tensor(shape):
    """An empty uint8 tensor for a batch: in a loader worker, straight in shared memory, as
    torch's own collate does, so handing it to the training process copies nothing (else
    the queue would copy the whole batch into a new segment)."""
    import torch

    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


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


# What a loader worker imports before it can unpickle its dataset: the fork server imports it
# once, and each worker forked from it starts with it loaded.
_PRELOAD = ("deeppod.runtime._loader_server", "torch", "torch.utils.data", "deeppod.runtime.data",
            "deeppod.runtime.shards",
            "deeppod.runtime.decode", "torchvision")


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
        from deeppod.runtime.stop import kill_daemonic_children_at_exit

        kill_daemonic_children_at_exit()  # torch's terminate() of a late worker is a SIGTERM they ignore
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
