"""Built-in image classifier: ``python -m deeppod.runtime.trainers.image_classifier --data DIR ...``

Trains a torchvision model on a class-per-folder image directory with DDP, checkpoints
every epoch and on SIGTERM, resumes on any number of workers (elastic sampler; the user
picks the batch/LR rule), reports loss, accuracy, validation accuracy, learning rate and
throughput live, uses AMP and channels_last on GPUs, fine-tunes from an earlier model,
and writes a model artifact (weights, a torch.export program, class names, input signature),
registering it in the model registry with --register NAME.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

from deeppod.atomic import atomic_json
from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_JOB_ID, ENV_JOINING
from deeppod.job_folder import JobFolder
from deeppod.runtime.data import IMAGENET_MEAN as MEAN
from deeppod.runtime.data import IMAGENET_STD as STD
from deeppod.runtime.data import normalize
from deeppod.runtime.trainers import sharded
from deeppod.runtime.trainers.models import AUTO, SMALL_CNN, TORCHVISION

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "adagrad", "adadelta", "rmsprop")
SCHEDULES = ("constant", "step", "cosine", "linear-warmup-cosine")
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


DEFAULT_BATCH = 128
MIN_STEPS = 4  # an epoch of one step (25 images, a batch of 128) barely trains: the default batch shrinks


def default_batch(n_train: int) -> int:
    """The global batch where none was given: 128, or the largest power of two that makes an
    epoch of n_train images at least MIN_STEPS steps (8 at least)."""
    batch = DEFAULT_BATCH
    while batch > 8 and batch * MIN_STEPS > n_train:
        batch //= 2
    return batch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="class-per-folder image directory, or a dataset version folder")
    src.add_argument("--dataset", help="a dataset the platform staged for this job, NAME[@VERSION]")
    p.add_argument("--min-crop", type=float, default=0.25,
                   help="datasets: RandomResizedCrop's smallest area fraction (ImageNet recipes use 0.08)")
    p.add_argument("--no-hflip", dest="hflip", action="store_false",
                   help="datasets: no random horizontal flips (digits, text: mirrored is another class)")
    p.add_argument("--model", default=AUTO, help="a torchvision classification model, 'small-cnn', or 'auto': "
                                             "resnet18 where the worker has a GPU, small-cnn on CPU")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"global batch at --base-workers workers (default: {DEFAULT_BATCH}, less where that is over a "
                        f"quarter of the training images: {MIN_STEPS} steps an epoch at least)")
    p.add_argument("--base-workers", type=int, default=None, help="world size the batch and LR are set for "
                                                                  "(default: the first run's)")
    p.add_argument("--scale-rule", choices=("keep_global_batch", "linear_lr"), default="keep_global_batch")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="momentum")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--lr-schedule", choices=SCHEDULES, default="cosine")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--image-size", type=int, default=0,
                   help="input size in pixels (default: the images' own, from 16 up to 224)")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--finetune-from", default=None, help="a model artifact folder of an earlier job")
    p.add_argument("--amp", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="ddp: every worker holds the whole model; fsdp: each holds 1/N of the parameters, "
                        "gradients and optimizer state (a model larger than one worker; docs/runtime.md)")
    p.add_argument("--offload", action="store_true",
                   help="fsdp on a GPU: the shards and optimizer state in host memory")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="fsdp: recompute each block's activations in the backward pass instead of keeping them")
    p.add_argument("--loader-workers", type=int, default=2)
    p.add_argument("--decode-on", choices=("workers", "device"), default="workers",
                   help="where a dataset version's JPEGs are decoded: the loader's worker processes, or the "
                        "GPU (nvJPEG) when the CPU cores cannot keep it fed")
    p.add_argument("--histograms-every", type=int, default=0, help="report weight/gradient histograms every N steps")
    p.add_argument("--output", default=None, help="model artifact folder (default: JOB_DIR/model)")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="register the artifact as a new version of model NAME when training ends")
    p.add_argument("--register-at-chance", action="store_true",
                   help="register it even when its validation accuracy is no better than chance (1 / classes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    p.add_argument("--val-step", choices=("step", "epoch"), default="step",
                   help="the step validation scores are reported at: the training step (beside the loss curve), "
                        "or the epochs done (a search's pruner then compares trials of different batch sizes at "
                        "equal training: 'deeppod tune image-classifier' uses it)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: each epoch)")
    p.add_argument("--resize-check-every", type=int, default=0,
                   help="steps between checks for an in-place resize (0: every step on CPU, every 10 with CUDA)")
    p.add_argument("--record-samples", default=None, help=argparse.SUPPRESS)  # tests: which samples each step saw
    p.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    args = p.parse_args(argv)
    if (args.offload or args.activation_checkpointing) and args.strategy != "fsdp":
        p.error("--offload and --activation-checkpointing go with --strategy fsdp")
    return args


# -- data ------------------------------------------------------------------------------

def scan(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    if not root.is_dir():
        sys.exit(f"--data {root} is not a folder of class folders")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(classes) < 2:
        sys.exit(f"--data {root} needs at least two class folders (found {classes})")
    items = [(str(f), i) for i, c in enumerate(classes) for f in sorted((root / c).rglob("*"))
             if f.suffix.lower() in IMAGE_EXTS]
    if not items:
        sys.exit(f"--data {root} holds no images ({', '.join(sorted(IMAGE_EXTS))})")
    return classes, items


def decode_device(args, ctx):
    """Where a dataset version's batches are decoded: None for the loader's workers."""
    return ctx.device if args.decode_on == "device" else None


def dataset_dir(args) -> Path | None:
    """The version folder to read shards from, or None for a plain class-per-folder tree."""
    from deeppod.runtime.data import dataset_path

    if args.dataset:
        try:
            return dataset_path(args.dataset)
        except FileNotFoundError as exc:
            sys.exit(str(exc))
    return Path(args.data) if (Path(args.data) / "index.npy").is_file() else None


def _dataset_ref(args) -> str | None:
    """NAME@VERSION of the data trained on (the staged folder is .../NAME/vVERSION)."""
    folder = dataset_dir(args)
    if folder is None:
        return None
    name = args.dataset.split("@")[0] if args.dataset else folder.parent.name
    return f"{name}@{folder.name.lstrip('v')}"


def split(items, val_fraction: float):
    """Deterministic by file name: the same image is always on the same side."""
    train, val = [], []
    for path, label in items:
        h = int(hashlib.sha1(Path(path).name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (val if h < val_fraction else train).append((path, label))
    return train, val


class ImageList:
    def __init__(self, items, transform):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            return self.transform(im.convert("RGB")), label


def transforms(size: int, train: bool):
    from torchvision import transforms as T

    ops = [T.Resize((size, size))]
    if train:
        ops.append(T.RandomAffine(degrees=8, translate=(0.08, 0.08)))
    ops += [T.ToTensor(), T.Normalize(MEAN, STD)]
    return T.Compose(ops)


# -- model -----------------------------------------------------------------------------

MIN_SIZE, MAX_SIZE = 16, 224
CHOICES_FILE = ".trainer-choices.json"  # in the checkpoint folder: what 'auto' chose, kept across restarts


def native_size(sizes) -> int:
    """The input size that follows the images: the median of their longer sides, between
    MIN_SIZE and MAX_SIZE (32-px images train at 32, not upsampled to 224; photos at 224)."""
    sides = sorted(max(w, h) for w, h in sizes)
    if not sides:
        return MAX_SIZE
    return max(MIN_SIZE, min(MAX_SIZE, sides[len(sides) // 2]))


def _sample(n: int, k: int = 64) -> list[int]:
    return list(range(n)) if n <= k else [i * n // k for i in range(k)]


def folder_sizes(items) -> list[tuple[int, int]]:
    from PIL import Image

    out = []
    for i in _sample(len(items)):
        with contextlib.suppress(OSError), Image.open(items[i][0]) as im:  # the header only
            out.append(im.size)
    return out


def resolve_auto(args, sizes, cuda: bool) -> None:
    """Fill in what was left to the trainer (--model auto, --image-size 0), the same way on
    every worker and every restart: the first run's choice is kept in the checkpoint folder,
    so a job resumed on other hardware still loads its checkpoint into the same model."""
    folder = os.environ.get(ENV_CHECKPOINT_DIR)
    chosen_file = Path(folder) / CHOICES_FILE if folder else None
    chosen = {}
    if chosen_file is not None and chosen_file.is_file():
        with contextlib.suppress(OSError, ValueError):
            chosen = json.loads(chosen_file.read_text())
    said = []
    if args.model == AUTO:
        args.model = chosen.get("model") or ("resnet18" if cuda else SMALL_CNN)
        said.append(f"model {args.model} ({'a GPU' if cuda else 'CPU only'}; --model to choose)")
    if not args.image_size:
        args.image_size = int(chosen.get("image_size") or native_size(sizes()))
        said.append(f"image size {args.image_size} px (the images'; --image-size to choose)")
    if said and int(os.environ.get("RANK", 0)) == 0:
        print("auto: " + ", ".join(said), flush=True)
        if chosen_file is not None and not chosen:
            with contextlib.suppress(OSError):
                atomic_json(chosen_file, {"model": args.model, "image_size": args.image_size}, mode=0o644)


def model_names() -> list[str]:
    """What --model takes: 'small-cnn' and torchvision's classification models."""
    return [SMALL_CNN, *TORCHVISION]


def build_model(name: str, num_classes: int):
    import torch

    if name == SMALL_CNN:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, num_classes))
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        sys.exit(f"--model {name} is not a torchvision classification model (try resnet18, resnet50, "
                 f"mobilenet_v3_small, efficientnet_b0) or 'small-cnn'")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)  # never downloads


def make_optimizer(args, params, lr: float):
    import torch

    o, wd = args.optimizer, args.weight_decay
    if o == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if o in ("momentum", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=args.momentum, nesterov=o == "nesterov", weight_decay=wd)
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adagrad": torch.optim.Adagrad,
            "adadelta": torch.optim.Adadelta, "rmsprop": torch.optim.RMSprop}[o](params, lr=lr, weight_decay=wd)


def lr_factor(args, epoch_progress: float) -> float:
    """Multiplier of the base LR at a fractional epoch."""
    if args.warmup_epochs and epoch_progress < args.warmup_epochs:
        return max(1e-3, epoch_progress / args.warmup_epochs)
    if args.lr_schedule == "constant":
        return 1.0
    if args.lr_schedule == "step":
        return 0.1 ** int(epoch_progress // max(1, args.epochs // 3))
    t = (epoch_progress - args.warmup_epochs) / max(1e-9, args.epochs - args.warmup_epochs)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


# -- training --------------------------------------------------------------------------

class Run:
    """One run of the trainer, in the parts docs/runtime.md's loop has: the data and the model
    (before ``runtime.init()``), the rest of the setup, an epoch of steps, what to do on an
    event (a stop, an in-place resize), evaluation, and the artifact at the end."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from deeppod.runtime.data import prestart

        self.args = args
        self.version_dir = dataset_dir(args)
        if args.model != SMALL_CNN or self.version_dir is None:
            import torchvision  # noqa: F401 - models, a folder's transforms: a second a warm spare spends before it parks
        if args.loader_workers:
            from PIL import Image  # noqa: F401 - what the loader workers decode with
            # After the imports: the loader workers' fork server is a fork of this process, and
            # every worker it starts (each epoch, each resize) has them without importing them.
            prestart()
        # The data's index and the model come before runtime.init(): a warm spare (parked in
        # init until a grow needs it) has them ready, and a grow does not wait for them.
        torch.manual_seed(args.seed)
        self._data(torch.cuda.is_available())
        self.model = build_model(args.model, len(self.classes))
        self.new_layers = self._finetune() if args.finetune_from else []
        self._setup()

    def _data(self, cuda: bool) -> None:
        args = self.args
        if self.version_dir is not None:
            from deeppod.runtime.data import ImageDataset, ShardReader

            def sizes():
                reader = ShardReader(self.version_dir, "train")
                return [wh for wh in (reader.size(i) for i in _sample(len(reader))) if wh[0]]  # 0: not indexed

            resolve_auto(args, sizes, cuda)
            self.train_set = ImageDataset(self.version_dir, "train", size=args.image_size, train=True,
                                          seed=args.seed, scale=(args.min_crop, 1.0), flip=args.hflip)
            self.val_items = ImageDataset(self.version_dir, "val", size=args.image_size, train=False)
            self.classes, self.n_train = self.train_set.classes, len(self.train_set)
        else:
            self.classes, items = scan(Path(args.data))
            resolve_auto(args, lambda: folder_sizes(items), cuda)
            train_items, self.val_items = split(items, args.val_fraction)
            self.train_set, self.n_train = ImageList(train_items, transforms(args.image_size, True)), len(train_items)
        self.batch_note = ""
        if args.batch_size is None:
            args.batch_size = default_batch(self.n_train)
            if args.batch_size != DEFAULT_BATCH:
                self.batch_note = (f"; global batch {args.batch_size}: the default {DEFAULT_BATCH} would make an "
                                   f"epoch of {self.n_train} images under {MIN_STEPS} steps (--batch-size to choose)")

    def _finetune(self) -> list[str]:
        """Start from an earlier model's weights; its classifier layers are new where the
        classes differ. The names of those layers."""
        import torch

        state = torch.load(Path(self.args.finetune_from) / "weights.pt", map_location="cpu", weights_only=True)
        head = {k for k, v in self.model.state_dict().items() if k in state and v.shape != state[k].shape}
        self.model.load_state_dict({k: v for k, v in state.items() if k not in head}, strict=False)
        return sorted(head)

    def _setup(self) -> None:
        """runtime.init(), then the model on its device, the optimizer and the run's state: from
        the latest checkpoint, or from rank 0 on a worker that joins a running job."""
        import torch

        from deeppod import runtime

        args = self.args
        self.ctx = ctx = runtime.init()
        self.cuda = ctx.device.type == "cuda"
        self.amp = args.amp == "on" or (args.amp == "auto" and self.cuda)
        self.channels_last = args.channels_last == "on" or (args.channels_last == "auto" and self.cuda)
        if args.finetune_from and ctx.is_chief:
            print(f"fine-tuning from {args.finetune_from} (new classifier layers: {self.new_layers or 'none'})",
                  flush=True)
        if args.strategy == "fsdp":  # each worker keeps 1/N; bf16 compute on a GPU comes with the sharding
            self.amp = self.channels_last = False
            self.model = runtime.shard(self.model, offload=args.offload,
                                       activation_checkpointing=args.activation_checkpointing)
        else:
            self.model.to(ctx.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.ckpt = runtime.Checkpointer(keep=2, background=True)
        self.sampler = runtime.ElasticSampler(self.n_train, seed=args.seed)
        self.opt = make_optimizer(args, self.model.parameters(), args.lr)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        joining = os.environ.get(ENV_JOINING) == "1"  # an in-place grow: rank 0 sends the state, not a checkpoint
        self.state = None if joining else self.ckpt.load_latest(model=self.model, optimizer=self.opt,
                                                                 scaler=self.scaler, sampler=self.sampler)
        self.step, self.epoch = (self.state["step"], self.state["epoch"]) if self.state else (0, 0)
        # The base world size belongs to the run: a resumed run keeps the one it started with.
        self.base_world = (self.state or {}).get("extra", {}).get("base_world") or args.base_workers \
            or ctx.world_size
        self.shared = {"step": self.step, "epoch": self.epoch, "base_world": self.base_world,
                       "scaler": self.scaler.state_dict()}
        self.loss_fn = torch.nn.CrossEntropyLoss()
        # a joiner receives rank 0's state here
        self.resizer = runtime.Resizer(self.model, self.opt, self.sampler, self.shared, ctx=ctx)
        self.gave_up = False  # the last step was given up for a new world (Resizer.interruptible)
        if joining:
            self.step, self.epoch, self.base_world = (self.shared["step"], self.shared["epoch"],
                                                      self.shared["base_world"])
            self.scaler.load_state_dict(self.shared["scaler"])
        self.ddp = self.wrap(synced=joining)
        self.per_worker = max(1, math.ceil(args.batch_size / self.base_world))
        self.batch, self.lr = self.rescale()
        self.check_every = args.resize_check_every or (10 if self.cuda else 1)
        self.activations = runtime.ActivationRecorder(self.model) if args.histograms_every and ctx.is_chief else None
        # A stop while a step, an evaluation or a loader's start-up takes longer than the grace
        # allows: the guard saves the last completed step and exits, instead of a SIGKILL losing it.
        # A sharded save needs every worker at once, which a guard in one worker's thread cannot
        # ask for: a sharded job's guard exits for a resume from the last checkpoint instead.
        self.guard = runtime.StopGuard(None if args.strategy == "fsdp" else lambda: self.save(blocking=True),
                                       rank=ctx.rank, before_exit=_close_metrics)
        if ctx.is_chief:
            if not self.state:
                where = "from scratch"
            elif self.epoch >= args.epochs:  # every epoch was done: only the model is written again
                where = f"resuming at epoch {args.epochs} step {self.step}, its last, done"
            else:
                where = f"resuming at epoch {self.epoch + 1} step {self.step}, {self.sampler.position} samples in"
            print(f"world {ctx.world_size} (base {self.base_world}), per-worker batch {self.batch}, lr {self.lr:g}, "
                  f"{where}; {self.n_train} train / {len(self.val_items)} val images, {len(self.classes)} classes"
                  f"{self.batch_note}",
                  flush=True)

    def wrap(self, synced: bool = False):
        """The model in DDP across the world (itself alone). After an in-place resize every
        worker holds rank 0's weights (the Resizer sent them): DDP need not broadcast them
        again (100 MB for a ResNet-50)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        ctx = self.ctx
        if self.args.strategy == "fsdp":
            return self.model  # sharded over the world already
        return DDP(self.model, device_ids=[ctx.device.index] if self.cuda else None, init_sync=not synced) \
            if ctx.world_size > 1 else self.model

    def rescale(self) -> tuple[int, float]:
        """The per-worker batch and the LR at the current world size (a new size may mean a new LR)."""
        from deeppod.runtime.scaling import scale_for_world

        batch, lr = scale_for_world(self.ctx.world_size, base_world_size=self.base_world,
                                    per_worker_batch=self.per_worker, base_lr=self.args.lr, rule=self.args.scale_rule)
        for g in self.opt.param_groups:
            g["lr"] = lr
        return batch, lr

    def save(self, blocking=None) -> None:
        with self.guard:  # the state of a completed step, never one half-updated
            self.ckpt.save(self.step, model=self.model, optimizer=self.opt, scaler=self.scaler, epoch=self.epoch,
                           sampler=self.sampler, extra={"base_world": self.base_world, "classes": self.classes},
                           blocking=blocking)

    def _loader(self, order: list[int]):
        args, cuda = self.args, self.cuda
        if self.version_dir is not None:
            from deeppod.runtime.data import loader as shard_loader

            return shard_loader(self.train_set, batch_size=self.batch, sampler=order, workers=args.loader_workers,
                                pin_memory=cuda, decode_on=decode_device(args, self.ctx))
        from deeppod.runtime.data import stop_safe_loader

        return stop_safe_loader(self.train_set, batch_size=self.batch, sampler=order,
                                num_workers=args.loader_workers, pin_memory=cuda, persistent_workers=False)

    def train_epoch(self) -> str | None:
        """The steps of the epoch from where the sampler is; None at its end (or at a stop or
        --max-steps), RESIZE when the workers agreed on a new world size, STOP on a stop."""
        from deeppod.errors import StepAbandoned

        args, ctx, sampler = self.args, self.ctx, self.sampler
        sampler.set_epoch(self.epoch)
        order = list(sampler)
        # steps every worker takes in this pass: only on those may they all meet in a collective
        even = (sampler.n - sampler.position) // (self.batch * ctx.world_size)
        fsdp = self.args.strategy == "fsdp" and ctx.world_size > 1
        most = sharded.most(math.ceil(len(order) / self.batch)) if fsdp else 0  # the steps of the busiest worker
        record = open(Path(args.record_samples) / f"run{ctx.restart_count}-rank{ctx.rank}.txt", "a") \
            if args.record_samples else None
        self.loss = None  # stays None when a stop came after the epoch's last step: nothing left to train
        self.ddp.train()
        self.began, self.seen = time.perf_counter(), 0
        try:
            return self._steps(order, even, fsdp, most, record)
        except StepAbandoned:  # given up for a new world (left join() without its closing collectives)
            self.opt.zero_grad(set_to_none=True)
            self.loss = None
            event = self.resizer.check()  # "resize", without a collective: the old group is given up
            if event is None:  # it saw the world the step was given up for
                raise RuntimeError("a step was given up for a new world that check() does not see") from None
            self.gave_up = True
            return event

    def _steps(self, order, even, fsdp, most, record) -> str | None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from deeppod import runtime

        args, sampler, k = self.args, self.sampler, 0
        with self.ddp.join() if isinstance(self.ddp, DDP) else contextlib.nullcontext():
            for x, y in self._loader(order):
                # its samples are dealt again at the new size where it is given up (StepAbandoned)
                self._step(x, y, together=k < even)
                if record is not None:
                    record.write(f"{self.epoch} {self.step} "
                                 f"{' '.join(map(str, order[k * self.batch:(k + 1) * self.batch]))}\n")
                    record.flush()
                k += 1
                if args.checkpoint_every and self.step % args.checkpoint_every == 0 and not sampler.epoch_done:
                    self.save()
                if args.max_steps and self.step >= args.max_steps:
                    return None  # the same step on every worker
                if k <= even:
                    # A step every worker takes: a stop leaves here only where all agree on it. A
                    # worker whose SIGTERM came a step before the others' must not leave alone, or
                    # they would meet check()'s collective with no peer in it (gloo: "connection
                    # closed by peer"); join() covers DDP's collectives only.
                    if k % self.check_every == 0:
                        event = self.resizer.check()  # agrees on a stop, or on a new size, on every worker
                        if event is not None:
                            return event
                elif not fsdp and runtime.should_stop(sync=False):
                    return None  # the epoch's uneven tail: join() covers a worker that leaves early
            for _ in range(most - k):  # no join() for shards: an empty step meets the others' collectives
                self._empty_step()
        return None

    def _set_lr(self) -> None:
        """The schedule's LR at the sampler's position (every worker the same, each step)."""
        progress = self.epoch + self.sampler.position / max(1, self.sampler.n)
        for g in self.opt.param_groups:
            g["lr"] = self.lr * lr_factor(self.args, progress)

    def _empty_step(self) -> None:
        """A sharded worker whose share of the epoch ran out: the collectives of a step with a
        zero gradient, as DDP's join() stands in for it, and the same step count and sampler."""
        self._set_lr()  # the shards this worker updates take the step's LR, as the others' do
        with self.guard:
            sharded.empty_step(self.model, self.opt, self.args.image_size, self.ctx.device)
            self.sampler.advance(self.batch)
            self.step += 1

    def _step(self, x, y, together: bool) -> None:
        """One step; StepAbandoned where it was given up for a new world (nothing updated).
        ``together``: a step every worker takes (not an epoch's uneven tail)."""
        import torch

        from deeppod import runtime

        args, ctx, opt, sampler = self.args, self.ctx, self.opt, self.sampler
        x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
        if x.dtype == torch.uint8:  # dataset batches: normalised here, on the device
            x = normalize(x, MEAN, STD)
        if self.channels_last:
            x = x.to(memory_format=torch.channels_last)
        self._set_lr()
        with self.resizer.interruptible(together):
            with torch.autocast(ctx.device.type, enabled=self.amp):
                out = self.ddp(x)
                self.loss = self.loss_fn(out, y)
            opt.zero_grad(set_to_none=True)
            self.scaler.scale(self.loss).backward()
        if args.step_delay:  # tests: a slow step (its forward and backward)
            time.sleep(args.step_delay)
        with self.guard:  # the step's update: a stop's save waits for it, or comes before it
            self.scaler.step(opt)
            self.scaler.update()
            sampler.advance(self.batch)
            self.step += 1
        self.resizer.stepped()  # after the first step at a new size: tell the control plane
        self.seen += len(y)
        runtime.report(self.step, loss=self.loss.detach(), accuracy=(out.argmax(1) == y).float().mean(),
                       lr=opt.param_groups[0]["lr"], epoch=self.epoch + sampler.position / max(1, sampler.n),
                       images_per_second=self.seen * ctx.world_size / max(1e-9, time.perf_counter() - self.began))
        if self.activations is not None and self.step % args.histograms_every == 0:
            runtime.report_histograms(self.step, {**runtime.model_histograms(self.model), **self.activations.tensors()})

    def on_resize(self) -> bool:
        """Every worker left the epoch's join together, with the old group still up: switch to
        the new world (a worker past the new size exits here). Whether it did."""
        from deeppod.runtime.resize import RESIZED

        self.shared.update(step=self.step, epoch=self.epoch, scaler=self.scaler.state_dict())
        self.ddp = self.model  # the old wrapper holds the old group: a given-up step's peers wait for it to close
        if self.resizer.resize() != RESIZED:
            return False
        self.ctx = self.resizer.ctx
        self.ddp = self.wrap(synced=True)
        self.batch, self.lr = self.rescale()
        if self.ctx.is_chief:
            print(f"resized in place to {self.ctx.world_size} workers in {self.resizer.last_switch_seconds:.2f} s: "
                  f"per-worker batch {self.batch}, lr {self.lr:g}, "
                  f"{self.sampler.position}/{self.sampler.n} samples in"
                  + ("; the step under way was given up for it" if self.gave_up else ""), flush=True)
        self.gave_up = False
        return True

    def on_stop(self, stopping: bool) -> None:
        """A stop (or --max-steps): save the completed step; a stop exits for a resume."""
        from deeppod import runtime

        with self.guard:
            if stopping:
                self.guard.handled()  # this path saves: the guard stands down
            self.save()
            self.ckpt.wait()
        if self.ctx.is_chief:
            print(f"stopping at epoch {self.epoch + 1} step {self.step} ({self.sampler.position}/{self.sampler.n} "
                  "samples); checkpoint saved", flush=True)
        if not (self.args.max_steps and self.step >= self.args.max_steps and not runtime.should_stop(sync=False)):
            _close_metrics()
            runtime.exit_for_resume()

    def evaluate(self) -> dict[str, float]:
        from deeppod import runtime

        scores = evaluate(self.ddp, self.val_items, self.args, self.ctx, self.channels_last, self.amp, self.loss_fn)
        runtime.report(self.epoch + 1 if self.args.val_step == "epoch" else self.step, **scores)
        return scores

    def run(self) -> int:
        from deeppod import runtime
        from deeppod.runtime.resize import RESIZE

        args = self.args
        try:
            scores = None  # validation figures of the final model
            while self.epoch < args.epochs:
                if self.train_epoch() == RESIZE and self.on_resize():
                    continue  # the rest of the epoch, dealt to the new world
                # Everyone agrees here (all ranks left the join), so a stop cannot deadlock a collective.
                stopping = runtime.should_stop()
                if stopping or (args.max_steps and self.step >= args.max_steps):
                    self.on_stop(stopping)  # a stop exits here
                    scores = self.evaluate()  # --max-steps: the model is final
                    break
                # the training's rate, as the images_per_second metric has it: evaluation not counted
                rate = self.seen * self.ctx.world_size / max(1e-9, time.perf_counter() - self.began)
                scores = self.evaluate()
                if self.ctx.is_chief:  # epochs counted from 1, as the charts' epoch metric counts those done
                    loss = '-' if self.loss is None else f'{self.loss.item():.4f}'
                    print(f"epoch {self.epoch + 1}/{args.epochs}: loss {loss} "
                          f"val_accuracy {scores['val_accuracy']:.4f} val_loss {scores['val_loss']:.4f} "
                          f"({rate:.1f} images/s)", flush=True)
                with self.guard:
                    self.epoch += 1
                    self.sampler.set_epoch(self.epoch)
                self.save()
            self.ckpt.wait()
            if scores is None:  # resumed from the final checkpoint: no epoch ran, the model is already done
                scores = self.evaluate()
            whole = self.model
            if args.strategy == "fsdp":  # every worker gives its shards; the chief gets them, where the optimizer was
                self.opt = self.resizer = None
                whole = sharded.whole(self.model, lambda: build_model(args.model, len(self.classes)))
            if self.ctx.is_chief:
                self.write_model(scores, whole)
            self.guard.close()
            _finish(self.ctx)
            return 0
        finally:
            self.guard.settle()  # a save the guard began ends before the process does

    def write_model(self, scores: dict[str, float], model) -> None:
        args, ctx = self.args, self.ctx
        out = Path(args.output) if args.output else (JobFolder(ctx.job_dir).model if ctx.job_dir else Path("model"))
        write_artifact(model, self.classes, args, scores, out,
                       crop="center" if self.version_dir is not None else "squash")
        if args.register:
            refused = at_chance(scores, len(self.classes)) if not args.register_at_chance else None
            if refused:
                print(f"not registered as {args.register!r}: {refused}", flush=True)
            else:
                register(args.register, out)


def main(argv=None) -> int:
    return Run(parse_args(argv)).run()


def _close_metrics() -> None:
    from deeppod.runtime import metrics

    metrics.reporter().close()


def _finish(ctx) -> None:
    import torch.distributed as dist

    from deeppod.runtime import metrics

    metrics.reporter().close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def evaluate(ddp, val_items, args, ctx, channels_last, amp, loss_fn) -> dict[str, float]:
    """Validation accuracy and mean loss over the whole validation set (each rank a slice,
    summed): ``{"val_accuracy": ..., "val_loss": ...}``."""
    import torch
    import torch.distributed as dist

    from deeppod.runtime.data import stop_safe_loader

    if not val_items:
        return {"val_accuracy": float("nan"), "val_loss": float("nan")}
    if hasattr(val_items, "reader"):  # a dataset split
        from deeppod.runtime.data import loader as shard_loader

        loader = shard_loader(val_items, batch_size=256, sampler=range(ctx.rank, len(val_items), ctx.world_size),
                              workers=args.loader_workers, decode_on=decode_device(args, ctx))
    else:
        part = val_items[ctx.rank::ctx.world_size]
        loader = stop_safe_loader(ImageList(part, transforms(args.image_size, False)), batch_size=256,
                                  num_workers=args.loader_workers)
    model = getattr(ddp, "module", ddp)
    model.eval()
    correct = torch.zeros(3, device=ctx.device)  # right, seen, summed loss
    # sharded: every worker runs as many forward passes as the busiest one (each gathers weights with all)
    padding = sharded.most(math.ceil(len(range(ctx.rank, len(val_items), ctx.world_size)) / 256)) \
        if args.strategy == "fsdp" and ctx.world_size > 1 else 0
    with torch.no_grad():
        for x, y in loader:
            padding -= 1
            x, y = x.to(ctx.device), y.to(ctx.device)
            if x.dtype == torch.uint8:
                x = normalize(x, MEAN, STD)
            if channels_last:
                x = x.to(memory_format=torch.channels_last)
            with torch.autocast(ctx.device.type, enabled=amp):
                logits = model(x)
            correct[0] += (logits.argmax(1) == y).sum()
            correct[1] += len(y)
            correct[2] += loss_fn(logits.float(), y) * len(y)
        for _ in range(padding):
            model(torch.zeros(1, 3, args.image_size, args.image_size, device=ctx.device))
    if dist.is_initialized():
        dist.all_reduce(correct)
    right, seen, loss = (correct / correct[1].clamp(min=1)).tolist()
    return {"val_accuracy": right, "val_loss": loss}


def at_chance(scores: dict[str, float], classes: int) -> str | None:
    """Why a model is not worth registering (its validation accuracy is no better than
    guessing), or None. No validation set says nothing: None."""
    acc, chance = scores.get("val_accuracy", float("nan")), 1.0 / max(1, classes)
    if classes < 2 or acc != acc or acc > chance + 1e-9:
        return None
    return (f"val_accuracy {acc:.4g} is no better than chance ({chance:.4g}, 1 of {classes} classes): train "
            "longer, lower --lr, or give more images (--register-at-chance registers it anyway; the model is in "
            "the job's folder)")


def register(name: str, out: Path) -> None:
    """Ask the platform to register the artifact (the job's own token authorises it)."""
    from deeppod.runtime.registry import register_model

    try:
        v = register_model(name, out)
    except RuntimeError as exc:  # the model is still on disk: register it by hand later
        print(f"could not register the model as {name!r}: {exc}", flush=True)
        return
    print(f"registered as {name}@{v['version']}", flush=True)


def write_artifact(model, classes, args, scores: dict[str, float], out: Path, crop: str = "squash") -> None:
    """weights.pt (state dict), model.pt2 (torch.export program with a dynamic batch: the
    self-contained serving form) and signature.json (classes, input shape, preprocessing):
    what the registry and serving need."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").to(memory_format=torch.contiguous_format).eval()
    torch.save(model.state_dict(), out / "weights.pt")
    example = torch.zeros(2, 3, args.image_size, args.image_size)
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(program, str(out / "model.pt2"))
    (out / "signature.json").write_text(json.dumps({
        "task": "image-classification", "model": args.model, "classes": classes,
        "input": {"kind": "image", "shape": [3, args.image_size, args.image_size], "dtype": "float32",
                  "resize": [args.image_size, args.image_size], "color": "RGB", "mean": MEAN, "std": STD,
                  # center: Resize(S*256/224) + CenterCrop(S), as the dataset loader evaluates; squash: Resize((S, S))
                  "crop": crop},
        "metrics": dict(scores),
        "hyperparameters": {k: v for k, v in vars(args).items() if k not in ("step_delay",)},
        "job_id": os.environ.get(ENV_JOB_ID),
        "command": sys.argv,
        "dataset": _dataset_ref(args),
    }, indent=1))
    print(f"model artifact written to {out} (val_accuracy {scores['val_accuracy']:.4f})", flush=True)


if __name__ == "__main__":
    from deeppod.runtime.stop import exit_process

    exit_process(main())  # a failure raises as usual; an end skips the teardown gloo's threads can abort
