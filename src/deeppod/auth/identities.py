"""Each tenant's OS identity: the unprivileged user its jobs run as when the server
isolates them. One identity per tenant: a tenant's members share its files and jobs, as
they share its quota; tenants share nothing.

``SystemIdentities`` creates the user with ``useradd`` on first use (a system account with
no home, no login shell and a group of its own) and the store records it; ``FakeIdentities``
hands out numbers without touching the system, for tests of the control plane.
"""

from __future__ import annotations

import logging
import pwd
import subprocess
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from deeppod.errors import ExecutorError
from deeppod.store.models import Tenant

log = logging.getLogger(__name__)
PREFIX = "deeppod-t"  # + the tenant's id: short (Linux names end at 32) and never reused for another tenant
# (a server passes its installation's own prefix: two installations on one host never share a user)


@dataclass(frozen=True)
class Identity:
    user: str
    uid: int
    gid: int


class Identities(Protocol):
    def ensure(self, name: str) -> Identity:
        """The OS user ``name``, created if it does not exist."""


class SystemIdentities:
    def ensure(self, name: str) -> Identity:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                   "--shell", "/usr/sbin/nologin", "--comment", "DeepPod tenant", name]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0 and "already exists" not in done.stderr:
                raise ExecutorError(f"could not create the OS user {name} for a tenant's jobs: "
                                    f"{done.stderr.strip() or done.returncode}") from None
            log.info("created OS user %s for a tenant's jobs", name)
            pw = pwd.getpwnam(name)
        if pw.pw_uid == 0 or pw.pw_gid == 0:
            raise ExecutorError(f"the OS user {name} is privileged (uid {pw.pw_uid}); jobs never run as root")
        return Identity(name, pw.pw_uid, pw.pw_gid)


def remove_users(prefix: str, *, userdel=None) -> list[str]:
    """Remove this installation's tenant users (``prefix``: Isolation.user_prefix), those
    ``SystemIdentities`` made ("DeepPod tenant"), when the installation goes: no later tenant, of
    this installation or another, ever runs as a uid that owned an earlier one's files."""
    removed = []
    for pw in pwd.getpwall():
        if pw.pw_name.startswith(prefix) and pw.pw_gecos == "DeepPod tenant" and pw.pw_uid != 0:
            done = (userdel or _userdel)(pw.pw_name)
            if done:
                removed.append(pw.pw_name)
    return removed


def _userdel(name: str) -> bool:
    done = subprocess.run(["userdel", name], capture_output=True, text=True)
    if done.returncode != 0:
        log.warning("could not remove the OS user %s: %s", name, done.stderr.strip() or done.returncode)
    return done.returncode == 0


class FakeIdentities:
    def __init__(self, first_uid: int = 70000):
        self.next_uid = first_uid
        self.made: dict[str, Identity] = {}

    def ensure(self, name: str) -> Identity:
        if name not in self.made:
            self.made[name] = Identity(name, self.next_uid, self.next_uid)
            self.next_uid += 1
        return self.made[name]


def tenant_identity(session: Session, identities: Identities, tenant_id: int, prefix: str = PREFIX) -> Identity:
    """The tenant's recorded identity, made and recorded on first use (as ``prefix`` + its id)."""
    tenant = session.get(Tenant, tenant_id)
    made = identities.ensure(tenant.os_user or f"{prefix}{tenant.id}")  # still there, or made again
    if (tenant.os_user, tenant.os_uid, tenant.os_gid) != (made.user, made.uid, made.gid):
        tenant.os_user, tenant.os_uid, tenant.os_gid = made.user, made.uid, made.gid
    return made
