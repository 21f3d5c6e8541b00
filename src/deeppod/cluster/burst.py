"""Bursting, applied: the autoscaler behind a small interface (Ray's, in executor/ray.py; a
fake here), the cost ledger (what each tenant was charged for burst nodes), and the
controller's memory between rounds. What to ask for is decided by the pure
``scheduler.burst``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deeppod.scheduler.burst import Ask, BurstDecisions, BurstView, burst_round, split
from deeppod.scheduler.burst_types import RESOURCE_PREFIX
from deeppod.scheduler.policy import schedule
from deeppod.scheduler.snapshot import Decisions, Snapshot
from deeppod.store.models import BurstCharge, Node

log = logging.getLogger(__name__)
RESEND_S = 30.0  # the same ask is sent again this often (an autoscaler or head that restarted forgot it)
NOTES_S = 5.0  # what the autoscaler says of types short of nodes is read this often


class Autoscaler(Protocol):
    def request(self, nodes: dict[str, int], kept: set[str]) -> None:
        """Keep this many nodes with each resource (deeppod-burst-TYPE); replaces the last
        request. ``kept``: the burst nodes up that DeepPod still uses or keeps for the next
        job; on the others nothing of DeepPod's may stay (a sampler included), so that the
        autoscaler sees them idle and lets them go."""

    def notes(self) -> dict[str, str]:
        """Per node type of the autoscaler's config (named after the burst type): what it
        reports about adding its nodes (launches pending, failures), where it reports any."""


@dataclass
class FakeAutoscaler:
    """Records what it was asked (tests); ``broken`` types report a failure."""

    asked: list[dict[str, int]] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    broken: dict[str, str] = field(default_factory=dict)

    def request(self, nodes: dict[str, int], kept: set[str]) -> None:
        self.asked.append(dict(nodes))
        self.kept = set(kept)

    def notes(self) -> dict[str, str]:
        return dict(self.broken)


def spent_by_tenant(s: Session) -> dict[str, float]:
    return {t: c for t, c in s.execute(select(BurstCharge.tenant, func.sum(BurstCharge.cost))
                                       .group_by(BurstCharge.tenant))}


def charges(s: Session) -> list[BurstCharge]:
    return list(s.scalars(select(BurstCharge).order_by(BurstCharge.tenant, BurstCharge.node)))


class Bursting:
    """The controller's side of bursting: one ``round`` inside the deciding transaction, one
    ``send`` after it commits (the autoscaler is never called with a transaction open)."""

    def __init__(self, autoscaler: Autoscaler | None):
        """``autoscaler``: None where the executor has none (one machine): no node is added,
        and burst nodes, if any, are still never the own round's. Times are the snapshot's."""
        self.autoscaler = autoscaler
        self.asks: dict[str, Ask] = {}
        self.idle_since: dict[str, float] = {}  # burst node -> since when no job runs there
        self.short_since: dict[str, float] = {}  # type -> since when fewer nodes are up than asked
        self.accrued_at: dict[str, float] = {}  # burst node -> charged up to
        self.last_tenant: dict[str, str] = {}  # burst node -> who used it last (charged while it idles)
        self.wanted_by: dict[str, str] = {}  # type -> the tenant whose job asked for its newest nodes
        self._sent: tuple[dict[str, int], set[str], float] | None = None
        # what the autoscaler said of the types short of nodes, read after a round (never in
        # its transaction: a head that does not answer must not hold the database's writer)
        self.notes: dict[str, str] = {}
        self._noted = -NOTES_S

    @property
    def known_asks(self) -> dict[str, Ask] | None:
        """The last asks, or None where there is no autoscaler (``plans.burst_status``)."""
        return self.asks if self.autoscaler is not None else None

    def active(self, s: Session) -> bool:
        """Whether a round has something to do: a burst node is up, or nodes are asked for."""
        if self.autoscaler is None:
            return False
        return any(a.nodes for a in self.asks.values()) or s.scalar(
            select(Node.id).where(Node.burst.is_not(None), Node.up.is_(True)).limit(1)) is not None

    def schedule(self, s: Session, snap: Snapshot) -> Decisions:
        """The policy's round on the cluster's own nodes and jobs, then (with an autoscaler)
        the burst round on what it left waiting."""
        d = schedule(split(snap)[0])
        if self.autoscaler is not None and (snap.plan.burst or any(n.burst for n in snap.nodes)):
            self.round(s, snap, d)
        return d

    def round(self, s: Session, snap: Snapshot, own: Decisions) -> BurstDecisions:
        """The burst round after the own round's ``own``, whose starts and waits it adds to."""
        _, part = split(snap)
        now = snap.now
        types = {b.name: b for b in snap.plan.burst}
        self._charge(s, part, types, now)
        busy = {w.node for j in part.running for w in j.placement}
        up = [n for n in part.nodes if n.healthy]
        known = {n.name for n in up}
        for memo in (self.idle_since, self.accrued_at, self.last_tenant):  # nodes gone: forgotten
            for name in [k for k in memo if k not in known]:
                del memo[name]
        for n in up:
            if n.name in busy:
                self.idle_since.pop(n.name, None)
            else:
                self.idle_since.setdefault(n.name, now)
        view = BurstView(spent=spent_by_tenant(s), idle_since=dict(self.idle_since),
                         short_since=dict(self.short_since),
                         notes={t: self.notes[t] for t in types if t in self.notes})
        d = burst_round(part, own, view)
        for start in d.starts:
            for w in start.placement:
                self.idle_since.pop(w.node, None)
        self.wanted_by.update(d.wanted_by)
        for name, ask in d.asks.items():
            if ask.nodes > sum(1 for n in up if n.burst == name):
                self.short_since.setdefault(name, now)
            else:
                self.short_since.pop(name, None)
        if {k: a.nodes for k, a in d.asks.items()} != {k: a.nodes for k, a in self.asks.items()}:
            log.info("burst nodes asked for: %s", ", ".join(f"{a.type} {a.nodes} ({a.reason})"
                                                            for a in d.asks.values()) or "none")
        self.asks = d.asks
        own.starts += d.starts
        moved = {x.job_id for x in d.starts} | {w.job_id for w in d.waits}
        own.waits = [w for w in own.waits if w.job_id not in moved] + d.waits
        return d

    def _charge(self, s: Session, part: Snapshot, types: dict, now: float) -> None:
        """Charge every burst node up to ``now`` to the tenant using it (or who used it last,
        or whose job asked for it, while it idles)."""
        users = {w.node: j.tenant for j in part.running for w in j.placement}
        for n in part.nodes:
            if not n.healthy or n.burst not in types:
                continue
            since = self.accrued_at.get(n.name) or self._first_seen(s, n.name) or now
            self.accrued_at[n.name] = now
            tenant = users.get(n.name) or self.last_tenant.get(n.name) or self.wanted_by.get(n.burst)
            if tenant is None or now <= since:
                continue
            self.last_tenant[n.name] = tenant
            charge = s.scalar(select(BurstCharge).where(BurstCharge.node == n.name, BurstCharge.tenant == tenant))
            if charge is None:
                charge = BurstCharge(node=n.name, node_type=n.burst, tenant=tenant, seconds=0.0, cost=0.0,
                                     first_at=_dt(since))
                s.add(charge)
            charge.seconds += now - since
            charge.cost += (now - since) * types[n.burst].cost_per_hour / 3600
            charge.last_at = _dt(now)

    @staticmethod
    def _first_seen(s: Session, node: str) -> float | None:
        """Charged from where an earlier server stopped (a restart, a takeover), else from when the
        node joined; asked once per node, then ``accrued_at`` says."""
        last = s.scalar(select(func.max(BurstCharge.last_at)).where(BurstCharge.node == node))
        return _ts(last) or _ts(s.scalar(select(Node.joined_at).where(Node.name == node)))

    def send(self) -> None:
        """The asks to the autoscaler: when they changed, and every RESEND_S; and, while a type
        is short of nodes, what the autoscaler says of it (every NOTES_S)."""
        if self.autoscaler is None or (not self.asks and self._sent is None):
            return
        now = time.monotonic()
        if not self.short_since:
            self.notes = {}
        elif now - self._noted >= NOTES_S:
            self.notes, self._noted = self.autoscaler.notes(), now
        nodes = {RESOURCE_PREFIX + k: a.nodes for k, a in self.asks.items()}
        kept = {n for a in self.asks.values() for n in a.kept}
        if self._sent is not None and self._sent[:2] == (nodes, kept) and now - self._sent[2] < RESEND_S:
            return
        self.autoscaler.request(nodes, kept)
        self._sent = (nodes, kept, now)


def _ts(when: datetime | None) -> float | None:
    if when is None:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


NO_AUTOSCALER = "no node is added: bursting needs --executor ray and Ray's autoscaler (docs/cluster.md, 'Bursting')"


def plan_warnings(plan: dict, bursting: Bursting) -> list[str]:
    """What an administrator applying ``plan`` (its to_dict) should know that is not an error:
    burst types on a server that cannot add nodes."""
    if plan.get("burst") and bursting.autoscaler is None:
        return [f"the plan's burst types are kept, but {NO_AUTOSCALER}"]
    return []
