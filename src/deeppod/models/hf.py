"""A Hugging Face model folder (``save_pretrained``'s layout) as a registry artifact: which files
it has, what they say of the model (architecture, parameters, context length), checked without
loading a weight and without a byte from any hub.

Only safetensors weights are taken: a pickle (``pytorch_model.bin``, ``*.pt``) runs code when it is
loaded, and so would a folder's own Python (``trust_remote_code``); both are refused with what to
do instead. Every file is read through the folder's descriptor, no link followed (the folder may
be a job's, which it can change while the server reads it).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct

from deeppod.errors import InvalidRequest
from deeppod.nofollow import open_regular

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json")
OTHER_FILES = ("generation_config.json", "README.md", "LICENSE")
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_JSON_BYTES = 32 << 20  # a config, an index or a tokenizer (a large vocabulary's tokenizer.json is ~20 MB)
MAX_HEADER_BYTES = 100 << 20  # safetensors' own bound on its header
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def is_hf_folder(names: set[str]) -> bool:
    return CONFIG in names


def _bad(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {what}. A Hugging Face model folder is what save_pretrained(..., "
                          "safe_serialization=True) writes: config.json, safetensors weights and the tokenizer")


def _read_json(dir_fd: int, name: str, where: str):
    fd, st = open_regular(dir_fd, name)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_JSON_BYTES:
            raise _bad(where, f"{name} is over {MAX_JSON_BYTES} bytes")
        try:
            return json.loads(f.read(MAX_JSON_BYTES + 1))
        except (ValueError, UnicodeDecodeError) as exc:
            raise _bad(where, f"{name} is not valid JSON ({exc})") from None


def tensors(dir_fd: int, name: str, where: str) -> tuple[int, dict[str, int]]:
    """(parameters, bytes per dtype) of one safetensors file, from its header, checked against
    the file's size: a tensor that points past the end, or overlaps another, is refused."""
    fd, st = open_regular(dir_fd, name)
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(where, f"{name} is not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > st.st_size:
            raise _bad(where, f"{name} is not a safetensors file (its header says {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise _bad(where, f"{name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise _bad(where, f"{name}'s header is not an object")
    data_bytes = st.st_size - 8 - n
    spans, parameters, by_dtype = [], 0, {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        if not (isinstance(t, dict) and t.get("dtype") in DTYPE_BYTES and isinstance(t.get("shape"), list)
                and all(isinstance(d, int) and d >= 0 for d in t["shape"])
                and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2
                and all(isinstance(o, int) for o in t["data_offsets"])):
            raise _bad(where, f"{name}: tensor {key!r} has no valid dtype, shape and data_offsets")
        start, end = t["data_offsets"]
        count = math.prod(t["shape"])
        if not 0 <= start <= end <= data_bytes or end - start != count * DTYPE_BYTES[t["dtype"]]:
            raise _bad(where, f"{name}: tensor {key!r} does not fit the file ({start}..{end} of {data_bytes} bytes)")
        spans.append((start, end))
        parameters += count
        by_dtype[t["dtype"]] = by_dtype.get(t["dtype"], 0) + count
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        raise _bad(where, f"{name}: two tensors share bytes")
    return parameters, by_dtype


def describe(dir_fd: int, names: set[str], where: str) -> tuple[dict, list[str]]:
    """(signature, the files to keep) of a model folder open as ``dir_fd`` whose entries are
    ``names``. Raises InvalidRequest with what to fix."""
    pickles = sorted(n for n in names if n.endswith(PICKLES))
    if pickles and WEIGHTS not in names and WEIGHTS_INDEX not in names:
        what = "is a pickle, which runs" if len(pickles) == 1 else "are pickles, which run"
        raise _bad(where, f"{', '.join(pickles)} {what} code when loaded; save the weights as safetensors instead")
    code = sorted(n for n in names if n.endswith(".py"))
    if code:
        raise _bad(where, f"it holds Python ({', '.join(code)}): a model's own code is not run here; use an "
                          "architecture the transformers package ships")
    for name in names:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _bad(where, f"{name} is a link: a model's files must be files (the server copies them)")
    config = _read_json(dir_fd, CONFIG, where)
    if not isinstance(config, dict):
        raise _bad(where, "config.json is not an object")
    architectures = config.get("architectures")
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise _bad(where, "config.json has no 'architectures'")
    arch = architectures[0]
    if not arch.endswith("ForCausalLM"):
        raise _bad(where, f"{arch} is not a causal language model (an architecture named ...ForCausalLM)")
    if not isinstance(config.get("model_type"), str):
        raise _bad(where, "config.json has no 'model_type'")
    context = next((config[k] for k in CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0), None)
    if context is None:
        raise _bad(where, f"config.json says no context length (one of {', '.join(CONTEXT_KEYS)})")
    if "tokenizer.json" not in names and "tokenizer.model" not in names:
        raise _bad(where, "it has no tokenizer (tokenizer.json or tokenizer.model): save the tokenizer beside the "
                          "model (tokenizer.save_pretrained)")
    weights = _weight_files(dir_fd, names, where)
    parameters, by_dtype = 0, {}
    for name in weights:
        p, d = tensors(dir_fd, name, where)
        parameters += p
        for k, v in d.items():
            by_dtype[k] = by_dtype.get(k, 0) + v
    if parameters == 0:
        raise _bad(where, "its weights hold no tensor")
    keep = sorted({CONFIG, *weights, *(n for n in TOKENIZER_FILES + OTHER_FILES if n in names),
                   *([WEIGHTS_INDEX] if WEIGHTS_INDEX in names else [])})
    for name in keep:  # regular files only: a FIFO or a device would hang or leak the copy
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise _bad(where, f"{name} is not a regular file")
    signature = {
        "kind": "causal-lm", "format": "huggingface", "architecture": arch, "model_type": config["model_type"],
        "parameters": parameters, "dtype": max(by_dtype, key=by_dtype.get), "context_length": context,
        "vocab_size": config.get("vocab_size"), "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "tokenizer": "tokenizer.json" if "tokenizer.json" in names else "tokenizer.model",
        "chat_template": "chat_template.jinja" in names or _has_template(dir_fd, names, where),
        "files": keep,
    }
    return signature, keep


def _weight_files(dir_fd: int, names: set[str], where: str) -> list[str]:
    if WEIGHTS_INDEX not in names:
        if WEIGHTS not in names:
            raise _bad(where, f"it has no weights ({WEIGHTS}, or {WEIGHTS_INDEX} and its shards)")
        return [WEIGHTS]
    index = _read_json(dir_fd, WEIGHTS_INDEX, where)
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise _bad(where, f"{WEIGHTS_INDEX} has no 'weight_map'")
    files = sorted(set(wmap.values()))
    for name in files:
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not name.endswith(".safetensors"):
            raise _bad(where, f"{WEIGHTS_INDEX} names {name!r}: shards are .safetensors files beside it")
        if name not in names:
            raise _bad(where, f"{WEIGHTS_INDEX} names {name}, which the folder does not hold")
    return files


def _has_template(dir_fd: int, names: set[str], where: str) -> bool:
    if "tokenizer_config.json" not in names:
        return False
    cfg = _read_json(dir_fd, "tokenizer_config.json", where)
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))
