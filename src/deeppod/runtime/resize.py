"""In-place resize: change a running job's number of workers without a restart.

Today's path (stop, checkpoint, start again) reloads the model, rebuilds the process group
from nothing and warms the data loader up again. With a :class:`Resizer` the workers that
stay keep their processes, model and optimizer in memory::

    ctx = runtime.init()
    resizer = runtime.Resizer(model, optimizer, sampler, state={"step": 0})
    ddp = DDP(model)
    while ...:
        for batch in loader:
            ...                                   # one training step with ddp
            sampler.advance(local_batch)
            event = resizer.check()               # every worker, at every step boundary
            if event == "resize":                 # agreed by all: leave the step loop (and
                event = resizer.resize()          # DDP's join), then switch; leavers exit here
            if event == "stop":                   # SIGTERM: preemption, cancel, fallback
                ckpt.save(...); runtime.exit_for_resume()
            if event == "resized":                # a new group of resizer.world_size workers
                ddp = DDP(model, init_sync=False) # re-wrap (the weights are rank 0's already),
                break                             # and deal the epoch's rest again

:meth:`check` must run on every worker at the same step (it is a collective); near the end
of an epoch, where workers may have one step more or less, call it only on the steps all
of them take (the built-in trainer does).

How a resize goes. On a grow the control plane first starts the new workers with
``DEEPPOD_JOINING=1``; they build their model, say they are ready, and wait while the others
go on training. Then it writes ``DEEPPOD_WORLD_FILE`` (generation, new size, rendezvous
address and port). At the next step boundary every worker agrees on the newest
generation in one small all-reduce (the same one that agrees on a stop), tears its process
group down and forms the new one. Ranks at or above the new size leave (exit 0); joiners
receive the model, optimizer, sampler and ``state`` from rank 0 (``_broadcast``: through
shared memory when every worker is on rank 0's host and uses gloo, else by broadcast). The sampler
keeps its position, so every sample of the epoch is still seen once. Rank 0 then writes
``WORLD_ACK`` after the first step at the new size, which the control plane reads.

If the new group cannot be formed (a worker died during the switch), :meth:`check` answers
"stop": rank 0 still holds the model and saves it, and the job restarts from that
checkpoint at the new size, as before.

A worker need not finish the step under way: within :meth:`interruptible` its model's
layers and its parameters' gradients look for a new world as the step runs and give the step
up (:class:`StepAbandoned`); the loop drops it and calls :meth:`check`. In a job of several
workers (gloo) the one that gives up first closes the old group as it switches, which ends
its peers' collectives of that step with an error; each peer sees the new world and gives the
step up too. No worker applies a step another gave up: a worker gives up before a block's
forward pass or as a gradient comes in, before that gradient's bucket can be all-reduced, so no
peer can complete the step's all-reduces.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
import traceback
import weakref
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from deeppod.atomic import atomic_json
from deeppod.contract import (
    ENV_JOINING,
    ENV_RESIZE_TIMEOUT,
    ENV_WORLD_FILE,
    ENV_WORLD_GENERATION,
    JOINER_READY,
    RESIZABLE_MARK,
    RESTART_MARK,
    WORLD_ACK,
)
from deeppod.errors import StepAbandoned
from deeppod.runtime import stop
from deeppod.runtime.context import JobContext, before_groups, job_context, wait_for_store

log = logging.getLogger(__name__)

RESIZE, RESIZED, STOP = "resize", "resized", "stop"
SHM = "/dev/shm"  # the job's own in its sandbox, shared by its workers on this host
POLL_S = 0.02  # how often a step looks for a new world (a stat of the world file)
PEER_WORLD_S = 5.0  # a peer's step failed: how long to wait for the world it switched to


def _blocks(model, want: int = 8) -> list:
    """The model's modules at the shallowest depth that has ``want`` of them (or its leaves)."""
    level = [model]
    while len(level) < want:
        deeper = [c for m in level for c in (list(m.children()) or [m])]
        if len(deeper) == len(level):
            break
        level = deeper
    return level


def read_world(path: str | os.PathLike | None) -> dict | None:
    """The control plane's last word on the world, or None (no file, or half-written)."""
    if not path:
        return None
    try:
        with open(path) as f:
            world = json.load(f)
    except (OSError, ValueError):
        return None
    return world if isinstance(world, dict) and isinstance(world.get("generation"), int) else None


def _let_go(exc: BaseException) -> None:
    """Free the given-up step's frames (DDP's forward holds the old group) so that group can close."""
    traceback.clear_frames(exc.__traceback__)


def _leave() -> None:
    """Exit 0 at once, without the interpreter's teardown: the old group's C++ threads can still
    be winding down, and a teardown around them aborts the process (SIGABRT, "terminate called
    without an active exception", about 1 leaver in 4; ``stop.exit_process``)."""
    from deeppod.runtime.stop import exit_process

    exit_process(0)


class Resizer:
    """Keeps a job's workers in step with the size the control plane gives it (module doc)."""

    def __init__(self, model=None, optimizer=None, sampler=None, state: dict | None = None, *,
                 ctx: JobContext | None = None, backend: str | None = None, timeout_seconds: float | None = None):
        self.ctx = ctx or job_context()
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.state = {} if state is None else state
        self.world_file = os.environ.get(ENV_WORLD_FILE)
        self.generation = int(os.environ.get(ENV_WORLD_GENERATION, 0))
        self.timeout = float(timeout_seconds or os.environ.get(ENV_RESIZE_TIMEOUT, 120))
        self._backend = backend
        self._mtime = -1.0
        self._seen = self._agreed = self.generation
        self._ack: dict | None = None  # written after the first step at a new size
        self._settled = True  # False until the first step at a new size: never given up (every worker agrees)
        self.last_switch_seconds: float | None = None
        self.resizes = 0
        self._hooked: bool | None = False  # None: a sharded model, never hooked
        self._armed = False
        self._gave_up = False  # the step under way was given up: the old group is not to be used again
        self._next_poll = 0.0
        if os.environ.get(ENV_JOINING) == "1":
            self._join()
        if self.ctx.rank == 0 and self.ctx.checkpoint_dir:
            from deeppod.runtime.sharding import is_sharded

            folder = Path(self.ctx.checkpoint_dir)
            folder.mkdir(parents=True, exist_ok=True)
            if model is not None and is_sharded(model):  # each worker holds 1/N: a new N reshards from a checkpoint
                (folder / RESIZABLE_MARK).unlink(missing_ok=True)
                (folder / RESTART_MARK).write_text("its model is sharded: a new size loads the sharded checkpoint")
            else:
                (folder / RESIZABLE_MARK).write_text("1")  # the control plane may now resize in place

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def rank(self) -> int:
        return self.ctx.rank

    # -- at every step boundary ------------------------------------------------------
    def check(self) -> str | None:
        """None (go on), "stop" (checkpoint and exit for resume) or "resize" (every worker
        agreed that a new world is there: call :meth:`resize`). On every worker, every step."""
        self.stepped()
        local_stop = stop._requested.is_set()
        seen = self._look()
        import torch.distributed as dist

        if self._gave_up:  # every worker gives the step up (or is in a collective the switch ends)
            self._agreed = seen
            return RESIZE
        if dist.is_available() and dist.is_initialized():
            import torch

            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            flags = torch.tensor([1 if local_stop else 0, seen], device=device, dtype=torch.int64)
            try:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            except Exception as exc:  # noqa: BLE001 - a peer died between steps
                self._abandon(f"a worker left the group ({exc})")
                return STOP
            any_stop, seen = bool(flags[0].item()), int(flags[1].item())
        else:
            any_stop = local_stop
        if any_stop:
            if not local_stop:
                stop.request_stop("another worker was asked to stop")
            return STOP
        if seen > self.generation:
            self._agreed = seen
            return RESIZE
        return None

    @contextlib.contextmanager
    def interruptible(self, together: bool = True):
        """Around a step's forward and backward pass: raise :class:`StepAbandoned` as soon as a new
        world is there. The caller drops the step (no update; its samples are dealt again at the
        new size), lets go of its DDP wrapper and calls :meth:`check`, which answers "resize".
        Gloo only, on a step every worker takes (``together``; not an uneven tail under
        ``join()``), never a size's first step; NCCL's workers finish their step."""
        if self.model is None or not self.world_file or not (self.ctx.world_size == 1 or together and self._gloo()) \
                or not self._hook():
            yield
            return
        self._armed = True
        try:
            yield
        except StepAbandoned as exc:
            self._gave_up = True
            _let_go(exc)
            raise
        except RuntimeError as exc:  # gloo: "connection closed by peer" (a peer gave the step up)
            if self.ctx.world_size == 1 or not self._settled or not self._new_world_soon():
                raise
            self._gave_up = True
            _let_go(exc)
            raise StepAbandoned(f"a peer gave the step up for world generation {self._seen}") from exc
        finally:
            self._armed = False

    def _gloo(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"

    def _new_world_soon(self) -> bool:
        """A new world is there, or comes within a few seconds (the peer that gave up saw it)."""
        deadline = time.monotonic() + PEER_WORLD_S
        while self._look() <= self.generation:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _hook(self) -> bool:
        """A look before each of about 8 blocks of the model in the forward pass, and as each
        block's backward pass begins and ends (the gradients of its last and first parameters):
        a step is given up within about an eighth of it, for a score of Python calls a step (not
        hundreds: one per layer and parameter, each taking the GIL in a GPU's backward thread).
        False for a sharded model: it changes size through its checkpoint, not in place."""
        if self._hooked is None or self._hooked:
            return bool(self._hooked)
        from deeppod.runtime.sharding import is_sharded

        if is_sharded(self.model):
            self._hooked = None
            return False
        self._hooked = True
        for block in _blocks(self.model):
            block.register_forward_pre_hook(self._on_forward)
            params = [p for p in block.parameters() if p.requires_grad]
            # the last one's gradient comes first in the block's backward pass, the first one's last
            for p in {id(p): p for p in params[-1:] + params[:1]}.values():
                p.register_hook(self._on_grad)
        return True

    def _on_forward(self, module, args) -> None:
        self._poll()

    def _on_grad(self, grad) -> None:
        self._poll()

    def _poll(self) -> None:
        if not self._armed or not self._settled:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_S
        if self._look() > self.generation:
            self._armed = False  # once: the rest of the pass runs no more checks
            raise StepAbandoned(f"world generation {self._seen} is there")

    def resize(self) -> str:
        """Switch to the agreed world: "resized" (re-wrap the model, rebuild the loader) or
        "stop" (the new group could not be formed: checkpoint and exit for resume). A worker
        whose rank is past the new size exits here with code 0, at once (no atexit handlers)."""
        if self._agreed <= self.generation:
            self._gave_up = False
            return RESIZED
        return self._switch(self._agreed)

    def _look(self) -> int:
        """The newest generation this worker has seen (a stat per step; a read when it changed)."""
        if not self.world_file:
            return self._seen
        try:
            mtime = os.stat(self.world_file).st_mtime
        except OSError:
            return self._seen
        if mtime != self._mtime:
            world = read_world(self.world_file)
            if world is not None:
                self._mtime = mtime
                self._seen = max(self._seen, world["generation"])
        return self._seen

    # -- the switch -------------------------------------------------------------------
    def _switch(self, generation: int) -> str:
        import torch.distributed as dist

        began, began_at = time.monotonic(), time.time()
        world = self._world(generation)
        gave_up, self._gave_up = self._gave_up, False
        old = self.ctx.world_size
        size, rank = int(world["world_size"]), self.ctx.rank
        if dist.is_available() and dist.is_initialized():
            backend = self._backend or dist.get_backend()
            held = weakref.ref(dist.group.WORLD)
            dist.destroy_process_group()
            if gave_up and old > 1 and held() is not None:
                # The group's connections close when its last holder goes: that is what ends a
                # peer's collective of the given-up step. Held in a cycle, a collection frees it
                # (0.2 s with a ResNet-50 in memory: only then).
                gc.collect()
                if held() is not None:  # held elsewhere: a restart is what releases the peers (at exit)
                    self._abandon("the old process group is still held after the step was given up")
                    return STOP
        else:
            backend = self._backend or ("nccl" if self.ctx.backend == "nccl" else "gloo")
        if rank >= size:
            log.info("rank %s leaves: the job shrinks from %s to %s workers", rank, old, size)
            _leave()
        self.generation = generation
        os.environ.update({"WORLD_SIZE": str(size), "MASTER_ADDR": str(world["master_addr"]),
                           "MASTER_PORT": str(world["master_port"])})
        self.ctx = replace(self.ctx, world_size=size)
        before_groups()
        try:
            if size > 1:
                if rank != 0:
                    wait_for_store(str(world["master_addr"]), int(world["master_port"]), self.timeout)
                dist.init_process_group(backend, init_method=f"tcp://{world['master_addr']}:{world['master_port']}",
                                        rank=rank, world_size=size, timeout=timedelta(seconds=self.timeout))
            grouped = time.monotonic()
            if size > old:
                self._sync(joined=False)
        except Exception as exc:  # noqa: BLE001 - a peer died or never came: fall back to a restart
            self._abandon(f"in-place resize to {size} workers failed ({exc})")
            return STOP
        if self.sampler is not None:
            self.sampler.rank, self.sampler.world_size = rank, size
        self.resizes += 1
        self.last_switch_seconds = time.monotonic() - began
        # with its phases: where the time from the decision to the first step goes (benchmarks/resize.py)
        self._settled = False
        self._ack = {"generation": generation, "world_size": size, "from": old,
                     "switch_seconds": round(self.last_switch_seconds, 3), "decided_at": world.get("decided_at"),
                     "began_at": began_at, "group_seconds": round(grouped - began, 4),
                     "handover_seconds": round(time.monotonic() - grouped, 4)}
        log.info("resized in place from %s to %s workers in %.2f s", old, size, self.last_switch_seconds)
        return RESIZED

    def _join(self) -> None:
        """A new worker of a running job: say it is ready, meet the others (who switch when the
        control plane sees every joiner ready), and receive what rank 0 holds."""
        import torch.distributed as dist

        self._settled = False  # the workers that stayed do not give their first step at this size up either
        if self.ctx.checkpoint_dir:
            Path(self.ctx.checkpoint_dir, JOINER_READY.format(rank=self.ctx.rank)).write_text(str(time.time()))
        if self.ctx.world_size > 1 and not dist.is_initialized():
            before_groups()
            backend = self._backend or self.ctx.backend or "gloo"
            if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:  # rank 0 listens once it switches
                wait_for_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.timeout)
            dist.init_process_group(backend, timeout=timedelta(seconds=self.timeout))  # env:// rendezvous
        self._sync(joined=True)

    def _abandon(self, why: str) -> None:
        """No usable group: leave it and ask for a stop; rank 0 still holds the model and
        saves it (no collective is needed for that), then the job restarts from it."""
        import torch.distributed as dist

        log.warning("%s: stopping for a restart from a checkpoint", why)
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - it is broken already
                pass
        stop.request_stop(why)

    def _world(self, generation: int) -> dict:
        """The world of ``generation``: a peer may have seen the file a moment before us."""
        deadline = time.monotonic() + 10.0
        while True:
            world = read_world(self.world_file)
            if world is not None and world["generation"] >= generation:
                return world
            if time.monotonic() > deadline:
                raise RuntimeError(f"the world file {self.world_file} never reached generation {generation}")
            time.sleep(0.01)

    def _sync(self, joined: bool) -> None:
        """Rank 0's model, optimizer, sampler and ``state`` to the workers that ``joined``: the
        tensors through shared memory when all are on rank 0's host and use gloo, else by one
        broadcast per dtype; the rest (small) pickled. Workers that stayed hold the same
        already (data parallel: the same steps on the same weights) and only take part."""
        import torch
        import torch.distributed as dist

        from deeppod.runtime import _broadcast

        if not (dist.is_available() and dist.is_initialized()):
            return
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        model_tensors = []
        if self.model is not None:
            from deeppod.runtime.checkpoint import _unwrap

            model_tensors = list(_unwrap(self.model).state_dict().values())
        chief = self.ctx.rank == 0
        tensors: list = []
        skeleton = _broadcast.split({"optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                                     "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                                     "state": self.state}, tensors) if chief else None
        # gloo, every worker on rank 0's host: through shared memory (NCCL: GPU to GPU)
        local = device.type == "cpu" and _broadcast.on_one_host()
        shared = _broadcast.write_shared(model_tensors + tensors, SHM) if chief and local else None
        box = [{"skeleton": skeleton, "shared": shared}]
        dist.broadcast_object_list(box, 0)
        skeleton, shared = box[0]["skeleton"], box[0]["shared"]
        if not chief:
            tensors = _broadcast.receive_like(skeleton, device)
        if shared is None or not _broadcast.read_by_all(shared, model_tensors + tensors, device,
                                                        read=joined, owner=chief):
            _broadcast.broadcast_flat(model_tensors + tensors, device)
        if not joined:
            return
        got = _broadcast.fill(skeleton, tensors)
        if self.optimizer is not None and got["optimizer"] is not None:
            self.optimizer.load_state_dict(got["optimizer"])
        if self.sampler is not None and got["sampler"] is not None:
            self.sampler.load_state_dict(got["sampler"])
        self.state.clear()
        self.state.update(got["state"])

    def stepped(self) -> None:
        """A step is done (no collective): after the first one at a new size, rank 0 tells the
        control plane, with the time. :meth:`check` calls it; a loop that does not call
        ``check`` on every step (the end of an epoch) calls it itself."""
        self._settled = True
        if self._ack is None:
            return
        ack, self._ack = self._ack, None
        if self.ctx.rank != 0 or not self.ctx.checkpoint_dir:
            return
        try:
            atomic_json(Path(self.ctx.checkpoint_dir) / WORLD_ACK, {**ack, "at": time.time()}, mode=0o644)
        except OSError as exc:
            log.warning("could not acknowledge the resize: %s", exc)
