"""The Llama-family module: loads a Hugging Face folder the tests write, is causal, gives the
same logits with a key/value cache as without (one step at a time or in chunks, with grouped
key/value heads too), refuses weights that do not fit, and learns a sequence through LoRA."""

import json

import pytest
import torch

from deeppod.runtime import llama, lora
from tests.models.hf_folder import CONFIG, write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return llama.load(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "m")).eval()


def test_logits_for_every_position_and_no_position_sees_a_later_one(tiny):
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(0))
    logits, cache = tiny(ids)
    assert logits.shape == (2, 10, CONFIG["vocab_size"]) and len(cache) == CONFIG["num_hidden_layers"]
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % CONFIG["vocab_size"]
    other, _ = tiny(changed)
    assert torch.allclose(other[:, :7], logits[:, :7], atol=1e-6) and not torch.allclose(other[:, 7], logits[:, 7])
    assert torch.allclose(tiny(ids[1:])[0], logits[1:], atol=1e-6)  # rows do not see each other


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_the_cache_gives_what_the_whole_sequence_gives(tiny, kv_heads):
    torch.manual_seed(0)
    model = tiny if kv_heads == 2 else llama.Llama(llama.Config(**{
        k: CONFIG[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "max_position_embeddings")}, num_key_value_heads=1)).eval()
    ids = torch.randint(0, CONFIG["vocab_size"], (3, 12))
    whole, _ = model(ids)
    part, cache = model(ids[:, :5])
    rest, cache = model(ids[:, 5:9], cache=cache)
    steps = []
    for i in range(9, 12):
        step, cache = model(ids[:, i:i + 1], cache=cache)
        steps.append(step)
    assert torch.allclose(torch.cat([part, rest, *steps], dim=1), whole, atol=1e-5)
    assert cache[0][0].shape == (3, kv_heads, 12, CONFIG["hidden_size"] // CONFIG["num_attention_heads"])
    with pytest.raises(ValueError, match="over the model's context of 128"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_weights_that_do_not_fit_and_families_it_does_not_run_are_refused(tmp_path):
    folder = write_tiny_llama(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="do not fit a 3-layer model: no model.layers.2."):
        llama.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not one this module runs"):
        llama.load(folder)


def test_it_learns_a_sequence_through_lora_adapters(tmp_path):
    torch.manual_seed(0)
    model = llama.load(write_tiny_llama(tmp_path / "m"))
    lora.apply(model, targets=("q_proj", "v_proj", "up_proj", "down_proj"), rank=8, alpha=16)
    seq = torch.tensor([[5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49]])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.02)
    losses = []
    for _ in range(80):
        logits, _ = model(seq[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])
    # greedy decoding with the cache now continues the sequence it learnt
    ids, cache, out = seq[:, :3], None, []
    with torch.no_grad():
        for _ in range(5):
            logits, cache = model(ids, cache=cache)
            ids = logits[:, -1:].argmax(-1)
            out.append(int(ids))
    assert out == [17, 21, 25, 29, 33]
