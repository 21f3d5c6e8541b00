"""The Llama family of causal language models (Llama, Mistral, Qwen2) in PyTorch alone, loaded
from a Hugging Face folder's ``config.json`` and safetensors weights: no transformers, no
Python of the model's own, nothing fetched. One forward serves training (all positions at
once) and generation (a key/value cache per layer, new tokens appended)::

    from deeppod.runtime import llama
    model = llama.load("/path/to/folder")             # or llama.Llama(llama.Config.read(folder))
    logits, cache = model(ids)                         # ids: (batch, time)
    logits, cache = model(next_ids, cache=cache)       # one step more, the earlier keys kept

Conventions follow Hugging Face's (weight names, rotary embedding on halves, RMSNorm in
float32). Tested here for causality and for the cache giving what the whole sequence gives;
not yet compared logit for logit with transformers' own Llama (not installed on this project's
machines), and ``rope_scaling`` (Llama 3.1's) is refused until it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from deeppod.runtime import safetensors

FAMILIES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    head_dim: int | None = None

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Config:
        raw = json.loads((Path(folder) / "config.json").read_text())
        kind = raw.get("model_type")
        if kind not in FAMILIES:
            raise ValueError(f"model_type {kind!r} is not one this module runs ({', '.join(FAMILIES)})")
        if raw.get("rope_scaling"):
            raise ValueError(f"rope_scaling {raw['rope_scaling']!r} is not supported yet: only plain rotary embeddings")
        return cls(vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
                   intermediate_size=raw["intermediate_size"], num_hidden_layers=raw["num_hidden_layers"],
                   num_attention_heads=raw["num_attention_heads"],
                   num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
                   max_position_embeddings=raw["max_position_embeddings"],
                   rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=raw.get("rope_theta", 10000.0),
                   attention_bias=raw.get("attention_bias", kind == "qwen2"),
                   tie_word_embeddings=raw.get("tie_word_embeddings", False), head_dim=raw.get("head_dim"))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Rotary(nn.Module):
    def __init__(self, dim: int, theta: float):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim),
                             persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.kv_heads, self.dim = c.num_attention_heads, c.num_key_value_heads, c.dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.dim, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, past: tuple[torch.Tensor, torch.Tensor] | None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        present = (k, v)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        p = k.shape[2] - t  # earlier positions, all visible to every new one
        if p == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            allowed = torch.ones(t, p + t, dtype=torch.bool, device=x.device).tril(diagonal=p)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.dim)), present


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, past):
        h, present = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Body(nn.Module):
    """``model.*`` in Hugging Face's names."""

    def __init__(self, c: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


Cache = list[tuple[torch.Tensor, torch.Tensor]]


class Llama(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.model = Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(config.dim, config.rope_theta)

    def forward(self, ids: torch.Tensor, cache: Cache | None = None) -> tuple[torch.Tensor, Cache]:
        """Logits for every position of ``ids`` (batch, time), and the cache with them appended."""
        start = cache[0][0].shape[2] if cache else 0
        if start + ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"{start + ids.shape[1]} positions: over the model's context of "
                             f"{self.config.max_position_embeddings}")
        x = self.model.embed_tokens(ids)
        cos, sin = self.rotary(torch.arange(start, start + ids.shape[1], device=ids.device), x.dtype)
        present: Cache = []
        for i, layer in enumerate(self.model.layers):
            x, kv = layer(x, cos, sin, cache[i] if cache else None)
            present.append(kv)
        return self.lm_head(self.model.norm(x)), present


def load(folder: str | os.PathLike, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> Llama:
    """A model with the folder's weights (``model.safetensors`` or the index's shards); a name
    without a slash is a registered model the job was given (``--model NAME``)."""
    if os.sep not in str(folder):
        from deeppod.runtime.registry import model_path

        folder = model_path(str(folder))
    folder = Path(folder)
    config = Config.read(folder)
    with torch.device("meta"):
        model = Llama(config)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
        ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(safetensors.load(folder / name))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unknown:
        raise ValueError(f"{folder}'s weights do not fit a {config.num_hidden_layers}-layer model: "
                         + (f"no {missing[0]}" if missing else f"an unknown {unknown[0]}"))
    model.load_state_dict({k: v.to(dtype) if dtype else v for k, v in state.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = Rotary(config.dim, config.rope_theta)  # a buffer made here, not loaded
    return model.to(device)
