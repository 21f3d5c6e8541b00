"""Root touching what a job may change: no link followed, even one swapped in meanwhile."""

import os
import threading

import pytest

from deeppod import nofollow

ROOT = os.geteuid() == 0


def test_a_folder_with_a_link_in_its_path_is_not_opened(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.close(nofollow.open_dir(tmp_path / "real"))
    with pytest.raises(OSError):
        nofollow.open_dir(tmp_path / "link")
    (tmp_path / "real" / "sub").mkdir()
    with pytest.raises(OSError):
        nofollow.open_dir(tmp_path / "link" / "sub")


def test_a_small_file_is_read_only_when_it_is_a_regular_file_within_the_limit(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("server's")
    (tmp_path / "ok.json").write_text("{}")
    os.symlink(secret, tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "big.json").write_bytes(b"x" * 101)
    assert nofollow.read_small(tmp_path / "ok.json", 100) == b"{}"
    for name in ("link.json", "fifo.json", "big.json", "missing.json"):
        assert nofollow.read_small(tmp_path / name, 100) is None, name


def test_tree_bytes_counts_what_is_stored_not_what_links_point_at_nor_sparse_holes(tmp_path):
    big = tmp_path / "outside"
    big.write_bytes(os.urandom(1 << 20))
    job = tmp_path / "job"
    (job / "a").mkdir(parents=True)
    (job / "a" / "data").write_bytes(os.urandom(256 << 10))
    os.symlink(big, job / "link")
    os.symlink(tmp_path, job / "dirlink")
    with open(job / "sparse", "wb") as f:
        f.truncate(1 << 30)
    got = nofollow.tree_bytes(job)
    assert 256 << 10 <= got < 512 << 10
    assert nofollow.tree_bytes(tmp_path / "nothing") == 0


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_chown_tree_gives_links_not_their_targets(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("root's")
    tree = tmp_path / "code"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "m.py").write_text("")
    os.symlink(outside / "f", tree / "flink")
    os.symlink(outside, tree / "dlink")
    nofollow.chown_tree(tree, 65534, 65534)
    assert {p.lstat().st_uid for p in [tree, tree / "pkg", tree / "pkg" / "m.py", tree / "flink", tree / "dlink"]} \
        == {65534}
    assert (outside / "f").stat().st_uid == 0 and outside.stat().st_uid == 0


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_chown_tree_does_not_follow_a_folder_swapped_for_a_link_while_it_walks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(50):
        (outside / f"f{i}").write_text("root's")
    tree = tmp_path / "code"
    for i in range(200):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "x").write_text("")
    stop = threading.Event()

    def swap():  # what a job of the tenant could do while the server works on its folder
        while not stop.is_set():
            for i in range(200):
                d = tree / f"d{i}"
                try:
                    os.rename(d, tree / f".old{i}")
                    os.symlink(outside, d)
                    os.unlink(d)
                    os.rename(tree / f".old{i}", d)
                except OSError:
                    pass
    t = threading.Thread(target=swap)
    t.start()
    try:
        for _ in range(20):
            try:
                nofollow.chown_tree(tree, 65534, 65534)
            except OSError:  # a folder vanished under it: refused, not followed
                pass
            for uid in (0, 65534):
                os.chown(tree, uid, uid)
    finally:
        stop.set()
        t.join()
    assert outside.stat().st_uid == 0
    assert all((outside / f"f{i}").stat().st_uid == 0 for i in range(50))
