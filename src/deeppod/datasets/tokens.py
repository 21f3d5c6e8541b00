"""Token counts of a text dataset's version for one language model's tokenizer: how long its
examples are in that model's tokens, and how many would not fit its context.

The tokenizer is a registered model's own ``tokenizer.json`` (models/hf.py), read by the
``tokenizers`` package (no Python of the model's runs, nothing is fetched). A chat example is
rendered through the model's chat template when it has one, in Jinja's sandbox (the template is
the tenant's text); otherwise its messages are joined as ``role: content`` lines. Counts are of
at most ``MAX_EXAMPLES`` examples per split, said so when cut, and kept in a cache file per
(version, model version): both are immutable, so a count never goes stale.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path

from deeppod.atomic import atomic_write
from deeppod.datasets.text import SUFFIX
from deeppod.errors import InvalidRequest

log = logging.getLogger(__name__)

MAX_EXAMPLES = 20_000
BATCH = 512
CPU_SECONDS = 120  # per count, in the child
REFUSED = 3  # the child's exit status for a refusal it explains
MEMORY_BYTES = 4 << 30
_counting = threading.BoundedSemaphore(2)  # counts at once on this server: the rest wait their turn
BUCKETS = [(128, "<128"), (512, "<512"), (2048, "<2K"), (8192, "<8K"), (float("inf"), ">=8K")]


def _template(model_folder: Path):
    """The model's chat template, compiled in Jinja's sandbox, or None."""
    text = None
    jinja_file = model_folder / "chat_template.jinja"
    config = model_folder / "tokenizer_config.json"
    if jinja_file.is_file():
        text = jinja_file.read_text(encoding="utf-8")
    elif config.is_file():
        cfg = json.loads(config.read_text(encoding="utf-8"))
        raw = cfg.get("chat_template") if isinstance(cfg, dict) else None
        text = raw if isinstance(raw, str) else None
    if not text:
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    except Exception as exc:  # a template that does not compile: said, and the plain rendering used
        log.info("chat template of %s does not compile (%s): counting without it", model_folder, exc)
        return None


def render(example: dict, template) -> str:
    """The text a model sees for one example."""
    if "messages" in example:
        if template is not None:
            try:
                return template.render(messages=example["messages"], add_generation_prompt=False,
                                       bos_token="", eos_token="")
            except Exception:  # a template that needs what we do not pass: the plain form
                pass
        return "\n".join(f"{m['role']}: {m['content']}" for m in example["messages"])
    if "prompt" in example:
        return example["prompt"] + example["completion"]
    return example["text"]


def count(version_folder: Path, model_folder: Path, context_length: int, cache: Path) -> dict:
    """Token statistics of a text version for the tokenizer in ``model_folder``, counted in a
    child process with its own CPU-time and memory limits: the template and the tokenizer are
    the tenant's, and neither may hold the server's threads or memory (a template's loops can
    be made to run for hours)."""
    if cache.is_file():
        return json.loads(cache.read_text())
    command = [sys.executable, "-m", "deeppod.datasets.tokens", str(version_folder), str(model_folder),
               str(context_length), str(CPU_SECONDS), str(MEMORY_BYTES)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RAYON_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    with _counting:
        try:
            done = subprocess.run(command, capture_output=True, timeout=CPU_SECONDS * 2 + 30, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise InvalidRequest(_over("time")) from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL) or (err and "MemoryError" in err[-1]):
            raise InvalidRequest(_over("CPU time or memory"))
        if done.returncode == REFUSED and err:
            raise InvalidRequest(err[-1])
        raise InvalidRequest("the model's tokenizer could not count this dataset: "
                             + (err[-1] if err else f"exit status {done.returncode}"))
    stats = json.loads(done.stdout)
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps(stats), mode=0o600)
    return stats


def _over(what: str) -> str:
    return (f"counting took more {what} than a count may ({CPU_SECONDS} s of CPU, {MEMORY_BYTES >> 30} GiB): the "
            "model's chat template or tokenizer does too much per example; fix its chat template")


def _count(version_folder: Path, model_folder: Path, context_length: int) -> dict:
    """In the child: the count itself."""
    from tokenizers import Tokenizer

    tokenizer_file = model_folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise InvalidRequest("this model has no tokenizer.json (a SentencePiece tokenizer.model only): token counts "
                             "need a tokenizer.json; save the tokenizer with tokenizer.save_pretrained")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:
        raise InvalidRequest(f"the model's tokenizer.json cannot be read ({exc})") from None
    template = _template(model_folder)
    lengths: list[int] = []
    per_split, counted, cut = {}, 0, False
    for split in ("train", "val"):
        path = version_folder / "text" / f"{split}{SUFFIX}"
        total = seen = 0
        with open(path, encoding="utf-8") as f:
            batch: list[str] = []
            for line in f:
                if seen >= MAX_EXAMPLES:
                    cut = True
                    break
                batch.append(render(json.loads(line), template))
                seen += 1
                if len(batch) == BATCH:
                    total += _encode(tokenizer, batch, lengths)
                    batch = []
            if batch:
                total += _encode(tokenizer, batch, lengths)
        per_split[split] = {"examples": seen, "tokens": total}
        counted += seen
    ordered = sorted(lengths)
    stats = {
        "examples": counted, "cut_at": MAX_EXAMPLES if cut else None, "tokens": sum(lengths),
        "per_split": per_split, "context_length": context_length,
        "over_context": sum(1 for n in lengths if n > context_length), "chat_template": template is not None,
        "per_example": {} if not ordered else {
            "min": ordered[0], "median": ordered[len(ordered) // 2], "mean": round(sum(ordered) / len(ordered), 1),
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], "max": ordered[-1]},
        "histogram": {name: sum(1 for n in lengths if lo <= n < hi) for lo, hi, name in _ranges()},
    }
    return stats


def _ranges():
    lo = 0
    for hi, name in BUCKETS:
        yield lo, hi, name
        lo = hi


def _encode(tokenizer, batch: list[str], lengths: list[int]) -> int:
    encoded = tokenizer.encode_batch(batch, add_special_tokens=True)
    n = [len(e.ids) for e in encoded]
    lengths.extend(n)
    return sum(n)


def main(argv: list[str]) -> None:
    folder, model, context, cpu, memory = argv
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))
    resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    os.nice(10)
    try:
        stats = _count(Path(folder), Path(model), int(context))
    except InvalidRequest as exc:
        sys.stderr.write(exc.message + "\n")
        sys.exit(REFUSED)
    sys.stdout.write(json.dumps(stats))


if __name__ == "__main__":
    main(sys.argv[1:])
