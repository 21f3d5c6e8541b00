"""Reaching a notebook's Jupyter server: a unix socket in the notebook's own folder, and nothing else.

The server listens on ``.deeppod-notebook.sock`` in its working folder (its tenant's, mode
0700 inside a root-owned job folder), so no other tenant and no port on any network reaches
it. The control plane (root) connects without following a link the job could plant there: the
folder is opened component by component, the socket with ``O_PATH | O_NOFOLLOW``, and it must
be a socket owned by whoever owns the folder (the tenant's identity): a link to the Docker
socket, or another tenant's socket hard-linked in, is refused. The connect goes through
``/proc/self/fd/N`` of what was checked, so nothing can be swapped in between (and a long
path does not hit the 108 bytes a socket address holds).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
from datetime import UTC, datetime

from deeppod.auth.tokens import notebook_secret
from deeppod.errors import Unavailable
from deeppod.nofollow import open_dir

SOCKET_NAME = ".deeppod-notebook.sock"
PROBE_TIMEOUT_S = 5.0


def base_path(job_id: int) -> str:
    """Where the notebook is served, on the control plane and in its Jupyter server alike."""
    return f"/notebooks/{job_id}/"


def connect(workdir: str, *, timeout: float | None = None) -> socket.socket:
    """A connected socket to the notebook whose folder is ``workdir``; Unavailable when its
    server is not listening (yet, or any more), or what is there is not its own socket."""
    try:
        folder = open_dir(workdir)
    except OSError:
        raise Unavailable("the notebook's folder is gone: start it again") from None
    try:
        owner = os.fstat(folder).st_uid
        try:
            fd = os.open(SOCKET_NAME, os.O_PATH | os.O_NOFOLLOW, dir_fd=folder)
        except OSError:
            raise Unavailable("the notebook's server is not listening yet: try again in a few seconds") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != owner:
                raise Unavailable("the notebook's folder holds no socket of its own server: stop and resume it")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(f"/proc/self/fd/{fd}")
            except OSError:
                s.close()
                raise Unavailable("the notebook's server is not answering: try again in a few seconds") from None
            return s
        finally:
            os.close(fd)
    finally:
        os.close(folder)


class _Connection(http.client.HTTPConnection):
    def __init__(self, workdir: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.workdir = workdir

    def connect(self) -> None:
        self.sock = connect(self.workdir, timeout=self.timeout)


def get_json(job_id: int, workdir: str, path: str, timeout: float = PROBE_TIMEOUT_S):
    """GET ``path`` (under the notebook's base, e.g. ``api/kernels``) from its server, as the proxy does."""
    conn = _Connection(workdir, timeout)
    try:
        conn.request("GET", base_path(job_id) + path, headers={"Authorization": f"token {notebook_secret(job_id)}"})
        r = conn.getresponse()
        body = r.read(1 << 20)
        if r.status != 200:
            raise Unavailable(f"the notebook's server answered {r.status} to {path}")
        return json.loads(body)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise Unavailable(f"the notebook's server did not answer {path}: {exc}") from None
    finally:
        conn.close()


def _when(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def last_activity(job_id: int, workdir: str, now: datetime) -> datetime | None:
    """When the notebook's kernels or terminals were last active (``now`` while a kernel is
    busy); None when it has neither. Browsing files alone is not activity: a notebook left
    open in a tab with nothing running is idle. Unavailable when its server does not answer."""
    seen = []
    for k in get_json(job_id, workdir, "api/kernels"):
        if k.get("execution_state") == "busy":
            return now
        seen.append(_when(k.get("last_activity")))
    seen += [_when(t.get("last_activity")) for t in get_json(job_id, workdir, "api/terminals")]
    seen = [t for t in seen if t is not None]
    return max(seen) if seen else None
