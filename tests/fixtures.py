"""A populated store: one node with 4 GPUs, an admin, tenants a and b with a user each."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from deeppod.auth import service as auth
from deeppod.cluster.gpus import LogicalProbe
from deeppod.cluster.inventory import local_node
from deeppod.cluster.service import register_node
from deeppod.job_spec import JobSpec


@dataclass
class World:
    admin: auth.Principal
    alice: auth.Principal  # tenant a
    bob: auth.Principal  # tenant b
    admin_token: str
    alice_token: str
    bob_token: str


def populate(sessions, gpus: int = 4, cpus: int = 8, memory_mb: int = 16384) -> World:
    with sessions.begin() as s:
        register_node(s, local_node(LogicalProbe(gpus), cpus=cpus, memory_mb=memory_mb))
        admin_token = auth.bootstrap(s)
        admin = auth.authenticate(s, admin_token)
        auth.create_tenant(s, admin, "a")
        auth.create_tenant(s, admin, "b")
        _, alice_token = auth.create_user(s, admin, "alice", "a")
        _, bob_token = auth.create_user(s, admin, "bob", "b")
        return World(admin, auth.authenticate(s, alice_token), auth.authenticate(s, bob_token),
                     admin_token, alice_token, bob_token)


def submit_job(sessions, who, workdir, **kw) -> int:
    """Submit a trivial job through the service; returns its id."""
    from deeppod.jobs import service

    args = dict(command=[sys.executable, "-c", "pass"], workdir=str(workdir))
    args.update(kw)
    with sessions.begin() as s:
        return service.submit(s, who, JobSpec(**args), default_grace=30).id


def load_job(sessions, job_id):
    from deeppod.store.models import Job

    with sessions() as s:
        return s.get(Job, job_id)


class Clock:
    """A settable clock for controllers under test."""

    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t
