"""What a job asks for (its requirements and Python) checked, normalized and keyed.

A key names one environment: the tenant, the normalized requirements, the interpreter asked
for, the platform, the DeepPod version and the package index settings. Standard library
only: the CLI checks a requirements file before it sends it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
from dataclasses import dataclass

from deeppod.errors import InvalidRequest

MAX_REQUIREMENTS_BYTES = 64 << 10
# a requirement: a distribution name, extras, a version specifier and markers; nothing that
# points the builder elsewhere (URLs, paths, index options: the server's settings say where)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,\s-]+\])?\s*([<>=!~][^;@]*)?(;[^@]*)?$")
_PYTHON = re.compile(r"^3\.\d{1,2}(\.\d{1,2})?$")


@dataclass(frozen=True)
class EnvSpec:
    requirements: tuple[str, ...]
    python: str | None = None  # "3.12": an interpreter the node has; None: the server's

    def key(self, tenant_id: int, index: dict) -> str:
        from deeppod import __version__

        doc = {"tenant": tenant_id, "requirements": list(self.requirements), "python": self.python,
               "base": sys.version.split()[0] if self.python is None else self.python,
               "platform": f"{sys.platform}-{platform.machine()}", "deeppod": __version__, "index": index}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def parse(text: str | None, python: str | None) -> EnvSpec | None:
    """A job's requirements (a requirements.txt's text) and Python checked; None when it asks
    for neither (it runs in the platform's environment)."""
    if python is not None and not _PYTHON.match(python):
        raise InvalidRequest(f"python {python!r} is not a version: give one such as 3.12 (an interpreter the "
                             "nodes have; none is downloaded)")
    if not text and python is None:
        return None
    if text and len(text.encode()) > MAX_REQUIREMENTS_BYTES:
        raise InvalidRequest(f"the requirements are over {MAX_REQUIREMENTS_BYTES >> 10} KiB; list packages, one "
                             "per line")
    reqs = []
    for n, raw in enumerate((text or "").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.startswith("-") or "://" in line or line.startswith((".", "/", "~")) or " @ " in line \
                or not _NAME.match(line):
            raise InvalidRequest(f"requirements line {n} ({line!r}) is not a package requirement: give names with "
                                 "versions (numpy==2.1.0, torch>=2.4); index options, URLs and paths are not taken "
                                 "(the server's settings say which package index its builds use)")
        reqs.append(re.sub(r"\s+", "", line) if ";" not in line else line)
    if not reqs and python is None:
        return None
    return EnvSpec(tuple(sorted(dict.fromkeys(reqs))), python)
