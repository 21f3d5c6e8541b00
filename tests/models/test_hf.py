"""Hugging Face model folders in the registry: described from their own files (architecture,
parameters, context length), copied whole, and refused with what to fix when they hold a
pickle, Python, a link, a broken safetensors file or no tokenizer."""

import json
import os
import struct

import pytest

from deeppod.errors import InvalidRequest
from deeppod.models import artifacts, service
from tests.models.hf_folder import CONFIG, parameters, safetensors_bytes, tiny_tensors, write_tiny_llama
from tests.models.test_service import env  # noqa: F401  (the fixture)


def test_a_folder_is_described_from_its_config_and_safetensors_headers(tmp_path):
    sig = artifacts.read_signature(write_tiny_llama(tmp_path / "m"))
    assert sig["kind"] == "causal-lm" and sig["architecture"] == "LlamaForCausalLM" and sig["model_type"] == "llama"
    assert sig["parameters"] == parameters() and sig["dtype"] == "F32" and sig["context_length"] == 128
    assert sig["layers"] == 2 and sig["vocab_size"] == 64 and sig["chat_template"] is True
    assert sig["files"] == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    sharded = artifacts.read_signature(write_tiny_llama(tmp_path / "s", shards=3))
    assert sharded["parameters"] == parameters() and "model.safetensors.index.json" in sharded["files"]
    assert len([f for f in sharded["files"] if f.endswith(".safetensors")]) == 3


def _broken(tmp_path, change):
    folder = write_tiny_llama(tmp_path / "m")
    change(folder)
    with pytest.raises(InvalidRequest) as err:
        artifacts.read_signature(folder)
    return err.value.message


def test_what_is_refused_says_what_to_do(tmp_path):
    def pickle_only(f):
        (f / "model.safetensors").unlink()
        (f / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    assert "is a pickle, which runs code" in _broken(tmp_path / "a", pickle_only)
    assert "shards are .safetensors files" in _broken(tmp_path / "a2", lambda f: (
        f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "pytorch_model.bin"}})))
    assert "it has no weights" in _broken(tmp_path / "a3", lambda f: (f / "model.safetensors").unlink())
    assert "model.py" in _broken(tmp_path / "b", lambda f: (f / "model.py").write_text("import os"))
    def link(f):
        (f / "tokenizer_config.json").unlink()
        os.symlink("/etc/passwd", f / "tokenizer_config.json")
    assert "is a link" in _broken(tmp_path / "c", link)
    assert "no tokenizer" in _broken(tmp_path / "d", lambda f: (f / "tokenizer.json").unlink())

    def cut(f):  # a tensor that points past the file's end
        data = (f / "model.safetensors").read_bytes()
        (f / "model.safetensors").write_bytes(data[:-4])
    assert "does not fit the file" in _broken(tmp_path / "e", cut)

    def overlap(f):
        t = tiny_tensors()
        blob = bytearray(safetensors_bytes(t))
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        first, second = [k for k in header if k != "__metadata__"][:2]
        header[second]["data_offsets"] = header[first]["data_offsets"]
        header[second]["shape"] = header[first]["shape"]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        (f / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(blob[8 + n:]))
    assert "share bytes" in _broken(tmp_path / "f", overlap)
    assert "not a causal language model" in _broken(tmp_path / "g", lambda f: (f / "config.json").write_text(
        json.dumps({**CONFIG, "architectures": ["BertModel"]})))
    assert "no context length" in _broken(tmp_path / "h", lambda f: (f / "config.json").write_text(
        json.dumps({k: v for k, v in CONFIG.items() if k != "max_position_embeddings"})))
    assert "does not hold" in _broken(tmp_path / "i", lambda f: (f / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00002-of-00002.safetensors"}})))


def test_registering_copies_what_was_described_and_serving_says_not_yet(env):  # noqa: F811
    sessions, admin, ana, root, jobs_dir = env
    folder = write_tiny_llama(root.parent / "src", shards=2)
    (folder / "notes.txt").write_text("not part of the model")
    with sessions.begin() as s:
        model, v = service.register(s, ana, "tiny", root=root, jobs_dir=jobs_dir, path=str(folder))
        assert v.signature["kind"] == "causal-lm" and v.signature["parameters"] == parameters()
        kept = sorted(p.name for p in (root / v.key).iterdir())
        assert kept == v.signature["files"] and "notes.txt" not in kept
        assert v.bytes == sum((folder / n).stat().st_size for n in kept)
        with pytest.raises(InvalidRequest, match="is a language model .* serving runs image models for now"):
            from deeppod.deployments import service as deployments
            deployments.create(s, ana, "chat", "tiny@1")
