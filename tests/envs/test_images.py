"""Container images (envs/images.py): the archives 'podman save', 'docker save' and 'podman
export' write, unpacked with their layers and whiteouts; nothing lands outside the image;
unpacked once; a job's name is checked against what the administrator offers."""

import io
import json
import os
import stat
import tarfile
import threading

import pytest

from deeppod.envs import images
from deeppod.errors import EnvBuildFailed, InvalidRequest
from tests.helpers import image_archive


def unpacked(tmp_path, kind):
    archive = image_archive(tmp_path, "tiny", kind)
    dest = tmp_path / f"root-{kind}"
    dest.mkdir()
    return dest, images.unpack(archive, dest)


@pytest.mark.slow  # it starts processes
@pytest.mark.parametrize("kind", ["oci", "docker"])
def test_layers_apply_in_order_with_whiteouts_and_the_config(tmp_path, kind):
    dest, config = unpacked(tmp_path, kind)
    assert (dest / "etc" / "image-release").read_text() == "v2\n"  # the second layer's
    assert not (dest / "etc" / "old-file").exists()  # whited out by the second layer
    assert not any(p.name.startswith(".wh.") for p in (dest / "etc").iterdir())
    assert os.access(dest / "bin" / "sh", os.X_OK)
    assert config["Env"] == ["PATH=/bin", "IMAGE_GREETING=hello"]


@pytest.mark.slow  # it starts processes
def test_a_flat_root_file_system_unpacks_as_it_is(tmp_path):
    dest, config = unpacked(tmp_path, "flat")
    assert config == {} and (dest / "etc" / "image-release").read_text() == "v2\n"


def archive_of(tmp_path, *members):
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as t:
        for info, body in members:
            t.addfile(info, io.BytesIO(body) if body is not None else None)
    return path


def entry(name, kind=tarfile.REGTYPE, body=b"x", link="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.size = len(body) if kind == tarfile.REGTYPE else 0
    return info, body if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("members", [
    [entry("../escaped")],
    [entry("out", tarfile.SYMTYPE, link=os.path.dirname(os.path.abspath(__file__))), entry("out/planted.py")],
    [entry("passwd", tarfile.LNKTYPE, link="../../../../../etc/passwd")],
], ids=["dot-dot", "through-a-link", "hard-link-outside"])
def test_nothing_lands_outside_the_image(tmp_path, members):
    archive = archive_of(tmp_path, *members)
    order = {"image": "bad", "archive": str(archive), "key": images.key(archive), "root": str(tmp_path / "cache")}
    with pytest.raises(EnvBuildFailed, match="cannot be unpacked"):
        images.ensure(order, io.BytesIO())
    assert not (tmp_path / "escaped").exists()
    assert not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted.py"))
    assert not images.ready_file(images.image_path(order)).exists()  # never used half unpacked
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_no_setuid_bit_and_no_device_node_is_kept(tmp_path):
    archive = archive_of(tmp_path, entry("bin/su", mode=0o4755), entry("dev/sda", tarfile.BLKTYPE))
    dest = tmp_path / "root"
    dest.mkdir()
    images.unpack(archive, dest)
    assert not os.stat(dest / "bin" / "su").st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert not os.path.lexists(dest / "dev" / "sda")


@pytest.mark.slow  # it starts processes
def test_unpacked_once_and_marked_with_its_config(tmp_path):
    archive = image_archive(tmp_path, "tiny")
    order = images.order_for("tiny", str(tmp_path), str(tmp_path / "envs"))
    logs = [io.BytesIO() for _ in range(3)]
    threads = [threading.Thread(target=images.ensure, args=(order, log)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    said = [log.getvalue().decode() for log in logs]
    assert sum("unpacking image tiny" in s for s in said) == 1, said
    assert sum("ready (unpacked before)" in s for s in said) == 2, said
    path = images.image_path(order)
    doc = json.loads(images.ready_file(path).read_text())
    assert doc["image"] == "tiny" and doc["env"] == ["PATH=/bin", "IMAGE_GREETING=hello"] and doc["bytes"] > 0
    assert (path / "etc" / "resolv.conf").is_file()  # where the host's is mounted
    assert path.with_name(f"{path.name}.used").is_file()
    archive.write_bytes(archive.read_bytes())  # the administrator replaced it: unpacked again
    os.utime(archive, ns=(1, 1))
    assert images.order_for("tiny", str(tmp_path), str(tmp_path / "envs"))["key"] != order["key"]


@pytest.mark.slow  # it starts processes
def test_a_job_names_an_image_the_server_offers(tmp_path):
    image_archive(tmp_path, "tiny")
    (tmp_path / "Not-A-Name.tar").write_bytes(b"")
    assert list(images.offered(str(tmp_path))) == ["tiny"]
    assert images.check_name("tiny", str(tmp_path)) == "tiny"
    assert images.check_name(None, None) is None
    for bad in ("other", "../tiny", "/etc/tiny", "tiny.tar"):
        with pytest.raises(InvalidRequest, match=r"no image .* give one of the names it offers \(tiny\)"):
            images.check_name(bad, str(tmp_path))
    with pytest.raises(InvalidRequest, match="DEEPPOD_IMAGE_DIR"):
        images.check_name("tiny", None)


@pytest.mark.slow  # it starts processes
def test_a_worker_gets_the_images_env_under_the_job_contract(tmp_path):
    image_archive(tmp_path, "tiny")
    order = images.order_for("tiny", str(tmp_path), str(tmp_path / "envs"))
    images.ensure(order, io.BytesIO())
    env = images.activate(order, {"PATH": "/srv/venv/bin:/usr/bin", "RANK": "0", "IMAGE_GREETING": "mine",
                                  "VIRTUAL_ENV": "/srv/venv"}, gpus=False)
    assert env["PATH"] == "/bin" and env["RANK"] == "0" and "VIRTUAL_ENV" not in env
    assert env["IMAGE_GREETING"] == "mine"  # the job's --env wins over the image's ENV
    assert env["PYTHONPATH"].split(":")[-1] == images.RUNTIME and "LD_LIBRARY_PATH" not in env
    assert images.activate(order, {}, gpus=True)["LD_LIBRARY_PATH"] == images.RUNTIME + "-driver"


def test_a_gpu_worker_gets_the_hosts_driver_libraries(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "libcuda.so.1").write_bytes(b"")
    (second / "libnvidia-ml.so.1").write_bytes(b"")
    (second / "libcudart.so.12").write_bytes(b"")  # the CUDA runtime is the image's own
    assert images.driver_libraries((str(first), str(second))) == [
        ("libcuda.so.1", str(first / "libcuda.so.1")), ("libnvidia-ml.so.1", str(second / "libnvidia-ml.so.1"))]


@pytest.mark.parametrize("last", [entry("out/victim"), entry("out/.wh.victim"), entry("out/.wh..wh..opq")],
                         ids=["a-file-over-it", "a-whiteout", "an-opaque-folder"])
def test_nothing_outside_the_image_is_removed_through_a_link(tmp_path, last):
    """An earlier layer's link to a folder outside; a later member under it must not make
    root remove what the link points at (checked before anything is replaced or whited out)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    archive = archive_of(tmp_path, entry("out", tarfile.SYMTYPE, link=str(outside)), last, entry(".wh..."))
    dest = tmp_path / "root"
    dest.mkdir()
    with pytest.raises(ValueError, match="points outside the image"):
        images.unpack(archive, dest)
    assert (outside / "victim").read_text() == "keep me"


def test_a_whiteout_of_dot_dot_removes_nothing(tmp_path):
    archive = archive_of(tmp_path, entry("a/file"), entry("a/.wh..."), entry(".wh..."))
    dest = tmp_path / "root"
    dest.mkdir()
    images.unpack(archive, dest)
    assert (dest / "a" / "file").is_file() and dest.is_dir() and (tmp_path / "bad.tar").is_file()
