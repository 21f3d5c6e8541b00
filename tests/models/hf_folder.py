"""A tiny Hugging Face model folder the tests write themselves (nothing comes from a hub): a
2-layer Llama-style config, its weights as real safetensors (the format written by hand: an
8-byte header length, the JSON header, the tensors' bytes), and a BPE tokenizer trained on the tests' own text."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64,
          "max_position_embeddings": 128, "torch_dtype": "float32"}


def tiny_tensors(config: dict = CONFIG) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h, h),
                    p + "self_attn.v_proj.weight": (h, h), p + "self_attn.o_proj.weight": (h, h),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                    p + "post_attention_layernorm.weight": (h,)})
    return {k: rng.standard_normal(shape).astype(np.float32) for k, shape in out.items()}


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        data = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[str(t.dtype)], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_tiny_llama(folder: Path, *, shards: int = 1, config: dict = CONFIG) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = tiny_tensors(config)
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    else:
        names = list(tensors)
        weight_map = {}
        for k in range(shards):
            part = names[k::shards]
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            (folder / fname).write_bytes(safetensors_bytes({n: tensors[n] for n in part}))
            weight_map.update({n: fname for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    train_tokenizer(CORPUS).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}"
                                                                               "{% endfor %}"}))
    return folder


CORPUS = [f"user: what is {i} plus {j}? assistant: {i + j}" for i in range(10) for j in range(10)]


def train_tokenizer(corpus: list[str], vocab_size: int = 64):
    """A real BPE tokenizer (the tokenizers package), trained here on the tests' own text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"]))
    return tok


def parameters(config: dict = CONFIG) -> int:
    return sum(t.size for t in tiny_tensors(config).values())
