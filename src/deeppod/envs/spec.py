"""What a job asks for (its requirements and Python) checked, normalized and keyed.

A key names one environment: the tenant, the normalized requirements, the interpreter asked
for, the platform, the DeepPod version and the package index settings. A requirements file
may name package indexes (``--index-url``, ``--extra-index-url``) that the tenant's plan
allows (``package_indexes``; jobs/quotas.py checks). Standard library only: the CLI checks
a requirements file before it sends it.
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
_INDEX_LINE = re.compile(r"^(--index-url|-i|--extra-index-url)(?:\s+|=)(https?://[^\s/?#]+(?:/[^\s?#]*)?)$")


@dataclass(frozen=True)
class EnvSpec:
    requirements: tuple[str, ...]
    python: str | None = None  # "3.12": an interpreter the node has; None: the server's
    index_url: str | None = None  # its requirements' --index-url (in place of the server's)
    extra_index_urls: tuple[str, ...] = ()  # its requirements' --extra-index-url lines

    @property
    def indexes(self) -> list[str]:
        """The package indexes it names (each must be one its tenant's plan allows)."""
        return [*([self.index_url] if self.index_url else []), *self.extra_index_urls]

    def lines(self) -> list[str]:
        """As a requirements file: the indexes it names, then its requirements."""
        return [*([f"--index-url {self.index_url}"] if self.index_url else []),
                *(f"--extra-index-url {u}" for u in self.extra_index_urls), *self.requirements]

    def index(self, server: dict) -> dict:
        """The index settings its build uses: the server's, with the indexes it names (which
        take the place of a server's no-index)."""
        if not self.indexes:
            return dict(server)
        extra = " ".join(u for u in [server.get("extra_index_url", ""), *self.extra_index_urls] if u)
        return {**{k: v for k, v in server.items() if k != "no_index"}, "extra_index_url": extra,
                "index_url": self.index_url or server.get("index_url", "")}

    def key(self, tenant_id: int, index: dict) -> str:
        from deeppod import __version__

        doc = {"tenant": tenant_id, "requirements": list(self.requirements), "python": self.python,
               "base": sys.version.split()[0] if self.python is None else self.python,
               "platform": f"{sys.platform}-{platform.machine()}", "deeppod": __version__, "index": index}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


# PEP 508's environment markers: these variables, compared with quoted strings, joined by and/or
_MARKER_VARS = {"python_version", "python_full_version", "os_name", "sys_platform", "platform_release",
                "platform_system", "platform_version", "platform_machine", "platform_python_implementation",
                "implementation_name", "implementation_version", "extra"}
_MARKER_TOKEN = re.compile(r"""\s*(?:(?P<str>"[^"\\]*"|'[^'\\]*')|(?P<op>===|==|!=|<=|>=|~=|<|>|\(|\))"""
                           r"""|(?P<word>[A-Za-z_][A-Za-z_]*))""")


def _marker(text: str) -> str | None:
    """The marker written back token by token (the only form passed on), or None when ``text``
    holds anything a marker may not (an option, a path, a stray character)."""
    out, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _MARKER_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return None
        word = m.group("word")
        if word is not None and word not in _MARKER_VARS and word not in ("and", "or", "in", "not"):
            return None
        out.append(m.group("str") or m.group("op") or word)
        pos = m.end()
    return " ".join(out) if out and _well_formed(out) else None


_COMPARE = {"===", "==", "!=", "<=", ">=", "~=", "<", ">"}


def _well_formed(tokens: list[str]) -> bool:
    """PEP 508's marker grammar over the tokens: comparisons of a variable or a string with
    another, joined by and / or, in parentheses or not (a dangling 'and' is not a marker)."""
    at = 0

    def value() -> bool:
        nonlocal at
        if at < len(tokens) and (tokens[at] in _MARKER_VARS or tokens[at][:1] in "\"'"):
            at += 1
            return True
        return False

    def atom() -> bool:
        nonlocal at
        if at < len(tokens) and tokens[at] == "(":
            at += 1
            if not either() or at >= len(tokens) or tokens[at] != ")":
                return False
            at += 1
            return True
        if not value():
            return False
        if at < len(tokens) and tokens[at] in _COMPARE | {"in"}:
            at += 1
        elif tokens[at:at + 2] == ["not", "in"]:
            at += 2
        else:
            return False
        return value()

    def joined(part, word: str) -> bool:
        nonlocal at
        if not part():
            return False
        while at < len(tokens) and tokens[at] == word:
            at += 1
            if not part():
                return False
        return True

    def either() -> bool:
        return joined(lambda: joined(atom, "and"), "or")

    return either() and at == len(tokens)


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
    index_url, extra = None, []
    for n, raw in enumerate((text or "").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if m := _INDEX_LINE.match(line):  # allowed or not by the tenant's plan (checked at submit)
            if m.group(1) == "--extra-index-url":
                extra.append(m.group(2).rstrip("/"))
            elif index_url is not None:
                raise InvalidRequest(f"requirements line {n}: a second --index-url; give one, and --extra-index-url "
                                     "for more")
            else:
                index_url = m.group(2).rstrip("/")
            continue
        if line.startswith("-") or "://" in line or line.startswith((".", "/", "~")) or " @ " in line \
                or not _NAME.match(line):
            raise InvalidRequest(f"requirements line {n} ({line!r}) is not a package requirement: give names with "
                                 "versions (numpy==2.1.0, torch>=2.4); index options, URLs and paths are not taken "
                                 "(the server's settings say which package index its builds use; an index your "
                                 "plan allows may be named as --index-url URL or --extra-index-url URL)")
        head, _, marker = line.partition(";")
        if marker and not _marker(marker):
            raise InvalidRequest(f"requirements line {n}: {marker.strip()!r} is not an environment marker (such as "
                                 "python_version >= \"3.10\" and sys_platform == \"linux\"); nothing else may follow "
                                 "a requirement on its line")
        reqs.append(re.sub(r"\s+", "", head) + (f"; {_marker(marker)}" if marker else ""))
    if not reqs and python is None:
        return None
    return EnvSpec(tuple(sorted(dict.fromkeys(reqs))), python, index_url, tuple(dict.fromkeys(extra)))
