"""Taking a model artifact in from a folder a job owns (models/artifacts.py): root never
follows a link the job planted, whenever it planted it, and keeps what it hashed."""

import hashlib
import os

import pytest

from deeppod.errors import InvalidRequest
from deeppod.models import artifacts
from tests.models.test_service import artifact


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text("dp_the_servers_own_secret")
    return path


@pytest.mark.parametrize("name", ["signature.json", "weights.pt", "model.pt2"])
def test_a_file_swapped_for_a_link_after_the_check_is_refused_and_nothing_is_kept(tmp_path, secret, name):
    art = artifact(tmp_path / "job" / "model")
    assert artifacts.read_signature(art)["classes"] == ["cat", "dog"]  # the check passes...
    (art / name).unlink()
    (art / name).symlink_to(secret)  # ...then the job swaps a file for a link before the copy
    dest = tmp_path / "registry" / "t" / "m" / "v1"
    with pytest.raises(InvalidRequest, match="not a link"):
        artifacts.take_in(art, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # no version, no staging left
    assert not any(b"servers_own_secret" in p.read_bytes() for p in tmp_path.rglob("*")
                   if p.is_file() and not p.is_symlink() and p != secret)


def test_a_model_folder_swapped_for_a_link_is_refused(tmp_path, secret):
    art = artifact(tmp_path / "job" / "model")
    other = artifact(tmp_path / "other-tenant" / "model", serving=b"their program")
    os.rename(art, tmp_path / "job" / "was")
    (tmp_path / "job" / "model").symlink_to(other)
    with pytest.raises(InvalidRequest, match="without following a link"):
        artifacts.take_in(art, tmp_path / "registry" / "v1")
    with pytest.raises(InvalidRequest, match="without following a link"):
        artifacts.read_signature(art)


def test_a_fifo_or_a_device_is_not_read(tmp_path):
    art = artifact(tmp_path / "model")
    (art / "weights.pt").unlink()
    os.mkfifo(art / "weights.pt")  # opening it for reading would wait forever
    with pytest.raises(InvalidRequest, match="regular file"):
        artifacts.take_in(art, tmp_path / "registry" / "v1")


def test_what_is_kept_is_what_was_hashed(tmp_path):
    art = artifact(tmp_path / "model", serving=b"the program" * 1000)
    kept = artifacts.take_in(art, tmp_path / "registry" / "v1")
    (art / "model.pt2").write_bytes(b"changed afterwards")  # the job goes on writing its folder
    assert kept.sha256 == hashlib.sha256((kept.path / "model.pt2").read_bytes()).hexdigest()
    assert (kept.path / "model.pt2").read_bytes() == b"the program" * 1000
    assert kept.bytes == sum(p.stat().st_size for p in kept.path.iterdir())
