"""A job's requirements checked at submit for names no package index has: a misspelt package is
refused with the nearest names then, not minutes later when its environment is built.

Only names are checked (versions and markers are the build's to resolve), and only where the
answer is certain: a name in the server's folder of wheels is known; one the index answers
404 for (PEP 503's ``INDEX/NAME/``) is not; an index that cannot be reached in time says
nothing, and the build decides as before."""

from __future__ import annotations

import logging
import re
import time
import urllib.error
import urllib.request

from deeppod.envs.build import folder_names, known_names, similar
from deeppod.envs.spec import EnvSpec
from deeppod.errors import InvalidRequest

log = logging.getLogger(__name__)

PYPI = "https://pypi.org/simple"  # what uv and pip use where the server names no index
TIMEOUT_S = 3.0
_FOUND_TTL_S = 3600.0
_found: dict[str, float] = {}  # an index page -> when it was last there


def name_of(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)).lower()


def check(spec: EnvSpec | None, index: dict, *, ask=None) -> None:
    """Refuse ``spec`` when one of its names is in none of the places its build installs from
    (``index``: the build's settings, EnvSpec.index). ``ask(url) -> bool | None`` reads one
    index page (tests give a fake)."""
    if spec is None or not spec.requirements:
        return
    ask = ask or _ask
    links = index.get("find_links", "")
    local = folder_names(links)
    urls = [] if index.get("no_index") else \
        [index.get("index_url") or PYPI, *index.get("extra_index_url", "").split()]
    if not urls and not links.startswith("/"):
        return  # packages from a place this server cannot list: the build decides
    for requirement in spec.requirements:
        name = name_of(requirement)
        if name in local:
            continue
        answers = [ask(f"{url.rstrip('/')}/{name}/") for url in urls]
        if any(a is not False for a in answers):  # found, or an index that did not answer: the build decides
            continue
        where = ", ".join(urls) if urls else "this server's folder of packages (no index)"
        near = similar(name, known_names(index))
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        raise InvalidRequest(f"requirements: no package named {name!r} in {where}{hint} (fix the name; nothing was "
                             "submitted)")


def _ask(url: str) -> bool | None:
    """Whether the index has the page: True, False (404), or None (no answer in time)."""
    if time.monotonic() - _found.get(url, -_FOUND_TTL_S) < _FOUND_TTL_S:
        return True
    req = urllib.request.Request(url, method="GET", headers={"Accept": "application/vnd.pypi.simple.v1+json, "
                                                                        "text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            r.read(1)
    except urllib.error.HTTPError as exc:
        return False if exc.code == 404 else None
    except (OSError, ValueError) as exc:
        log.info("package index %s did not answer (%s): the build will check the name", url, exc)
        return None
    _found[url] = time.monotonic()
    return True
