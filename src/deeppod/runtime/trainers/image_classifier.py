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

from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_JOB_ID, ENV_JOINING
from deeppod.runtime.trainers.models import AUTO, SMALL_CNN, TORCHVISION

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "adagrad", "adadelta", "rmsprop")
SCHEDULES = ("constant", "step", "cosine", "linear-warmup-cosine")
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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
    p.add_argument("--batch-size", type=int, default=128, help="global batch at --base-workers workers")
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
    p.add_argument("--loader-workers", type=int, default=2)
    p.add_argument("--decode-on", choices=("workers", "device"), default="workers",
                   help="where a dataset version's JPEGs are decoded: the loader's worker processes, or the "
                        "GPU (nvJPEG) when the CPU cores cannot keep it fed")
    p.add_argument("--histograms-every", type=int, default=0, help="report weight/gradient histograms every N steps")
    p.add_argument("--output", default=None, help="model artifact folder (default: JOB_DIR/model)")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="register the artifact as a new version of model NAME when training ends")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: each epoch)")
    p.add_argument("--resize-check-every", type=int, default=0,
                   help="steps between checks for an in-place resize (0: every step on CPU, every 10 with CUDA)")
    p.add_argument("--record-samples", default=None, help=argparse.SUPPRESS)  # tests: which samples each step saw
    p.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slow steps down
    return p.parse_args(argv)


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


def normalize(x, mean, std):
    from deeppod.runtime.data import normalize as _normalize

    return _normalize(x, mean, std)


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
                tmp = chosen_file.with_name(f".{chosen_file.name}.tmp")
                tmp.write_text(json.dumps({"model": args.model, "image_size": args.image_size}))
                os.replace(tmp, chosen_file)


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

def main(argv=None) -> int:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from deeppod import runtime
    from deeppod.runtime import metrics as rt_metrics
    from deeppod.runtime.data import prestart, stop_safe_loader
    from deeppod.runtime.scaling import scale_for_world

    args = parse_args(argv)
    version_dir = dataset_dir(args)
    if args.model != SMALL_CNN or version_dir is None:
        import torchvision  # noqa: F401 - models, a folder's transforms: a second a warm spare spends before it parks
    if args.loader_workers:
        from PIL import Image  # noqa: F401 - what the loader workers decode with
        # After the imports: the loader workers' fork server is a fork of this process, and
        # every worker it starts (each epoch, each resize) has them without importing them.
        prestart()
    # The data's index and the model come before runtime.init(): a warm spare (parked in
    # init until a grow needs it) has them ready, and a grow does not wait for them.
    torch.manual_seed(args.seed)
    if version_dir is not None:
        from deeppod.runtime.data import ImageDataset, ShardReader

        def sizes():
            reader = ShardReader(version_dir, "train")
            return [wh for wh in (reader.size(i) for i in _sample(len(reader))) if wh[0]]  # 0: not indexed

        resolve_auto(args, sizes, torch.cuda.is_available())
        train_set = ImageDataset(version_dir, "train", size=args.image_size, train=True, seed=args.seed,
                                 scale=(args.min_crop, 1.0), flip=args.hflip)
        val_set = ImageDataset(version_dir, "val", size=args.image_size, train=False)
        classes, train_items, val_items = train_set.classes, range(len(train_set)), val_set
    else:
        classes, items = scan(Path(args.data))
        resolve_auto(args, lambda: folder_sizes(items), torch.cuda.is_available())
        train_items, val_items = split(items, args.val_fraction)
        train_set = ImageList(train_items, transforms(args.image_size, True))
    model = build_model(args.model, len(classes))
    if args.finetune_from:
        state = torch.load(Path(args.finetune_from) / "weights.pt", map_location="cpu", weights_only=True)
        head = {k for k, v in model.state_dict().items() if k in state and v.shape != state[k].shape}
        model.load_state_dict({k: v for k, v in state.items() if k not in head}, strict=False)
    ctx = runtime.init()
    cuda = ctx.device.type == "cuda"
    amp = args.amp == "on" or (args.amp == "auto" and cuda)
    channels_last = args.channels_last == "on" or (args.channels_last == "auto" and cuda)

    if args.finetune_from and ctx.is_chief:
        print(f"fine-tuning from {args.finetune_from} (new classifier layers: {sorted(head) or 'none'})", flush=True)
    model.to(ctx.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    def wrap(ctx, synced=False):
        # After an in-place resize every worker holds rank 0's weights (the Resizer sent them):
        # DDP need not broadcast them again (100 MB for a ResNet-50).
        return DDP(model, device_ids=[ctx.device.index] if cuda else None, init_sync=not synced) \
            if ctx.world_size > 1 else model

    ckpt = runtime.Checkpointer(keep=2, background=True)
    sampler = runtime.ElasticSampler(len(train_items), seed=args.seed)
    opt = make_optimizer(args, model.parameters(), args.lr)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    joining = os.environ.get(ENV_JOINING) == "1"  # an in-place grow: rank 0 sends the state, not a checkpoint
    state = None if joining else ckpt.load_latest(model=model, optimizer=opt, scaler=scaler, sampler=sampler)
    step, epoch = (state["step"], state["epoch"]) if state else (0, 0)
    # The base world size belongs to the run: a resumed run keeps the one it started with.
    base_world = (state or {}).get("extra", {}).get("base_world") or args.base_workers or ctx.world_size
    shared = {"step": step, "epoch": epoch, "base_world": base_world, "scaler": scaler.state_dict()}
    loss_fn = torch.nn.CrossEntropyLoss()
    resizer = runtime.Resizer(model, opt, sampler, shared, ctx=ctx)  # a joiner receives rank 0's here
    if joining:
        step, epoch, base_world = shared["step"], shared["epoch"], shared["base_world"]
        scaler.load_state_dict(shared["scaler"])
    ddp = wrap(ctx, synced=joining)
    per_worker = max(1, math.ceil(args.batch_size / base_world))

    def rescale(world_size):
        batch, lr = scale_for_world(world_size, base_world_size=base_world, per_worker_batch=per_worker,
                                    base_lr=args.lr, rule=args.scale_rule)
        for g in opt.param_groups:  # a new world size may mean a new LR (linear_lr)
            g["lr"] = lr
        return batch, lr

    batch, lr = rescale(ctx.world_size)
    check_every = args.resize_check_every or (10 if cuda else 1)
    if ctx.is_chief:
        print(f"world {ctx.world_size} (base {base_world}), per-worker batch {batch}, lr {lr:g}, "
              f"{'resuming at epoch %d step %d, %d samples in' % (epoch, step, sampler.position) if state else 'from scratch'}"
              f"; {len(train_items)} train / {len(val_items)} val images, {len(classes)} classes", flush=True)

    loader_kw = dict(num_workers=args.loader_workers, pin_memory=cuda, persistent_workers=False)
    activations = runtime.ActivationRecorder(model) if args.histograms_every and ctx.is_chief else None

    def save(blocking=None):
        with guard:  # the state of a completed step, never one half-updated
            ckpt.save(step, model=model, optimizer=opt, scaler=scaler, epoch=epoch, sampler=sampler,
                      extra={"base_world": base_world, "classes": classes}, blocking=blocking)

    # A stop while a step, an evaluation or a loader's start-up takes longer than the grace
    # allows: the guard saves the last completed step and exits, instead of a SIGKILL losing it.
    guard = runtime.StopGuard(lambda: save(blocking=True), rank=ctx.rank,
                              before_exit=lambda: rt_metrics.reporter().close())

    try:
        acc = None  # validation accuracy of the final model
        while epoch < args.epochs:
            sampler.set_epoch(epoch)
            order = list(sampler)
            # steps every worker takes in this pass: only on those may they all meet in a collective
            even = (sampler.n - sampler.position) // (batch * ctx.world_size)
            event = None
            if version_dir is not None:
                from deeppod.runtime.data import loader as shard_loader

                loader = shard_loader(train_set, batch_size=batch, sampler=order, workers=args.loader_workers,
                                      pin_memory=cuda, decode_on=decode_device(args, ctx))
            else:
                loader = stop_safe_loader(train_set, batch_size=batch, sampler=order, **loader_kw)
            record = open(Path(args.record_samples) / f"run{ctx.restart_count}-rank{ctx.rank}.txt", "a") \
                if args.record_samples else None
            k = 0
            loss = None  # stays None when a stop came after the epoch's last step: resumed, nothing left to train
            ddp.train()
            began, seen = time.perf_counter(), 0
            join = ddp.join() if isinstance(ddp, DDP) else contextlib.nullcontext()
            with join:
                for x, y in loader:
                    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
                    if x.dtype == torch.uint8:  # dataset batches: normalised here, on the device
                        x = normalize(x, MEAN, STD)
                    if channels_last:
                        x = x.to(memory_format=torch.channels_last)
                    for g in opt.param_groups:
                        g["lr"] = lr * lr_factor(args, epoch + sampler.position / max(1, sampler.n))
                    with torch.autocast(ctx.device.type, enabled=amp):
                        out = ddp(x)
                        loss = loss_fn(out, y)
                    opt.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    if args.step_delay:  # tests: a slow step (its forward and backward)
                        time.sleep(args.step_delay)
                    with guard:  # the step's update: a stop's save waits for it, or comes before it
                        scaler.step(opt)
                        scaler.update()
                        sampler.advance(batch)
                        step += 1
                    resizer.stepped()  # after the first step at a new size: tell the control plane
                    seen += len(y)
                    if record is not None:
                        record.write(f"{epoch} {step} {' '.join(map(str, order[k * batch:(k + 1) * batch]))}\n")
                        record.flush()
                    k += 1
                    runtime.report(step, loss=loss.detach(), accuracy=(out.argmax(1) == y).float().mean(),
                                   lr=opt.param_groups[0]["lr"], epoch=epoch + sampler.position / max(1, sampler.n),
                                   images_per_second=seen * ctx.world_size / max(1e-9, time.perf_counter() - began))
                    if activations is not None and step % args.histograms_every == 0:
                        runtime.report_histograms(step, {**runtime.model_histograms(model), **activations.tensors()})
                    if args.checkpoint_every and step % args.checkpoint_every == 0 and not sampler.epoch_done:
                        save()
                    if runtime.should_stop(sync=False) or (args.max_steps and step >= args.max_steps):
                        break
                    if k <= even and k % check_every == 0:
                        event = resizer.check()  # agrees on a stop, or on a new size, on every worker
                        if event is not None:
                            break
            if event == "resize":  # everyone left the join together, with the old group still up
                shared.update(step=step, epoch=epoch, scaler=scaler.state_dict())
                event = resizer.resize()  # a worker past the new size exits here
                if event == "resized":
                    ctx = resizer.ctx
                    ddp = wrap(ctx, synced=True)
                    batch, lr = rescale(ctx.world_size)
                    if ctx.is_chief:
                        print(f"resized in place to {ctx.world_size} workers in {resizer.last_switch_seconds:.2f} s: "
                              f"per-worker batch {batch}, lr {lr:g}, {sampler.position}/{sampler.n} samples in",
                              flush=True)
                    continue  # the rest of the epoch, dealt to the new world
            # Everyone agrees here (all ranks left the join), so a stop cannot deadlock a collective.
            stopping = runtime.should_stop()
            if stopping or (args.max_steps and step >= args.max_steps):
                with guard:
                    if stopping:
                        guard.handled()  # this path saves: the guard stands down
                    save()
                    ckpt.wait()
                if ctx.is_chief:
                    print(f"stopping at epoch {epoch} step {step} ({sampler.position}/{sampler.n} samples); "
                          "checkpoint saved", flush=True)
                if args.max_steps and step >= args.max_steps and not runtime.should_stop(sync=False):
                    acc = evaluate(ddp, val_items, args, ctx, channels_last, amp, loss_fn)  # done: the model is final
                    runtime.report(step, val_accuracy=acc)
                    break
                rt_metrics.reporter().close()
                runtime.exit_for_resume()
            acc = evaluate(ddp, val_items, args, ctx, channels_last, amp, loss_fn)
            if ctx.is_chief:
                print(f"epoch {epoch}: loss {'-' if loss is None else f'{loss.item():.4f}'} val_accuracy {acc:.4f} "
                      f"({seen * ctx.world_size / max(1e-9, time.perf_counter() - began):.1f} images/s)", flush=True)
            runtime.report(step, val_accuracy=acc)
            with guard:
                epoch += 1
                sampler.set_epoch(epoch)
            save()
        ckpt.wait()
        if acc is None:  # resumed from the final checkpoint: no epoch ran, the model is already done
            acc = evaluate(ddp, val_items, args, ctx, channels_last, amp, loss_fn)
            runtime.report(step, val_accuracy=acc)
        if ctx.is_chief:
            out = Path(args.output) if args.output else (ctx.job_dir / "model" if ctx.job_dir else Path("model"))
            write_artifact(model, classes, args, acc, out, crop="center" if version_dir is not None else "squash")
            if args.register:
                register(args.register, out)
        guard.close()
        _finish(ctx)
        return 0
    finally:
        guard.settle()  # a save the guard began ends before the process does


def _finish(ctx) -> None:
    import torch.distributed as dist

    from deeppod.runtime import metrics

    metrics.reporter().close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def evaluate(ddp, val_items, args, ctx, channels_last, amp, loss_fn) -> float:
    """Validation accuracy over the whole validation set (each rank a slice, summed)."""
    import torch
    import torch.distributed as dist

    from deeppod.runtime.data import stop_safe_loader

    if not val_items:
        return float("nan")
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
    correct = torch.zeros(2, device=ctx.device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            if x.dtype == torch.uint8:
                x = normalize(x, MEAN, STD)
            if channels_last:
                x = x.to(memory_format=torch.channels_last)
            with torch.autocast(ctx.device.type, enabled=amp):
                pred = model(x).argmax(1)
            correct[0] += (pred == y).sum()
            correct[1] += len(y)
    if dist.is_initialized():
        dist.all_reduce(correct)
    return (correct[0] / correct[1].clamp(min=1)).item()


def register(name: str, out: Path) -> None:
    """Ask the platform to register the artifact (the job's own token authorises it)."""
    from deeppod.runtime.registry import register_model

    try:
        v = register_model(name, out)
    except RuntimeError as exc:  # the model is still on disk: register it by hand later
        print(f"could not register the model as {name!r}: {exc}", flush=True)
        return
    print(f"registered as {name}@{v['version']}", flush=True)


def write_artifact(model, classes, args, val_accuracy: float, out: Path, crop: str = "squash") -> None:
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
        "metrics": {"val_accuracy": val_accuracy},
        "hyperparameters": {k: v for k, v in vars(args).items() if k not in ("step_delay",)},
        "job_id": os.environ.get(ENV_JOB_ID),
        "command": sys.argv,
        "dataset": _dataset_ref(args),
    }, indent=1))
    print(f"model artifact written to {out} (val_accuracy {val_accuracy:.4f})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
