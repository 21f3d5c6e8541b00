"""Reading predict bodies and decoding images: every refusal says what was expected."""

import base64
import io
import json

import pytest

from deeppod.errors import BadInput
from deeppod.runtime import inference
from deeppod.serve import inputs
from deeppod.serve.metrics import ReplicaMetrics, merge

SIG = {"classes": ["a", "b"], "input": {"kind": "image", "shape": [3, 8, 8], "mean": [0, 0, 0], "std": [1, 1, 1],
                                        "crop": "squash"}}


def png(w=20, h=10) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


def test_json_with_base64_images_and_tensors():
    got = inputs.from_json(json.dumps({"images": [base64.b64encode(png()).decode()], "tensors": [[1]],
                                       "top_k": 2}).encode())
    assert got.images == [png()] and got.tensors == [[1]] and got.top_k == 2
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    assert inputs.from_json(json.dumps({"images": [data_url]}).encode()).images == [png()]


@pytest.mark.parametrize("body, words", [
    (b"[1]", "must be an object"), (b"{", "not valid JSON"), (b'{"images": "x"}', "list of base64"),
    (b'{"images": ["%%"]}', "not valid base64"), (b"{}", "no image"), (b'{"x": 1}', "unknown field"),
    (b'{"tensors": [1], "top_k": 0}', "between 1 and 1000"), (b'{"tensors": [1], "top_k": "a"}', "whole number"),
])
def test_bad_json_bodies(body, words):
    with pytest.raises(BadInput, match=words):
        inputs.from_json(body)


def test_too_many_inputs_is_too_large():
    with pytest.raises(inputs.TooLarge):
        inputs.from_json(json.dumps({"tensors": [[0]] * (inputs.MAX_ITEMS + 1)}).encode())


def test_decode_squash_and_center_crop():
    x = inference.decode(png(20, 10), SIG)
    assert tuple(x.shape) == (3, 8, 8) and x.dtype.is_floating_point is False
    assert x[:, 0, 0].tolist() == [1, 2, 3]
    x = inference.decode(png(20, 10), {**SIG, "input": {**SIG["input"], "crop": "center"}})
    assert tuple(x.shape) == (3, 8, 8)


@pytest.mark.parametrize("data, words", [(b"", "empty"), (b"GIF89a-not-really", "not an image"),
                                         (b"hello", "not an image")])
def test_decode_refuses_what_is_not_an_image(data, words):
    with pytest.raises(BadInput, match=words):
        inference.decode(data, SIG)


def test_decode_refuses_a_decompression_bomb(monkeypatch):
    monkeypatch.setattr(inference, "MAX_PIXELS", 100)
    with pytest.raises(BadInput, match="pixel limit"):
        inference.decode(png(20, 10), SIG)


def test_tensor_input_checks_shape_and_values():
    assert tuple(inference.tensor_input([[[0.0] * 8] * 8] * 3, SIG).shape) == (3, 8, 8)
    with pytest.raises(BadInput, match=r"\[3, 8, 8\]"):
        inference.tensor_input([[0.0] * 8] * 8, SIG)
    with pytest.raises(BadInput, match="NaN"):
        inference.tensor_input([[[float("nan")] * 8] * 8] * 3, SIG)
    with pytest.raises(BadInput, match="nested lists"):
        inference.tensor_input([["a"]], SIG)


def test_prometheus_text_and_merging_two_replicas():
    a, b = ReplicaMetrics(replica="1"), ReplicaMetrics(replica="2")
    for m in (a, b):
        m.requests.inc(code="200")
        m.batch_size.observe(4)
        m.latency.observe(0.003)
    text = merge([a.render(), b.render(queue_depth=2)])
    lines = text.splitlines()
    assert lines.count("# TYPE deeppod_batch_size histogram") == 1
    assert 'deeppod_batch_size_bucket{le="4",replica="1"} 1' in lines
    assert 'deeppod_predict_requests_total{code="200",replica="2"} 1' in lines
    # a family's samples are together
    fam = [i for i, line in enumerate(lines) if line.startswith("deeppod_batch_size")]
    assert fam == list(range(fam[0], fam[0] + len(fam)))
