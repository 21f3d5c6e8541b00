"""Live training metrics: ``report(step, loss=..., accuracy=...)`` and histograms.

Never slows the step: values go on a queue (tensors as they are; ``.item()`` happens in the
background thread) and a thread sends them in batches to the control plane with the job's
token. If the server is briefly down it keeps them (up to ``max_buffer``) and retries with
backoff; at exit it flushes what it can. Rank 0 also writes TensorBoard event files to the
job folder's ``tensorboard/``.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import threading
import time
import urllib.error

from deeppod.contract import (
    ENV_CA_CERT,
    ENV_METRICS_FLUSH,
    ENV_TOKEN,
    ENV_TRIAL,
    ENV_TRIAL_HOST,
    ENV_TRIAL_JUDGED,
    JUDGED_EVERY_STEP,
    METRICS_SPOOL,
    judged_between,
    open_first,
    server_urls,
)
from deeppod.job_folder import JobFolder
from deeppod.runtime import stop
from deeppod.runtime.context import job_context

log = logging.getLogger(__name__)
MAX_BATCH_BYTES = 512 * 1024


def _value(v) -> float:
    item = getattr(v, "item", None)
    return float(item() if item is not None else v)


def histogram(values, bins: int = 30) -> dict:
    """Compact binned data of a tensor: min, max and counts over equal-width bins."""
    import torch

    t = values.detach().float().flatten()
    t = t[torch.isfinite(t)]
    if t.numel() == 0:
        return {"min": 0.0, "max": 0.0, "counts": [0] * bins}
    lo, hi = float(t.min()), float(t.max())
    if hi == lo:
        hi = lo + 1e-12
    counts = torch.histc(t.cpu(), bins=bins, min=lo, max=hi).to(torch.int64).tolist()
    return {"min": lo, "max": hi, "counts": counts}


EXIT_WAIT_S = 60.0  # at exit, how long unsent points wait for the control plane to answer
STOP_EXIT_MARGIN_S = 4.0  # on a stop's way out, the grace time kept for spooling and exiting
SEND_TIMEOUT_S = 10.0


def _flush_seconds() -> float:
    try:
        return min(60.0, max(0.05, float(os.environ.get(ENV_METRICS_FLUSH, "1"))))
    except ValueError:
        return 1.0


class Reporter:
    def __init__(self, api_url: str | None = None, token: str | None = None, job_id: int | None = None,
                 tb_dir: str | None = None, flush_seconds: float | None = None, max_buffer: int = 100_000,
                 enabled: bool | None = None):
        ctx = job_context()
        self.api_url = api_url if api_url is not None else ctx.api_url
        self.token = token if token is not None else os.environ.get(ENV_TOKEN)
        self.job_id = job_id if job_id is not None else ctx.job_id
        self.enabled = ctx.rank == 0 if enabled is None else enabled
        trial = os.environ.get(ENV_TRIAL, "")
        self.trial: int | None = int(trial) if trial.isdigit() else None  # the search trial reports are for
        self._send_lock = threading.Lock()  # flush() sends from the caller's thread too
        self.pruning: frozenset[int] = frozenset()  # trials of this process a pruner stopped (the server says)
        self.pausing: frozenset[int] = frozenset()  # trials of this process paused at a rung (asha-promote)
        # a report at a step the pruner decides on is sent at once (not at the next flush), and
        # the server's answer waits for the decision: a short trial hears it an epoch later, not ten
        self.judged = os.environ.get(ENV_TRIAL_JUDGED, "")
        self._judged_upto: tuple[int | None, int] = (None, -1)  # (trial, step) last sent at once
        # judged reports numbered as made, and the newest whose send the server has answered:
        # await_judgement() waits for the one made last (its answer says whether it was pruned)
        self._judged_made = self._judged_answered = self._judged_awaited = 0
        self._answers = threading.Condition()
        # a job that runs one trial stops when its trial is pruned (one that runs trial after
        # trial stops that trial only: runtime.trials())
        self._one_trial = os.environ.get(ENV_TRIAL_HOST) != "1"
        self._wake = threading.Event()
        self.flush_seconds = flush_seconds if flush_seconds is not None else _flush_seconds()
        self.max_buffer = max_buffer
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[dict] = []
        self._stop = threading.Event()
        self.sent = self.dropped = self.failed_sends = 0  # failed_sends: tries the server did not answer
        self._tb = None
        if self.enabled and tb_dir is None and ctx.job_dir is not None:
            tb_dir = str(JobFolder(ctx.job_dir).tensorboard)
        if self.enabled and tb_dir:
            from deeppod.runtime.tensorboard import EventWriter

            self._tb = EventWriter(tb_dir)
        self._thread = threading.Thread(target=self._run, name="deeppod-metrics", daemon=True)
        if self.enabled:
            self._thread.start()
            atexit.register(self.close)

    # called from the training loop: cheap
    def report(self, step: int, **metrics) -> None:
        if self.enabled:
            now, judged = False, 0
            if self.judged and self.trial is not None:
                trial, upto = self._judged_upto
                if judged_between(self.judged, upto if trial == self.trial else -1, step):
                    self._judged_upto, now = (self.trial, step), True
                    if self.judged != JUDGED_EVERY_STEP:  # a rung, awaited; not every step (the median rule's)
                        with self._answers:
                            self._judged_made += 1
                            judged = self._judged_made
            self._q.put(("m", step, time.time(), metrics, self.trial, judged))
            if now:
                self._wake.set()

    def await_judgement(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the server's answer to the last report made at a rung of
        the trial's pruner (``pruning`` then says whether it stopped the trial there), so the
        trial learns it before its next epoch, not after. Not for a pruner that decides at every
        step (the median rule): a round trip a step would slow every trial. Once per report: a
        server that does not answer (failing over) costs a trial one wait, not one every step. True
        when the answer came, or none was awaited."""
        with self._answers:
            made = self._judged_made
            if made > self._judged_answered and made > self._judged_awaited:
                self._judged_awaited = made
                self._answers.wait_for(lambda: self._judged_answered >= made, timeout)
            return self._judged_answered >= made

    def _answered(self, batch: list[dict]) -> None:
        top = max((p.get("_judged", 0) for p in batch), default=0)
        if top:
            with self._answers:
                self._judged_answered = max(self._judged_answered, top)
                self._answers.notify_all()

    def histograms(self, step: int, tensors: dict) -> None:
        if self.enabled:
            self._q.put(("h", step, time.time(), {k: histogram(v) for k, v in tensors.items()}, self.trial, 0))

    # the background side
    def _drain(self) -> None:
        while True:
            try:
                kind, step, at, payload, trial, judged = self._q.get_nowait()
            except queue.Empty:
                return
            tag = {} if trial is None else {"trial": trial}
            if kind == "m":
                values = {}
                for k, v in payload.items():
                    try:
                        values[k] = _value(v)
                    except (TypeError, ValueError):
                        continue
                if self._tb is not None:
                    self._tb.scalars(step, values, at)
                self._pending.append({"step": step, "at": at, "metrics": {
                    k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}, **tag,
                    **({"_judged": judged} if judged else {})})
            else:
                self._pending.append({"step": step, "at": at, "histograms": payload, **tag})
        # bounded: under a long outage keep the newest
        if len(self._pending) > self.max_buffer:
            self.dropped += len(self._pending) - self.max_buffer
            del self._pending[: len(self._pending) - self.max_buffer]

    def _send(self, timeout: float = SEND_TIMEOUT_S) -> bool:
        # two senders would send a batch twice and drop the next one unsent
        if not self._send_lock.acquire(timeout=timeout):
            return False
        try:
            return self._send_batch(timeout)
        finally:
            self._send_lock.release()

    def _send_batch(self, timeout: float) -> bool:
        if not (self.api_url and self.job_id is not None):
            self._pending.clear()  # not under DeepPod: TensorBoard files only
            return True
        if not self._pending:
            return True
        batch, size = [], 0
        for p in self._pending[:1000]:  # under the server's 1 MiB body limit, whatever the points hold
            size += len(json.dumps(p))
            if batch and size > MAX_BATCH_BYTES:
                break
            batch.append(p)
        try:  # api_url may name several servers (a failover control plane): the first that answers
            points = [_wire(p) for p in batch]
            answer = open_first(server_urls(self.api_url), f"/v1/jobs/{self.job_id}/metrics", method="POST",
                       data=json.dumps({"points": points}).encode(), timeout=timeout,
                       cafile=os.environ.get(ENV_CA_CERT),
                       headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                log.warning("metrics refused by the server (%s); dropping %d points", exc.code, len(batch))
                del self._pending[:len(batch)]
                self.dropped += len(batch)
                self._answered(batch)  # refused: no decision will come for them
                return True
            return False
        except (OSError, urllib.error.URLError):
            return False
        del self._pending[:len(batch)]
        self.sent += len(batch)
        try:
            said = json.loads(answer or b"{}")
            self.pruning = frozenset(said.get("pruning") or ())
            self.pausing = frozenset(said.get("pausing") or ())
        except (ValueError, AttributeError, TypeError):
            pass  # an older server's answer: the trial asks for itself (runtime.trial)
        if self._one_trial and self.trial is not None and self.trial in self.pruning:
            # the server asked for the job's stop before it answered: its SIGTERM is on its way
            stop.request_stop(f"its search's pruner stopped trial {self.trial}")
        self._answered(batch)
        return True

    def _run(self) -> None:
        backoff = self.flush_seconds
        while not self._stop.is_set():
            self._wake.wait(backoff)  # a report the pruner judges (or close()) sends now
            self._wake.clear()
            self._drain()
            if self._tb is not None:
                self._tb.flush()
            ok = self._send()
            while ok and len(self._pending) >= 1000:
                ok = self._send()
            self.failed_sends += not ok
            backoff = self.flush_seconds if ok else min(30.0, backoff * 2)

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything queued so far (blocks up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        self._drain()
        while self._pending and (left := deadline - time.monotonic()) > 0:
            if not self._send(min(SEND_TIMEOUT_S, max(0.1, left))):
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if self._tb is not None:
            self._tb.flush()
        return not self._pending

    def close(self, timeout: float | None = None) -> None:
        """Send what is left, waiting up to ``timeout`` (default :data:`EXIT_WAIT_S`) for a
        control plane that does not answer: one restarting or failing over takes seconds, and a
        process that left after 10 s lost a short trial's every report (a search then judged
        without it)."""
        if not self.enabled or self._stop.is_set():
            return
        timeout = EXIT_WAIT_S if timeout is None else timeout
        left = stop.grace_left()
        if left is not None:  # a stop: the SIGKILL comes at the grace's end; what is unsent is spooled
            timeout = min(timeout, max(0.0, left - STOP_EXIT_MARGIN_S))
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=min(2.0, timeout))
        first = min(timeout, 2.0)
        if not self.flush(first) and timeout > first:
            log.warning("the control plane does not answer: waiting up to %.0f s for it to take %d metric points "
                        "before this process exits", timeout - first, len(self._pending))
            self.flush(timeout - first)
        if self._pending:
            self._spool()
        if self._tb is not None:
            self._tb.close()

    def _spool(self) -> None:
        """What is still unsent goes to the checkpoint folder (``contract.METRICS_SPOOL``), where
        the server takes it when the run ends: a control plane that is away longer than the wait
        at exit loses nothing."""
        folder = job_context().checkpoint_dir
        if not folder or not (self.api_url and self.job_id is not None):
            log.warning("%d metric points not sent: the control plane did not answer", len(self._pending))
            return
        path = os.path.join(folder, METRICS_SPOOL)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(_wire(p)) + "\n" for p in self._pending)
        except OSError as exc:
            log.warning("%d metric points not sent, and not kept (%s)", len(self._pending), exc)
            return
        log.warning("%d metric points not sent (the control plane did not answer): kept in %s, where the server "
                    "takes them when this run ends", len(self._pending), path)
        self._pending.clear()


def _wire(point: dict) -> dict:
    """A pending point as the server takes it: without the number this process awaits it by."""
    return {k: v for k, v in point.items() if k != "_judged"} if "_judged" in point else point


_default: Reporter | None = None
_lock = threading.Lock()


def reporter() -> Reporter:
    global _default
    with _lock:
        if _default is None:
            _default = Reporter()
        return _default


def report(step: int, **metrics) -> None:
    """Send scalars for ``step`` (rank 0 only; other ranks' calls are free no-ops)."""
    reporter().report(step, **metrics)


def report_histograms(step: int, tensors: dict) -> None:
    """Send binned histograms of tensors (weights, gradients, activations) for ``step``."""
    reporter().histograms(step, tensors)


def model_histograms(model, *, gradients: bool = True) -> dict:
    """Weights and (if present) gradients of every parameter, ready for report_histograms."""
    out = {}
    for name, p in getattr(model, "module", model).named_parameters():
        out[f"weights/{name}"] = p
        if gradients and p.grad is not None:
            out[f"gradients/{name}"] = p.grad
    return out


class ActivationRecorder:
    """Keeps the latest output of chosen modules (forward hooks) for activation histograms:
    ``report_histograms(step, recorder.tensors())``. Costs a reference per module, no copy."""

    def __init__(self, model, names: list[str] | None = None, limit: int = 8):
        model = getattr(model, "module", model)
        modules = dict(model.named_modules())
        if names is None:  # the top-level blocks: where activations tell the most
            names = [n for n, _ in model.named_children()][:limit]
        unknown = [n for n in names if n not in modules]
        if unknown:
            raise ValueError(f"no module named {unknown[0]!r}; choose from {', '.join(list(modules)[:20])}")
        self._latest: dict = {}
        self._handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            if hasattr(output, "detach"):
                self._latest[f"activations/{name}"] = output.detach()
        return hook

    def tensors(self) -> dict:
        return dict(self._latest)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
