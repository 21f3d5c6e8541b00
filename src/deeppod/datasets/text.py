"""Building one version of a text dataset from JSON Lines, in a staging folder.

Every line is one example in one of three forms: ``{"messages": [{"role", "content"}, ...]}``
(chat), ``{"prompt", "completion"}``, or ``{"text"}``. A line that is not one (not UTF-8, not
JSON, a wrong field, another form than the version's) goes to ``quarantine/`` with its file,
line number and reason; the rest is deduplicated (the same example twice is kept once), split
by a hash of its content (exact fractions, the same side in every version) and written as
``text/train.jsonl`` and ``text/val.jsonl``, each also one object of the store, so S3 serves
them as ``NAME/vN/train.jsonl``. A job reads them with :mod:`deeppod.runtime.text`.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from pathlib import Path

from deeppod.datasets.archive import Member
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import Policy, splits
from deeppod.datasets.shards import write_checksums
from deeppod.errors import InvalidRequest

SUFFIX = ".jsonl"
ROLES = ("system", "user", "assistant", "tool")
FORMS = {"messages": "chat", "prompt": "prompt-completion", "completion": "prompt-completion", "text": "text"}
LENGTH_BUCKETS = [(256, "<256"), (1024, "<1K"), (4096, "<4K"), (16384, "<16K"), (float("inf"), ">=16K")]


def is_text(paths: list[str]) -> bool:
    """An upload is a text dataset when every file in it is JSON Lines."""
    return bool(paths) and all(p.endswith(SUFFIX) for p in paths)


def check(line: bytes) -> tuple[str, dict]:
    """(form, the example's own fields) of one line, or InvalidRequest with why not."""
    try:
        text = line.decode("utf-8-sig")  # a BOM before the first line is no error
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"not UTF-8 (byte {exc.start})") from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(row, dict):
        raise InvalidRequest(f"a JSON {type(row).__name__}, not an object with 'messages', 'prompt' and "
                             "'completion', or 'text'")
    forms = {FORMS[k] for k in row if k in FORMS}
    if len(forms) != 1:
        raise InvalidRequest("has none of 'messages', 'prompt'/'completion', 'text'" if not forms else
                             f"mixes {' and '.join(sorted(forms))} fields: an example is one of them")
    form = forms.pop()
    if form == "chat":
        return form, {"messages": _messages(row["messages"])}
    if form == "prompt-completion":
        for key in ("prompt", "completion"):
            if not isinstance(row.get(key), str):
                raise InvalidRequest(f"'{key}' is {'missing' if key not in row else 'not a string'}")
        if not row["completion"].strip():
            raise InvalidRequest("'completion' is empty: nothing to learn from")
        return form, {"prompt": row["prompt"], "completion": row["completion"]}
    if not isinstance(row["text"], str) or not row["text"].strip():
        raise InvalidRequest("'text' is empty or not a string")
    return form, {"text": row["text"]}


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is not a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] is not an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise InvalidRequest(f"messages[{i}].role is {m.get('role')!r}: use one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise InvalidRequest(f"messages[{i}].content is {'missing' if 'content' not in m else 'not a string'}")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in out):
        raise InvalidRequest("no assistant message with content: nothing to learn from")
    return out


def characters(example: dict) -> int:
    if "messages" in example:
        return sum(len(m["content"]) for m in example["messages"])
    return sum(len(example.get(k, "")) for k in ("prompt", "completion", "text"))


def _lines(member: Member, max_line: int):
    """(line number, bytes) of a member, read as a stream (a 64 GB file never sits in memory),
    blank lines skipped; a line over ``max_line`` comes as None, and is read past, not kept."""
    with member.stream() as f:
        number = 0
        while True:
            line = f.readline(max_line + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield number, None
                continue
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield number, line


def _summary(values: list[int]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered), "mean": round(statistics.fmean(ordered), 1),
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], "max": ordered[-1]}


def build(items: list[tuple[str, Member]], out: Path, objects: ObjectStore, policy: Policy, *, max_line: int,
          built) -> None:
    """Fill ``built`` (datasets/ingest.Built) and the version folder ``out`` from ``items``
    (relative path, member), in the order of the paths. Two passes over a file beside the
    version, so memory holds one hash per example, not the examples."""
    checked = out.parent / "checked.jsonl"  # each kept example once, canonical, in the order first seen
    with Refused(out / "quarantine") as refused:
        shas, duplicates, form = _check_all(items, checked, max_line, refused)
    side = splits([(sha, "text") for sha in shas], policy)
    folder = out / "text"
    folder.mkdir(parents=True)
    per_split: Counter = Counter()
    lengths, turns, roles, buckets = [], [], Counter(), Counter()
    handles = {name: open(folder / f"{name}{SUFFIX}", "wb") for name in ("train", "val")}
    # the split files' digests as they are written (the object's key, and its ETag through S3)
    digests = {name: (hashlib.sha256(), hashlib.md5()) for name in handles}
    try:
        with open(checked, encoding="utf-8") as f:
            for sha, line in zip(shas, f):
                example = json.loads(line)
                split = side[sha]
                data = line.encode()
                handles[split].write(data)
                for h in digests[split]:
                    h.update(data)
                per_split[split] += 1
                n = characters(example)
                lengths.append(n)
                buckets[next(name for limit, name in LENGTH_BUCKETS if n < limit)] += 1
                if "messages" in example:
                    turns.append(len(example["messages"]))
                    roles.update(m["role"] for m in example["messages"])
    finally:
        for f in handles.values():
            f.close()
        checked.unlink(missing_ok=True)
    with open(out / "manifest.jsonl", "w") as manifest:
        for split in ("train", "val"):
            path = folder / f"{split}{SUFFIX}"
            sha, md5 = (h.hexdigest() for h in digests[split])
            size = path.stat().st_size
            known = objects.has(sha)
            objects.stage_file(out.parent, sha, path, known=known)
            if not known:
                built.new_objects.append(sha)
            manifest.write(json.dumps({"path": f"{split}{SUFFIX}", "label": "text", "bytes": size, "sha256": sha,
                                       "md5": md5, "split": split, "examples": per_split[split]}) + "\n")
            built.bytes += size
    (out / "classes.json").write_text("[]")
    built.samples = len(shas)
    built.classes = []
    built.report = {"quarantined": refused.rows, "ingested": built.samples, "duplicates": duplicates,
                    **({"quarantined_total": refused.total} if refused.total > len(refused.rows) else {})}
    built.stats = {
        "kind": "text", "format": form, "samples": built.samples, "bytes": built.bytes,
        "per_split": {s: per_split[s] for s in ("train", "val")}, "duplicates": duplicates,
        "characters": _summary(lengths), "length_histogram": {name: buckets[name] for _, name in LENGTH_BUCKETS},
        "quarantined": refused.total,
        **({"turns": _summary(turns), "roles": dict(roles)} if turns else {}),
    }
    (out / "report.json").write_text(json.dumps(built.report, indent=1))
    (out / "stats.json").write_text(json.dumps(built.stats, indent=1))
    write_checksums(out)


def _check_all(items: list[tuple[str, Member]], checked: Path, max_line: int, refused: Refused):
    """Pass one: every line checked; the kept examples written to ``checked``, the refused ones
    to ``refused``. Returns the kept examples' content hashes (in order), the duplicates dropped
    and the version's form."""
    form: tuple[str, str] | None = None  # the version's form, and where it was first seen
    seen: set[bytes] = set()
    shas: list[str] = []
    duplicates = 0
    with open(checked, "w", encoding="utf-8") as out:
        for rel, member in sorted(items, key=lambda item: item[0]):
            for number, line in _lines(member, max_line):
                where = f"{rel}:{number}"
                if line is None:
                    refused.add(rel, number, f"the line is over the per-line limit of {max_line} bytes "
                                "(DEEPPOD_DATA_MAX_FILE_BYTES)", None)
                    continue
                try:
                    kind, example = check(line)
                except InvalidRequest as exc:
                    refused.add(rel, number, exc.message, line)
                    continue
                if form is None:
                    form = (kind, where)
                elif kind != form[0]:
                    refused.add(rel, number, f"a {kind} example, but this version's examples are {form[0]} (first "
                                f"at {form[1]}): ingest it as another dataset", line)
                    continue
                text = json.dumps(example, ensure_ascii=False)
                digest = hashlib.sha256(json.dumps(example, sort_keys=True, ensure_ascii=False).encode()).digest()
                if digest in seen:
                    duplicates += 1
                    continue
                seen.add(digest)
                shas.append(digest.hex())
                out.write(text + "\n")
    return shas, duplicates, form[0] if form else None


class Refused:
    """The refused lines: each written at once to ``quarantine/FILE`` (the lines as they were,
    in order), the first ``MAX_REPORTED`` listed with their number and reason in the report
    (the database keeps it: a file of a million bad lines must not become a million rows)."""

    MAX_REPORTED = 1000

    def __init__(self, folder: Path):
        self.folder, self.rows, self.total, self._files = folder, [], 0, {}

    def add(self, rel: str, number: int, reason: str, line: bytes | None) -> None:
        self.total += 1
        if len(self.rows) < self.MAX_REPORTED:
            self.rows.append({"path": f"{rel}:{number}", "reason": reason})
        if line is not None:
            if rel not in self._files:
                dest = self.folder / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                self._files[rel] = open(dest, "wb")
            self._files[rel].write(line + b"\n")

    def __enter__(self) -> Refused:
        return self

    def __exit__(self, *exc) -> None:
        for f in self._files.values():
            f.close()


def examples(folder: Path, split: str | None = None, offset: int = 0, limit: int = 20) -> list[dict]:
    """Examples of a version folder, for its page (``split``: train or val, else both)."""
    out: list[dict] = []
    for name in ("train", "val") if split is None else (split,):
        path = folder / "text" / f"{name}{SUFFIX}"
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                if offset:
                    offset -= 1
                    continue
                if len(out) >= limit:
                    return out
                out.append({**json.loads(line), "split": name})
    return out
