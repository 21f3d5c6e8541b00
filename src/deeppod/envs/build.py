"""Building a job's environment on its node (the supervisor calls ``ensure`` before it starts
the workers): once per key, under a lock, as the tenant's identity in a sandbox, in a staging
folder renamed into place when complete. Standard library only (the supervisor uses it).

``ENV_DIR/<tenant id>/`` (root's; what is inside an environment is the tenant's, and root
never reads, writes or follows anything in it but to remove it)::

    <key>/               an environment (a virtual environment, the tenant's files)
    <key>.json           written last, when it was built: it is ready (what it holds, when built)
    <key>.used           touched at each start that uses it (least recently used go first)
    <key>.lock           held while it is built (jobs wanting it wait on it)
    .staging-<key>-<pid> one being built (mounted at <key>'s path in the builder's sandbox)
    .uv-cache/           the tenant's own download cache (never shared with another tenant)
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from deeppod.errors import EnvBuildFailed as BuildError
from deeppod.job_folder import JobFolder
from deeppod.nofollow import tree_bytes

REQUIREMENTS = "deeppod-requirements.txt"
LAYER = "_deeppod_platform.pth"  # the platform's environment after the job's own (deeppod.runtime, torch)
# the host's trust and proxy settings reach the installer (an administrator's, like the index)
NETWORK_ENV = frozenset({"SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_CERT", "REQUESTS_CA_BUNDLE", "UV_NATIVE_TLS",
                         "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"})


@dataclass(frozen=True)
class Builds:
    """Where and how this server's environments are built (from its settings)."""

    root: str  # ENV_DIR
    uv: str | None  # the uv program; None: venv and pip
    index: dict = field(default_factory=dict)  # index_url, extra_index_url, find_links, no_index


def env_path(order: dict) -> Path:
    return Path(order["root"]) / order["key"]


def ready_file(env: Path) -> Path:
    """Beside the environment, in root's folder: written when it was built, read by the server."""
    return env.with_name(f"{env.name}.json")


def used_file(env: Path) -> Path:
    return env.with_name(f"{env.name}.used")


def activate(order: dict, env: dict[str, str]) -> dict[str, str]:
    """A worker's environment with the job's Python environment first on its PATH."""
    path = env_path(order)
    return {**env, "PATH": f"{path}/bin:{env.get('PATH', '/usr/bin:/bin')}", "VIRTUAL_ENV": str(path)}


def ensure(order: dict, log, sandbox_spec: dict | None) -> Path:
    """The environment ``order`` names, built if it is not there yet; its path. ``log``: a
    binary file the build's output goes to (the job's log). ``sandbox_spec``: how the job's
    sandbox is made (the build runs in one, as the tenant); None: the server is not root and
    builds as itself."""
    root = Path(order["root"])
    root.mkdir(parents=True, exist_ok=True)
    final = root / order["key"]
    return once(final, log, lambda: _build(order, root, final, log, sandbox_spec),
                found=f"environment {order['key']}: ready (built before)",
                waiting=f"waiting for another job's build of {order['key']}")


def once(final: Path, log, make, *, found: str, waiting: str) -> Path:
    """``final``, made by ``make()`` unless it is ready (its mark written): once per key on
    this node, under a lock beside it; jobs wanting it meanwhile wait (``waiting`` in their
    log), then find it ready (``found``). Marked used either way (least recently used go first)."""
    with open(final.with_name(f"{final.name}.lock"), "a") as lock:
        if not _ready(final):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(log, f"preparing environment: {waiting}")
                fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _ready(final):
                say(log, found)
            else:
                make()
            used_file(final).touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def _ready(final: Path) -> bool:
    return ready_file(final).is_file() and final.is_dir()


def say(log, line: str) -> None:
    log.write(f"[deeppod] {line}\n".encode())
    log.flush()


def _build(order: dict, root: Path, final: Path, log, sandbox_spec: dict | None) -> None:
    started = time.monotonic()
    ready_file(final).unlink(missing_ok=True)
    shutil.rmtree(final, ignore_errors=True)  # a build killed before it was complete: never used, removed
    # sandboxed: built in a staging folder mounted where the environment will be (its scripts
    # name their own path), renamed into place when complete; else in place, READY written last
    build_dir = root / f".staging-{order['key']}-{os.getpid()}" if sandbox_spec is not None else final
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(mode=0o755)
    cache = root / ".uv-cache"
    cache.mkdir(exist_ok=True)
    work = root / f".build-{order['key']}-{os.getpid()}"  # the requirements file, the sandbox's spec
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    try:
        requirements = work / REQUIREMENTS
        requirements.write_text("".join(f"{r}\n" for r in order["requirements"]))
        if sandbox_spec is not None:
            for folder in (build_dir, cache):
                os.chown(folder, int(sandbox_spec["uid"]), int(sandbox_spec["gid"]))
        say(log, f"building environment {order['key']} with {'uv' if order.get('uv') else 'venv and pip'}: "
                  f"{', '.join(order['requirements']) or 'no packages'}"
                  f"{' on Python ' + order['python'] if order.get('python') else ''}")
        binds = [[str(build_dir), str(final), True], [str(cache), str(cache), True], [str(work), str(work), False]]
        links = (order.get("index") or {}).get("find_links", "")
        if links.startswith("/") and os.path.isdir(links):  # a wheelhouse on this machine: read-only to the build
            binds.append([links, links, False])
        code, tail = _run(_script(order, final, requirements), order, sandbox_spec, work, log, cache, binds)
        if code != 0:
            raise BuildError(_why(tail, order))
        if build_dir != final:
            os.rename(build_dir, final)
        # what it holds, measured once: it does not change after the build (mounted read-only)
        ready_file(final).write_text(json.dumps({"key": order["key"], "requirements": order["requirements"],
                                                 "python": order.get("python"), "built_at": time.time(),
                                                 "bytes": tree_bytes(final)}))
        say(log, f"environment {order['key']} built in {time.monotonic() - started:.1f} s")
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _script(order: dict, where: Path, requirements: Path) -> str:
    """The shell lines that build it at ``where`` (as the builder)."""
    python = order.get("python") or order["base_python"]
    ix = order.get("index") or {}
    opts = []
    if ix.get("no_index"):
        opts.append("--no-index")
    for flag, key in (("--index-url", "index_url"), ("--extra-index-url", "extra_index_url"),
                      ("--find-links", "find_links")):
        for value in ix.get(key, "").split():  # extra indexes: the server's, then the plan-allowed ones a job names
            opts += [flag, value]
    q = shlex.quote
    options = " ".join(map(q, opts))
    if order.get("uv"):
        uv = q(order["uv"])
        make = (f"{uv} venv --quiet --python {q(python)} {q(str(where))} && "
                f"{uv} pip install --python {q(str(where / 'bin' / 'python'))} {options} -r {q(str(requirements))}")
    else:
        make = (f"{q(python)} -m venv {q(str(where))} && {q(str(where / 'bin' / 'python'))} -m pip install "
                f"--disable-pip-version-check {options} -r {q(str(requirements))}")
    # the platform's import path after the environment's own (deeppod.runtime, and torch unless
    # pinned), and the requirements kept with it: written by the builder, in its own files
    layer = "".join(f"{p}\n" for p in order.get("layer") or [])
    return (f"{make} && for site in {q(str(where))}/lib/python*/site-packages; do printf %s {q(layer)} > "
            f"\"$site\"/{LAYER}; done && cp {q(str(requirements))} {q(str(where / REQUIREMENTS))}")


def _run(script: str, order: dict, sandbox_spec: dict | None, work: Path, log, cache: Path,
         binds: list[list]) -> tuple[int, list[str]]:
    """Run the build script; its output to ``log``; (exit code, its last lines)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "UV_CACHE_DIR": str(cache),
           "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "copy", "PIP_NO_INPUT": "1",
           "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k in NETWORK_ENV})  # the host's way to the index
    if order.get("uv"):
        env["PATH"] = os.path.dirname(order["uv"]) + ":" + env["PATH"]
    argv = ["/bin/sh", "-c", script]
    if sandbox_spec is not None:  # as the tenant, seeing only its build folder, its cache and the platform
        spec = {"command": argv, "workers": [{"rank": 0, "env": env}],
                "sandbox": {k: v for k, v in sandbox_spec.items() if k in ("uid", "gid", "python", "limits")}
                | {"workdir": "/tmp", "binds": binds}}
        JobFolder(work).write_spec(spec)  # the sandbox reads it as a one-worker job's
        argv = [sys.executable, "-m", "deeppod.executor.sandbox", str(work), "0"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
    tail: list[str] = []
    for raw in p.stdout:
        log.write(raw)
        line = raw.decode(errors="replace").rstrip()
        if line.strip():
            tail = (tail + [line])[-12:]
    log.flush()
    return p.wait(), tail


MARKS = ("error", "×", "ERROR", "╰─▶", "Because", "hint")
# the installer's words for a name the index does not have (uv, then pip)
MISSING = (re.compile(r"Because ([A-Za-z0-9][\w.-]*) was not found"),
           re.compile(r"No matching distribution found for ([A-Za-z0-9][\w.-]*)"))


def _why(tail: list[str], order: dict | None = None) -> str:
    """The installer's own error messages, whole (uv wraps one over several lines), a name it
    could not find with the nearest names this server knows, and what to do."""
    messages: list[str] = []
    for line in tail:
        text = line.strip()
        if text.startswith(MARKS):
            messages.append(text)
        elif messages and line[:1].isspace():  # the message goes on, indented, on the next line
            messages[-1] += " " + text
    said = " ".join(messages[-4:]) or " ".join(x.strip() for x in tail[-2:]) or \
        "the installer failed without a message"
    hint = ""
    for pattern in MISSING:
        found = pattern.search(said)
        if found:
            near = similar(found.group(1), known_names((order or {}).get("index") or {}))
            hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            break
    return (f"{said.rstrip('.') if hint else said}{hint} (check the requirements: the names and versions must "
            "exist in the package index this server uses; the full output is in the job's log)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def similar(name: str, known: set[str]) -> list[str]:
    return difflib.get_close_matches(_normal(name), sorted(known - {_normal(name)}), n=3, cutoff=0.75)


def known_names(index: dict) -> set[str]:
    """Package names this server can vouch for without asking an index: those installed beside
    it and those in its folder of packages (find_links)."""
    from importlib import metadata

    names = {_normal(d.metadata["Name"] or "") for d in metadata.distributions()}
    return (names | folder_names(index.get("find_links", ""))) - {""}


def folder_names(links: str) -> set[str]:
    """The packages in a local find_links folder (none for a URL)."""
    if not (links.startswith("/") and os.path.isdir(links)):
        return set()
    return {_normal(e.split("-")[0]) for e in os.listdir(links) if e.endswith((".whl", ".tar.gz", ".zip"))}
