"""Catalog search: ``tag:xray classes>10 size<2GB owner:teamA name:chest* pneumonia``.

Pure: a query parses into terms; an entry (a plain dict per dataset) matches when every
term does. Sizes take B, KB, MB, GB, TB (powers of 1024); a bare word matches the name,
the description or a tag.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from deeppod.errors import InvalidRequest

_COMPARE = re.compile(r"^(classes|size|samples|versions)(<=|>=|<|>|=)(.+)$")
_KEYS = ("tag", "owner", "name", "shared")
_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
HELP = ("use tag:KEY or tag:KEY=VALUE, owner:TENANT, name:GLOB, shared:true|false, classes/samples/versions "
        "with < <= > >= = and a number, size with a unit (size<2GB), or plain words")


@dataclass(frozen=True)
class Term:
    key: str
    op: str
    value: object


def _number(key: str, raw: str) -> float:
    if key == "size":
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", raw.strip())
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidRequest(f"size{raw!r}: write a number with B, KB, MB, GB or TB, e.g. size<2GB")
        return float(m.group(1)) * _UNITS[m.group(2).lower()]
    try:
        return float(raw)
    except ValueError:
        raise InvalidRequest(f"{key} needs a number, not {raw!r}; {HELP}") from None


def parse(query: str) -> list[Term]:
    terms = []
    for word in (query or "").split():
        m = _COMPARE.match(word)
        if m:
            terms.append(Term(m.group(1), m.group(2), _number(m.group(1), m.group(3))))
            continue
        key, colon, value = word.partition(":")
        if colon:
            if key not in _KEYS:
                raise InvalidRequest(f"unknown search key {key!r}: {HELP}")
            if key == "shared" and value not in ("true", "false"):
                raise InvalidRequest("shared: takes true or false")
            terms.append(Term(key, ":", value))
        elif any(c in word for c in "<>="):
            raise InvalidRequest(f"cannot read {word!r}: {HELP}")
        else:
            terms.append(Term("word", ":", word.lower()))
    return terms


def _cmp(actual: float, op: str, want: float) -> bool:
    return {"<": actual < want, "<=": actual <= want, ">": actual > want, ">=": actual >= want,
            "=": actual == want}[op]


def matches(entry: dict, terms: list[Term]) -> bool:
    """entry: name, owner, description, shared, tags, classes, size, samples, versions."""
    for t in terms:
        if t.key in ("classes", "size", "samples", "versions"):
            ok = _cmp(entry.get(t.key) or 0, t.op, t.value)
        elif t.key == "tag":
            k, eq, v = t.value.partition("=")
            ok = k in entry["tags"] and (not eq or str(entry["tags"][k]) == v)
        elif t.key == "owner":
            ok = entry["owner"] == t.value
        elif t.key == "name":
            ok = fnmatch.fnmatchcase(entry["name"], t.value)
        elif t.key == "shared":
            ok = entry["shared"] == (t.value == "true")
        else:
            ok = (t.value in entry["name"].lower() or t.value in (entry.get("description") or "").lower()
                  or any(t.value in k.lower() or t.value in str(v).lower() for k, v in entry["tags"].items()))
        if not ok:
            return False
    return True
