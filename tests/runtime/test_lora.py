"""LoRA adapters in plain PyTorch: an adapted model starts where its base is, only the adapters
learn, they save in PEFT's layout (safetensors the registry's own checker accepts), load back
into a fresh base, and merge into plain layers with the same outputs."""

import json

import pytest
import torch
from torch import nn

from deeppod.runtime import lora, safetensors


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.v_proj, self.up = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.up(torch.relu(self.q_proj(x) + self.v_proj(x)))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 8)

    def forward(self, x):
        return self.layers[1](self.head(self.layers[0](x)))


def test_an_adapted_model_starts_at_its_base_and_only_the_adapters_learn():
    import copy

    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(64, 8)
    before = model(x).detach()
    teacher = copy.deepcopy(model)  # the base with a rank-1 change to one adapted layer: learnable exactly
    with torch.no_grad():
        teacher.layers[0].q_proj.weight += torch.outer(torch.randn(8), torch.randn(8)) * 0.5
    target = teacher(x).detach()
    base_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = lora.apply(model, targets=("q_proj", "v_proj"), rank=4, alpha=8)
    assert names == ["layers.0.q_proj", "layers.0.v_proj", "layers.1.q_proj", "layers.1.v_proj"]
    assert torch.equal(model(x), before)  # B starts at zero
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable) and len(trainable) == 8
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.02)
    losses = []
    for _ in range(200):
        loss = nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])
    after = {n.replace(".base", ""): p for n, p in model.named_parameters() if "lora_" not in n}
    assert all(torch.equal(after[n], w) for n, w in base_weights.items())  # the base never moved


def test_saved_adapters_load_into_a_fresh_base_and_merge_to_the_same_outputs(tmp_path):
    torch.manual_seed(1)
    base_state = Tiny().state_dict()
    model = Tiny()
    model.load_state_dict(base_state)
    lora.apply(model, targets=("q_proj",), rank=2, alpha=4)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    x = torch.randn(5, 8)
    want = model(x).detach()
    folder = lora.save(model, tmp_path / "adapter", base="tiny@1")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 2 and cfg["target_modules"] == ["q_proj"]
    assert cfg["base_model_name_or_path"] == "tiny@1"
    keys = sorted(safetensors.load(folder / "adapter_model.safetensors"))
    assert keys[0] == "base_model.model.layers.0.q_proj.lora_A.weight" and len(keys) == 4

    fresh = Tiny()
    fresh.load_state_dict(base_state)
    assert lora.load(fresh, folder).rank == 2
    assert torch.allclose(fresh(x), want)
    lora.merge(fresh)
    assert not any(isinstance(m, lora.LoRALinear) for m in fresh.modules())
    assert torch.allclose(fresh(x), want, atol=1e-5)
    with pytest.raises(ValueError, match="does not fit this model"):
        other = nn.Sequential(nn.Linear(8, 8))
        other.q_proj = nn.Linear(8, 8)
        lora.load(other, folder)


def test_a_target_no_layer_has_is_named_with_the_layers_there_are():
    with pytest.raises(ValueError, match="no linear layer is named c_attn; .* head, q_proj, up, v_proj"):
        lora.apply(Tiny(), targets=("c_attn",))


def test_safetensors_round_trip_and_the_registrys_checker_reads_what_jobs_write(tmp_path):
    import os

    from deeppod.models.hf import tensors

    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16),
         "c": torch.tensor([1, 2], dtype=torch.int64), "empty": torch.zeros(0)}
    safetensors.save(t, tmp_path / "w.safetensors")
    back = safetensors.load(tmp_path / "w.safetensors")
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in t.items())
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert tensors(fd, "w.safetensors", str(tmp_path)) == (12, {"F32": 6, "BF16": 4, "I64": 2})
    finally:
        os.close(fd)
