import io

import pytest
from PIL import Image

from deeppod.datasets.policy import Policy, apply, split_of
from deeppod.errors import InvalidRequest
from tests.datasets.images import image_bytes


@pytest.mark.parametrize("raw,msg", [
    ({"resize": "big"}, "max:N or short:N"), ({"format": "gif"}, "format"), ({"quality": 0}, "quality"),
    ({"tile": 3}, "tile"), ({"val": 1.0}, "below 1"), ({"colour": "RGB"}, "unknown policy key 'colour'"),
    ({"quality": "high"}, "whole numbers"),
])
def test_bad_policies_say_what_to_fix(raw, msg):
    with pytest.raises(InvalidRequest, match=msg):
        Policy.parse(raw)


def _decoded(data):
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def test_identity_keeps_the_bytes():
    data = image_bytes(1, (50, 30))
    assert apply(_decoded(data), data, Policy()) == [("", data, 50, 30)]


def test_resize_reencode_and_mode():
    data = image_bytes(2, (400, 200), "PNG")
    [(_, out, w, h)] = apply(_decoded(data), data, Policy.parse({"resize": "short:100", "format": "jpeg",
                                                                 "quality": 80}))
    assert (w, h) == (200, 100) and _decoded(out).format == "JPEG"
    [(_, out, w, h)] = apply(_decoded(data), data, Policy.parse({"resize": "max:100", "mode": "L"}))
    assert (w, h) == (100, 50) and _decoded(out).mode == "L" and _decoded(out).format == "PNG"
    small = image_bytes(3, (60, 40))
    [(_, _, w, h)] = apply(_decoded(small), small, Policy.parse({"resize": "short:100"}))
    assert (w, h) == (60, 40)  # never upscaled


def test_tiling_cuts_large_images_into_tiles():
    data = image_bytes(4, (250, 120), "PNG")
    tiles = apply(_decoded(data), data, Policy.parse({"tile": 100}))
    assert [t[0] for t in tiles] == [f"#tile={r},{c}" for r in range(2) for c in range(3)]
    assert [(t[2], t[3]) for t in tiles] == [(100, 100), (100, 100), (50, 100), (100, 20), (100, 20), (50, 20)]


def test_split_is_deterministic_and_close_to_the_fraction():
    p = Policy.parse({"val": 0.2})
    sides = [split_of(f"c/{i}.jpg", p) for i in range(2000)]
    assert sides == [split_of(f"c/{i}.jpg", p) for i in range(2000)]
    assert 0.17 < sides.count("val") / 2000 < 0.23
    other = [split_of(f"c/{i}.jpg", Policy.parse({"val": 0.2, "split_seed": 1})) for i in range(2000)]
    assert other != sides
