"""The tenant rule has one home (auth/scope.py): every query a service runs for a caller over a
tenant-owned table goes through it, and no module writes the rule by hand again.

The services are read, not run: a function that takes the caller (``principal``, ``viewer``,
``who``) and reads a table with a ``tenant_id`` must call a helper of ``auth.scope`` (or a
function that does, through any chain of calls in the package); a comparison against the
caller's ``tenant_id`` outside auth/scope.py is the rule written again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlalchemy import select

from deeppod.auth import scope
from deeppod.auth.service import Principal
from deeppod.store.models import Base, Job, Tenant, User

SRC = Path(scope.__file__).resolve().parents[1]
CALLER = {"principal", "viewer", "who"}
# the users-and-tokens rule (tenant admins manage the tenants below them in the plan) is its own
MANAGE = {"managed_tenants"}
SKIP = ("store/", "auth/scope.py")
# reads every tenant's rows on purpose, and shows a caller only what is its own: why, for each
WHOLE_CLUSTER = {
    "plans/service.py plan_status": "lent and borrowed GPUs are sums over every tenant; a member is shown its "
                                    "own line and its groups' totals only",
}


def _owned() -> set[str]:
    """ORM classes whose table has a tenant_id: what a tenant owns."""
    return {m.class_.__name__ for m in Base.registry.mappers if "tenant_id" in m.local_table.c}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call)):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node.id if isinstance(node, ast.Name) else None


class _Source:
    """One module: its functions, and what the names it imports stand for."""

    def __init__(self, text: str, where: str) -> None:
        self.where = where
        self.module = "deeppod." + where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        self.tree = ast.parse(text)
        self.functions = [n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.names: dict[str, str] = {}  # local name -> dotted module, or module:function
        for n in ast.walk(self.tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                for a in n.names:
                    self.names[a.asname or a.name] = f"{n.module}.{a.name}"
            elif isinstance(n, ast.Import):
                for a in n.names:
                    self.names[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]

    def resolve(self, call: ast.Call) -> str | None:
        """``module.function`` a call names, where it can be told from the source (never a method)."""
        f = call.func
        if isinstance(f, ast.Name):
            return self.names.get(f.id, f"{self.module}.{f.id}")
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.names:
            return f"{self.names[f.value.id]}.{f.attr}"
        return None

    def calls(self, fn: ast.AST) -> set[str]:
        return {r for n in ast.walk(fn) if isinstance(n, ast.Call) and (r := self.resolve(n))}


def _sources(texts: dict[str, str] | None = None) -> list[_Source]:
    if texts is None:
        texts = {p.relative_to(SRC).as_posix(): p.read_text() for p in sorted(SRC.rglob("*.py"))}
    return [_Source(t, w) for w, t in texts.items() if not w.startswith(SKIP)]


def _applies_the_rule(called: str) -> bool:
    return called.rsplit(".", 1)[0] == scope.__name__ or called.rsplit(".", 1)[-1] in MANAGE and \
        called.startswith("deeppod.auth.service.")


def _reads(fn: ast.AST, owned: set[str]) -> list[str]:
    """The tenant-owned tables ``fn`` selects from or gets by key."""
    out = []
    for n in ast.walk(fn):
        if not isinstance(n, ast.Call):
            continue
        if _name(n.func) == "select":
            out += [r for a in n.args if (r := _root(a)) in owned]
        elif _name(n.func) == "get" and isinstance(n.func, ast.Attribute) and n.args and _root(n.args[0]) in owned:
            out.append(_root(n.args[0]))
    return out


def _scoped(sources: list[_Source]) -> set[str]:
    """The functions (module.name) that apply the rule, directly or through a chain of calls."""
    calls = {f"{s.module}.{fn.name}": s.calls(fn) for s in sources for fn in s.functions}
    done = {name for name, c in calls.items() if any(_applies_the_rule(x) for x in c)}
    while True:
        more = {name for name, c in calls.items() if name not in done and c & done}
        if not more:
            return done
        done |= more


def unscoped_reads(texts: dict[str, str] | None = None) -> list[str]:
    sources, owned = _sources(texts), _owned()
    scoped = _scoped(sources)
    out = []
    for s in sources:
        for fn in s.functions:
            params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
            reads = _reads(fn, owned)
            if params & CALLER and reads and f"{s.module}.{fn.name}" not in scoped \
                    and f"{s.where} {fn.name}" not in WHOLE_CLUSTER:
                out.append(f"{s.where}:{fn.lineno} {fn.name} reads {', '.join(sorted(set(reads)))}")
    return out


def _is_callers_tenant(node: ast.AST) -> bool:
    """``principal.tenant_id``, ``viewer.principal.tenant_id``, ``who.principal.tenant_id``."""
    return (isinstance(node, ast.Attribute) and node.attr == "tenant_id"
            and (_name(node.value) in CALLER))


def rule_written_by_hand(texts: dict[str, str] | None = None) -> list[str]:
    return sorted(f"{s.where}:{n.lineno}" for s in _sources(texts) for n in ast.walk(s.tree)
                  if isinstance(n, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in n.ops)
                  and any(_is_callers_tenant(x) for x in (n.left, *n.comparators)))


def test_every_query_for_a_caller_over_a_tenants_table_goes_through_the_rule():
    assert unscoped_reads() == []


def test_the_rule_is_not_written_again_outside_its_home():
    assert rule_written_by_hand() == []


def test_the_readers_see_a_forgotten_rule():
    """The checks themselves: a service that lists jobs without the rule, or writes it by hand."""
    forgot = '''
def list_jobs(session, principal):
    return list(session.scalars(select(Job).order_by(Job.id)))

def get_job(session, principal, job_id):
    job = session.get(Job, job_id)
    return job
'''
    assert [r.split(" ", 1)[1] for r in unscoped_reads({"jobs/bad.py": forgot})] == [
        "list_jobs reads Job", "get_job reads Job"]
    by_hand = '''
def list_jobs(session, principal):
    q = select(Job)
    if not principal.is_admin:
        q = q.where(Job.tenant_id == principal.tenant_id)
    return q

def show(viewer, ds):
    return ds.tenant_id != viewer.principal.tenant_id
'''
    assert rule_written_by_hand({"jobs/bad.py": by_hand}) == ["jobs/bad.py:5", "jobs/bad.py:9"]
    through = '''
from deeppod.auth import scope

def lookup(session, principal, job_id):
    job = session.get(Job, job_id)
    if not scope.may_see(principal, job):
        raise NotFound("no such job")
    return job

def logs(session, principal, job_id):
    lookup(session, principal, job_id)
    return session.scalars(select(Job.id).where(Job.id == job_id))
'''
    assert unscoped_reads({"jobs/good.py": through}) == []  # a lookup that applies it, called first


def test_the_owned_tables_are_found_from_the_models():
    assert {"Job", "Dataset", "Model", "Deployment", "Experiment", "User"} <= _owned()


# -- the helpers, on a database --------------------------------------------------------------

@pytest.fixture
def two_tenants(sessions):
    with sessions.begin() as s:
        red, blue = Tenant(name="red"), Tenant(name="blue")
        s.add_all([red, blue])
        s.flush()
        users = [User(name=f"u-{t.name}", tenant_id=t.id) for t in (red, blue)]
        s.add_all(users)
        s.flush()
        for u in users:
            s.add(Job(name=f"job-{u.name}", tenant_id=u.tenant_id, user_id=u.id, state="queued",
                      command=["true"], workdir="/tmp", workers=1))
        ids = (red.id, blue.id)
    return ids


def _principal(tenant_id: int, tenant: str, *, admin: bool = False) -> Principal:
    return Principal(user_id=1, user="u", tenant_id=tenant_id, tenant=tenant, is_admin=admin)


def test_a_member_sees_its_tenants_rows_and_an_admin_all_of_them_but_owns_its_own(sessions, two_tenants):
    red, blue = two_tenants
    member, admin = _principal(red, "red"), _principal(blue, "blue", admin=True)
    with sessions() as s:
        names = lambda q: sorted(s.scalars(q))  # noqa: E731
        assert names(scope.visible(select(Job.name), Job, member)) == ["job-u-red"]
        assert names(scope.visible(select(Job.name), Job, admin)) == ["job-u-blue", "job-u-red"]
        assert names(scope.own(select(Job.name), Job, admin)) == ["job-u-blue"]
        assert names(scope.visible(select(Job.name), Job, member, shared=Job.tenant_id == blue)) == [
            "job-u-blue", "job-u-red"]
        assert names(scope.tenants(select(Tenant.name), member)) == ["red"]
        blue_job = s.scalar(select(Job).where(Job.tenant_id == blue))
        assert not scope.may_see(member, blue_job) and scope.may_see(member, blue_job, shared=True)
        assert scope.may_see(admin, s.scalar(select(Job).where(Job.tenant_id == red)))
        assert scope.owns(admin, blue_job) and not scope.owns(member, blue_job)
