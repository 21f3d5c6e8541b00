"""Roles, token scopes, and what a token may call at all.

Roles (a user's):
- ``admin``: everything, every tenant.
- ``tenant-admin``: its tenant's subtree (its tenant and the tenants below its node in the
  plan): users, tokens, and the plan below its node; every job of its own tenant. Cordons
  nothing.
- ``member``: submits jobs and manages its own; sees its tenant's work; creates datasets,
  models and deployments of its tenant.
- ``viewer``: reads what a member sees; changes nothing.

Scopes (a token's; they narrow the role, never widen it):
- ``all``: whatever the role allows.
- ``read``: GET only.
- ``predict``: only predictions (and ``whoami``).

A job's own token is narrower still: its own job's routes and registering a model from that
job (:data:`JOB_ROUTES`). A notebook's (scope ``notebook``) acts as its owner, who works in
it as at a terminal, but makes no credential that would outlive it (:data:`NOTEBOOK_DENIED`).
A serving replica's token (scope ``replica``) only announces that replica
(:data:`REPLICA_ROUTES`): a replica runs a model, not the user's code, so a stolen one is
worth nothing else.
"""

from __future__ import annotations

from deeppod.errors import Forbidden, InvalidRequest

ADMIN, TENANT_ADMIN, MEMBER, VIEWER = "admin", "tenant-admin", "member", "viewer"
ROLES = (ADMIN, TENANT_ADMIN, MEMBER, VIEWER)
ALL, READ, PREDICT = "all", "read", "predict"
SCOPES = (ALL, READ, PREDICT)  # what a user may ask for
REPLICA = "replica"  # given by the platform to a serving replica's job token only
NOTEBOOK = "notebook"  # a notebook's job token: its owner's rights while it runs (docs/notebooks.md)
# what a notebook's token may not do: make credentials that would outlive the notebook
NOTEBOOK_DENIED = frozenset({("POST", "/v1/tokens"), ("POST", "/v1/access-keys")})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# POSTs a read-only caller may make all the same: its own read-only S3 access keys (the
# service refuses it a key that writes), and a sizing (a computation that changes nothing)
READ_ONLY_MAY = frozenset({("POST", "/v1/access-keys"), ("DELETE", "/v1/access-keys/{key_id}"),
                           ("POST", "/v1/sizing")})

# (method, route template) a job token may call; {job_id} must be the job's own.
JOB_ROUTES = frozenset({
    ("GET", "/v1/whoami"),
    ("GET", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/jobs/{job_id}/logs"),
    ("GET", "/v1/jobs/{job_id}/metrics"),
    ("POST", "/v1/jobs/{job_id}/metrics"),
    ("GET", "/v1/jobs/{job_id}/histograms"),
    ("POST", "/v1/jobs/{job_id}/trial"),  # a search's process asks for its next trial (runtime.trials())
    ("GET", "/v1/jobs/{job_id}/trial/{number}"),  # and whether a pruner stopped the one it runs
    ("POST", "/v1/models/{name}/versions"),  # the models service checks the body names this job
})
REPLICA_ROUTES = frozenset({("PUT", "/v1/replicas/{job_id}"),
                            ("POST", "/v1/replicas/{job_id}/direct")})  # its direct tokens' use and revocations


def check_route(principal, method: str, route: str, params: dict) -> None:
    """Refuse a call the caller's token scope (or job token) does not cover, before any handler
    runs. What the role allows on a given object is the services' to decide."""
    if principal.job_id is not None and principal.scope == NOTEBOOK:
        if (method, route) in NOTEBOOK_DENIED:
            raise Forbidden(f"a notebook's token makes no credentials that outlive it ({method} {route}); make "
                            "them with your own token ('deeppod tokens create', 'deeppod keys create')")
        return
    if principal.job_id is not None:
        own = str(params.get("job_id", principal.job_id)) == str(principal.job_id)
        if principal.scope == REPLICA:
            if (method, route) not in REPLICA_ROUTES or not own:
                raise Forbidden(f"a serving replica's token may only announce and sync its own replica ({method} "
                                f"{route} is not that); use a user token for anything else")
            return
        if (method, route) not in JOB_ROUTES or not own:
            raise Forbidden(f"a job's token may only call its own job's routes ({method} {route} is not one); "
                            "use a user token for anything else")
        return
    if principal.scope == PREDICT and route != "/v1/whoami":
        raise Forbidden("this token may only call predict; use a token with scope 'all' for anything else")
    if method not in READ_METHODS and (principal.scope == READ or principal.role == VIEWER) \
            and (method, route) not in READ_ONLY_MAY:
        why = "this token is read-only (scope 'read')" if principal.scope == READ else "viewers only read"
        raise Forbidden(f"{why}: {method} {route} changes something; ask for a token or role that may")


def check_predict(principal) -> None:
    """Predict is not routed through :func:`check_route` (it has its own fast path)."""
    if principal.job_id is not None:
        raise Forbidden("a job's token cannot call predict; use a user token or a deployment key")
    if principal.scope == READ or principal.role == VIEWER:
        raise Forbidden("read-only tokens and viewers cannot predict; use a 'predict' token or a deployment key")


def check_runs_code(principal, what: str) -> None:
    """Opening ``what`` (a notebook, a shell) runs code as its owner: a token or role that only
    reads may not, even where it may read the job."""
    if principal.scope != ALL or principal.role == VIEWER:
        raise Forbidden(f"{what} runs code: this token or role only reads; use a token with scope 'all' of its owner")


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidRequest(f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise InvalidRequest(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    return scope
