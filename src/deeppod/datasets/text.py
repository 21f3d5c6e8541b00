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
from deeppod.datasets.shards import file_sha256, write_checksums
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
    """(line number, bytes) of a member, blank lines skipped; a line over ``max_line`` comes as None."""
    data = member.read()
    for number, line in enumerate(data.split(b"\n"), 1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        yield number, (None if len(line) > max_line else line)


def _summary(values: list[int]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered), "mean": round(statistics.fmean(ordered), 1),
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], "max": ordered[-1]}


def build(items: list[tuple[str, Member]], out: Path, objects: ObjectStore, policy: Policy, *, max_line: int,
          built) -> None:
    """Fill ``built`` (datasets/ingest.Built) and the version folder ``out`` from ``items``
    (relative path, member), in the order of the paths."""
    form: tuple[str, str] | None = None  # the version's form, and where it was first seen
    examples: dict[str, dict] = {}  # content sha -> example, first seen kept
    duplicates = 0
    quarantined: list[dict] = []
    for rel, member in sorted(items, key=lambda item: item[0]):
        for number, line in _lines(member, max_line):
            where = f"{rel}:{number}"
            if line is None:
                quarantined.append({"path": where, "reason": f"the line is over the per-line limit of {max_line} "
                                    "bytes (DEEPPOD_DATA_MAX_FILE_BYTES)", "_line": b""})
                continue
            try:
                kind, example = check(line)
            except InvalidRequest as exc:
                quarantined.append({"path": where, "reason": exc.message, "_line": line})
                continue
            if form is None:
                form = (kind, where)
            elif kind != form[0]:
                quarantined.append({"path": where, "reason": f"a {kind} example, but this version's examples are "
                                    f"{form[0]} (first at {form[1]}): ingest it as another dataset",
                                    "_line": line})
                continue
            sha = hashlib.sha256(json.dumps(example, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
            if sha in examples:
                duplicates += 1
                continue
            examples[sha] = example
    side = splits([(sha, "text") for sha in examples], policy)
    folder = out / "text"
    folder.mkdir(parents=True)
    per_split: Counter = Counter()
    lengths, turns, roles, buckets = [], [], Counter(), Counter()
    handles = {name: open(folder / f"{name}{SUFFIX}", "w", encoding="utf-8") for name in ("train", "val")}
    try:
        for sha, example in examples.items():
            split = side[sha]
            handles[split].write(json.dumps(example, ensure_ascii=False) + "\n")
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
    with open(out / "manifest.jsonl", "w") as manifest:
        for split in ("train", "val"):
            path = folder / f"{split}{SUFFIX}"
            sha, size = file_sha256(path), path.stat().st_size
            known = objects.has(sha)
            objects.stage_file(out.parent, sha, path, known=known)
            if not known:
                built.new_objects.append(sha)
            manifest.write(json.dumps({"path": f"{split}{SUFFIX}", "label": "text", "bytes": size, "sha256": sha,
                                       "md5": _md5(path), "split": split, "examples": per_split[split]}) + "\n")
            built.bytes += size
    (out / "classes.json").write_text("[]")
    report = _keep_quarantined(quarantined, out / "quarantine")
    built.samples = len(examples)
    built.classes = []
    built.report = {"quarantined": report, "ingested": built.samples, "duplicates": duplicates}
    built.stats = {
        "kind": "text", "format": form[0] if form else None, "samples": built.samples, "bytes": built.bytes,
        "per_split": {s: per_split[s] for s in ("train", "val")}, "duplicates": duplicates,
        "characters": _summary(lengths), "length_histogram": {name: buckets[name] for _, name in LENGTH_BUCKETS},
        "quarantined": len(report),
        **({"turns": _summary(turns), "roles": dict(roles)} if turns else {}),
    }
    (out / "report.json").write_text(json.dumps(built.report, indent=1))
    (out / "stats.json").write_text(json.dumps(built.stats, indent=1))
    write_checksums(out)


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _keep_quarantined(quarantined: list[dict], folder: Path) -> list[dict]:
    """The refused lines, by the file they came from, as ``quarantine/FILE`` (line numbers in
    the report); the report's rows."""
    by_file: dict[str, list[bytes]] = {}
    for q in quarantined:
        line = q.pop("_line")
        if line:
            by_file.setdefault(q["path"].rsplit(":", 1)[0], []).append(line)
    for rel, lines in by_file.items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"\n".join(lines) + b"\n")
    return quarantined


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
