"""A search's trials, from inside its job: ``for trial in runtime.trials(): ...``.

Starting a process, importing torch and loading the data cost seconds; a trial of a small
model may take only a few more. With ``deeppod tune create --reuse`` the process a trial
started in runs the search's next trial too (as Ray Tune's ``reuse_actors``): the loop asks
the control plane for trial after trial and ends when the search has none left for it. In a
search that does not reuse processes, in a plain job, or outside DeepPod, it yields one
trial: the job's own parameters (none outside a search). So one script serves all three::

    data = load()                              # once per process
    for trial in runtime.trials():
        model = build(**trial.params)
        for epoch in range(epochs):
            ...
            runtime.report(epoch, val_acc=acc)  # counted for this trial
            if trial.should_stop():             # its pruner stopped it, or the job is stopping
                break

A trial a pruner stops ends when the loop asks for the next; a job that is stopping
(preemption, ``deeppod tune stop``) leaves the loop with exit code 75, "resume me": the
trial it was running runs again when the job does.

With ``--pruner asha-promote`` a trial may instead be paused at a rung and handed back later,
in the same process, if enough worse trials reach that rung. The script keeps what it needs
to go on (``trial.keep``) and takes it back (``trial.kept``); it is kept only while the trial
is paused::

    for trial in runtime.trials():
        run = trial.kept or Run(**trial.params)   # the model, optimizer and epoch it reached
        for epoch in range(run.epoch, epochs):
            ...
            if trial.should_stop():
                break
        trial.keep(run)
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field

from deeppod.contract import (
    ENV_CA_CERT,
    ENV_TOKEN,
    ENV_TRIAL,
    ENV_TRIAL_HOST,
    ENV_TRIAL_PARAMS,
    JUDGEMENT_WAIT_S,
    open_first,
    server_urls,
)
from deeppod.runtime import metrics, stop
from deeppod.runtime.context import job_context

# how often should_stop() asks the control plane whether a pruner stopped the trial, besides
# what the answers to its metrics say (a trial that reports hears it within a send)
ASK_EVERY_S = 1.0
WAIT_S = 0.05  # between asks for the next trial while the controller has none for this process yet
PAUSED = ("pausing", "paused")


class _Host:
    """The control plane's side of a process that runs trial after trial (its job's token)."""

    def __init__(self, api_url: str, job_id: int, token: str, rank: int):
        self.urls, self.job_id, self.token, self.rank = server_urls(api_url), job_id, token, rank

    def _call(self, path: str, body: dict | None = None) -> dict:
        raw = open_first(self.urls, f"/v1/jobs/{self.job_id}/trial{path}", method="POST" if body is not None else "GET",
                         data=json.dumps(body).encode() if body is not None else None, timeout=30,
                         cafile=os.environ.get(ENV_CA_CERT),
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        return json.loads(raw)

    def next(self, done: int | None, turn: int = 0, kept: dict | None = None) -> dict | None:
        """The next trial's {"number", "params", "state", "turn"}, or None when there is none
        for this process. Rank 0 says which trial ended (``done``, handed out for the ``turn``-th
        time); the other ranks wait for another trial, or the same one's next turn. ``kept``: the
        paused trials' state this process keeps; those the server says will not go on are dropped."""
        after = (done, turn)
        while True:
            try:
                # the turn too: said again at every ask, it must not end the same trial's next turn
                answer = self._call("", {"done": done if self.rank == 0 else None, "kept": sorted(kept or ()),
                                         **({"turn": turn} if done is not None and self.rank == 0 else {})})
            except (OSError, urllib.error.URLError) as exc:  # a failover or a restart: ask again
                if isinstance(exc, urllib.error.HTTPError) and exc.code < 500 and exc.code not in (408, 429):
                    raise
                time.sleep(1.0)
                continue
            for number in answer.get("forget") or ():
                (kept or {}).pop(number, None)
            if answer.get("finished"):
                return None
            if answer.get("number") is not None and (answer["number"], answer.get("turn") or 0) != after:
                return answer
            if stop.should_stop(sync=False):
                stop.exit_for_resume()
            time.sleep(WAIT_S)

    def state(self, number: int) -> str | None:
        try:
            return self._call(f"/{number}").get("state")
        except (OSError, urllib.error.URLError):
            return None  # unknown for now: it goes on, and asks again


@dataclass
class Trial:
    """One trial: its number in the search (None outside one) and its parameters."""

    number: int | None
    params: dict = field(default_factory=dict)
    _host: _Host | None = field(default=None, repr=False)
    _pruned: bool = field(default=False, repr=False)
    _paused: bool = field(default=False, repr=False)
    _asked_at: float = field(default_factory=time.monotonic, repr=False)
    kept: object = field(default=None, repr=False)  # what keep() was given when it was paused, when it goes on
    _keep: object = field(default=None, repr=False)

    def keep(self, state: object) -> None:
        """What this process needs to go on with the trial (its model, optimizer, the epoch it
        reached): kept if the search pauses the trial (asha-promote) and given back as
        ``kept`` when it is promoted; dropped otherwise."""
        self._keep = state

    @property
    def paused(self) -> bool:
        """The search paused it at a rung (should_stop() said so): keep() what it needs."""
        return self._paused

    def should_stop(self) -> bool:
        """True once its pruner stopped it or the job is being stopped (preemption, a stop).
        Every worker of a job gets the same answer in the same step (see runtime.should_stop)."""
        if self._host is not None and not self._pruned:
            # the answer to its last reports says so (at a rung it is waited for: a pruned trial
            # runs no epoch past the rung it was stopped at); asked for when it has not reported lately
            reporter = metrics.reporter()
            reporter.await_judgement(JUDGEMENT_WAIT_S)
            self._pruned = self.number in reporter.pruning
            self._paused = self.number in reporter.pausing
            if not (self._pruned or self._paused) and time.monotonic() - self._asked_at >= ASK_EVERY_S:
                self._asked_at = time.monotonic()
                state = self._host.state(self.number)
                self._pruned, self._paused = state == "pruning", state == "pausing"
            self._pruned = self._pruned or self._paused  # stopped here either way
        return stop.agree(self._pruned or stop.should_stop(sync=False))


def trials() -> Iterator[Trial]:
    """The trials this process runs: one, or trial after trial where the search reuses processes."""
    params = json.loads(os.environ.get(ENV_TRIAL_PARAMS) or "{}")
    number = int(os.environ[ENV_TRIAL]) if os.environ.get(ENV_TRIAL, "").isdigit() else None
    ctx = job_context()
    token = os.environ.get(ENV_TOKEN)
    if os.environ.get(ENV_TRIAL_HOST) != "1" or ctx.job_id is None or not ctx.api_url or not token:
        yield Trial(number, params)
        return
    host = _Host(ctx.api_url, ctx.job_id, token, ctx.rank)
    done, turn, kept = None, 0, {}  # kept: paused trials' state, by number
    while True:
        answer = host.next(done, turn, kept)
        if answer is None:
            return
        number, turn = answer["number"], answer.get("turn") or 0
        if answer.get("state") != "running":  # pruned while its job was away (preempted): nothing to run
            done = number
            continue
        reporter = metrics.reporter()
        reporter.trial = number
        # a promoted trial's pause is over: what an answer said of its last turn no longer holds
        reporter.pruning, reporter.pausing = reporter.pruning - {number}, reporter.pausing - {number}
        trial = Trial(number, dict(answer.get("params") or {}), host, kept=kept.pop(number, None))
        yield trial
        metrics.reporter().flush()  # its last reports reach the server before it is said to have ended
        if stop.should_stop(sync=False):  # the job is stopping: this trial runs again when it does
            stop.exit_for_resume()
        if trial._keep is not None and (trial._paused or (not trial._pruned and host.state(number) in PAUSED)):
            kept[number] = trial._keep  # the other ranks hear of a pause by asking
        done = number
