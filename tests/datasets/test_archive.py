import stat
import tarfile
import zipfile

import pytest

from deeppod.datasets.archive import Archive, parse_labels, safe_path, strip_common_root
from deeppod.errors import InvalidRequest


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x.jpg", "a/../../x.jpg", "C:/x.jpg", "a\\..\\..\\x"])
def test_paths_that_leave_the_archive_are_refused(bad):
    with pytest.raises(InvalidRequest) as e:
        safe_path(bad)
    assert "archive entry" in str(e.value)


def test_normal_paths_are_normalised():
    assert safe_path("./cat//a.jpg") == "cat/a.jpg"
    assert safe_path("chat/été 1.jpg") == "chat/été 1.jpg"


@pytest.mark.parametrize("bad", ["cat/a\nb.jpg", "cat/\x1b[31m.jpg", "cat/a\x85.jpg", "cat/\x7f"])
def test_names_with_control_characters_are_refused(bad):
    """The same names as S3 keys (s3.namespace.request_key): a newline in a file's name would
    split it across the lines of every listing and log that shows it."""
    with pytest.raises(InvalidRequest) as e:
        safe_path(bad)
    assert "control character U+00" in str(e.value)


def _tar(tmp_path, add):
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        add(tar)
    return path


def test_tar_symlinks_and_hardlinks_are_refused(tmp_path):
    for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        def add(tar):
            info = tarfile.TarInfo("cat/evil.jpg")
            info.type, info.linkname = kind, "/etc/passwd"
            tar.addfile(info)
        with pytest.raises(InvalidRequest, match="link"):
            Archive(_tar(tmp_path, add))


def test_zip_slip_and_zip_symlinks_are_refused(tmp_path):
    path = tmp_path / "slip.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("../../evil.jpg", b"x")
    with pytest.raises(InvalidRequest, match="zip-slip"):
        Archive(path)
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("cat/link.jpg")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(InvalidRequest, match="symlink"):
        Archive(path)


def test_not_an_archive(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"hello" * 200)
    with pytest.raises(InvalidRequest, match="not a tar, tar.gz or zip"):
        Archive(path)


def test_common_root_is_stripped_only_when_it_holds_class_folders():
    assert strip_common_root(["digits/0/a.png", "digits/1/b.png"]) == "digits/"
    assert strip_common_root(["cat/a.png", "cat/b.png"]) == ""  # one class folder, not a wrapper
    assert strip_common_root(["data/labels.csv", "data/a.png"]) == "data/"


def test_labels_files():
    assert parse_labels("labels.csv", b"path,label\na.jpg,cat\nsub/b.jpg,dog\n") == {"a.jpg": "cat", "sub/b.jpg": "dog"}
    assert parse_labels("labels.csv", b"a.jpg,cat\n") == {"a.jpg": "cat"}
    assert parse_labels("labels.jsonl", b'{"path": "a.jpg", "label": 3}\n') == {"a.jpg": "3"}
    with pytest.raises(InvalidRequest, match="row 1 needs two columns"):
        parse_labels("labels.csv", b"a.jpg\n")
    with pytest.raises(InvalidRequest, match="line 1"):
        parse_labels("labels.jsonl", b"[1, 2]\n")
    with pytest.raises(InvalidRequest, match="zip-slip"):
        parse_labels("labels.csv", b"../a.jpg,cat\n")
