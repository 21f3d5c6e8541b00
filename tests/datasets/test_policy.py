import io

import pytest
from PIL import Image

from deeppod.datasets.policy import Policy, apply, splits
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


def test_the_split_is_exact_in_every_class_deterministic_and_stable_as_files_are_added():
    """Issue 71: val=0.2 on 40 images gave 15 validation images (a per-file hash): now exactly
    round(n x val) per class, by the files' hashes."""
    p = Policy.parse({"val": 0.2})
    files = [(f"{c}/{i}.jpg", c) for c, n in (("cat", 25), ("dog", 15), ("owl", 3)) for i in range(n)]
    sides = splits(files, p)
    val = {c: sum(1 for f, lab in files if lab == c and sides[f] == "val") for c in ("cat", "dog", "owl")}
    assert val == {"cat": 5, "dog": 3, "owl": 1} and len(sides) == len(files)
    assert splits(list(reversed(files)), p) == sides  # the order files come in says nothing
    assert splits(files, Policy.parse({"val": 0.2, "split_seed": 1})) != sides
    more = splits(files + [(f"cat/{i}.jpg", "cat") for i in range(25, 30)], p)  # 6 of 30 now
    assert sum(1 for f in more if f.startswith("cat/") and more[f] == "val") == 6
    moved = [f for f, _ in files if more[f] != sides[f]]  # only files near the cut change sides
    assert len(moved) <= 2 * 5 and all(more[f] == sides[f] for f, lab in files if lab != "cat")
    assert set(splits(files, Policy.parse({"val": 0.0})).values()) == {"train"}
