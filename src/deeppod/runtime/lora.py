"""LoRA: low-rank adapters on a model's linear layers (Hu et al., 2021), in PyTorch alone.

The base weights are frozen; each adapted layer adds ``B(A(dropout(x))) * alpha / rank`` with
``B`` starting at zero, so an adapted model starts exactly where its base is. Adapters are
saved in PEFT's layout (``adapter_config.json`` + ``adapter_model.safetensors``, keys
``base_model.model.NAME.lora_A.weight``), so the tools that read PEFT adapters read ours;
:func:`merge` folds them into the base weights for serving at no extra cost::

    from deeppod.runtime import lora
    names = lora.apply(model, targets=("q_proj", "v_proj"), rank=16, alpha=32)
    ...train: only the adapters' parameters require grad...
    lora.save(model, "JOB_DIR/model/adapter", base="llama-tiny@3")
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from deeppod.runtime import safetensors

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    base: str | None = None  # the base model it adapts (NAME@VERSION in the registry)

    def to_peft(self) -> dict:
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                "lora_dropout": self.dropout, "target_modules": list(self.targets), "bias": "none",
                "base_model_name_or_path": self.base, "deeppod": {**asdict(self), "targets": list(self.targets)}}

    @classmethod
    def from_peft(cls, raw: dict) -> LoraConfig:
        if raw.get("peft_type") != "LORA":
            raise ValueError(f"{CONFIG} is not a LoRA adapter's (peft_type {raw.get('peft_type')!r})")
        return cls(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]), dropout=float(raw.get("lora_dropout", 0)),
                   targets=tuple(raw["target_modules"]), base=raw.get("base_model_name_or_path"))


class LoRALinear(nn.Module):
    """``base(x) + B(A(dropout(x))) * alpha / rank``; ``base`` frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank={rank}: a LoRA rank is at least 1")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **kw)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling

    def merged(self) -> nn.Linear:
        """The base layer with the adapter folded into its weight."""
        with torch.no_grad():
            delta = (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling
            self.base.weight += delta.to(self.base.weight.dtype)
        return self.base


def apply(model: nn.Module, config: LoraConfig | None = None, **kw) -> list[str]:
    """Wrap every ``nn.Linear`` whose own name is one of ``config.targets`` and freeze the rest
    of the model; returns the adapted layers' full names."""
    config = config or LoraConfig(**kw)
    adapted, linear_names = [], set()
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                linear_names.add(child_name)
                if child_name in config.targets:
                    setattr(parent, child_name, LoRALinear(child, config.rank, config.alpha, config.dropout))
                    adapted.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    if not adapted:
        raise ValueError(f"no linear layer is named {', '.join(config.targets)}; this model's linear layers are "
                         f"named {', '.join(sorted(linear_names)) or '(none)'}")
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name or name.startswith(("lora_A.", "lora_B.")))
    model._deeppod_lora = config  # what save() writes
    return adapted


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights under PEFT's names."""
    return {PREFIX + name: p for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name}


def save(model: nn.Module, folder: str | os.PathLike, base: str | None = None) -> Path:
    config: LoraConfig = getattr(model, "_deeppod_lora", None)
    if config is None:
        raise ValueError("this model has no LoRA adapters: call lora.apply first")
    if base is not None:
        config = LoraConfig(config.rank, config.alpha, config.dropout, config.targets, base)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.save(adapter_state(model), folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps(config.to_peft(), indent=1))
    return folder


def load(model: nn.Module, folder: str | os.PathLike) -> LoraConfig:
    """Adapt ``model`` (its base weights already loaded) with the adapter saved in ``folder``."""
    folder = Path(folder)
    config = LoraConfig.from_peft(json.loads((folder / CONFIG).read_text()))
    apply(model, config)
    weights = safetensors.load(folder / WEIGHTS)
    params = dict(model.named_parameters())
    missing = [n for n in params if (".lora_A." in n or ".lora_B." in n) and PREFIX + n not in weights]
    unknown = [k for k in weights if k[len(PREFIX):] not in params]
    if missing or unknown:
        raise ValueError(f"the adapter in {folder} does not fit this model: "
                         + (f"it has no {missing[0]}" if missing else f"it has {unknown[0]}, which the model lacks"))
    with torch.no_grad():
        for k, w in weights.items():
            params[k[len(PREFIX):]].copy_(w)
    return config


def merge(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base layer (the model is plain again)."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, child_name, child.merged())
    if hasattr(model, "_deeppod_lora"):
        del model._deeppod_lora
    return model
