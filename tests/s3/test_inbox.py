"""The inbox's files for keys S3 allows together: an object and a folder of keys of one name."""

from deeppod.s3 import inbox, metadata
from deeppod.s3.namespace import OBJECT, etag_path, inbox_path


def test_an_object_moves_into_the_folder_its_name_becomes_with_what_is_kept_beside_it(tmp_path):
    root = tmp_path / "inbox"
    obj = root / "cats" / "a"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"the object")
    etag_path(obj).write_text("abc")  # beside it, where the file system keeps no xattrs
    metadata.sidecar(obj).write_text('{"content-type": "text/plain"}')
    assert inbox_path(root, "cats/a") == obj
    inbox._make_folders(root, root / "cats" / "a" / "b")
    moved = obj / OBJECT
    assert obj.is_dir() and (obj / "b").is_dir() and moved.read_bytes() == b"the object"
    assert etag_path(moved).read_text() == "abc" and metadata.read(moved) == {"content-type": "text/plain"}
    assert sorted(p.name for p in obj.parent.iterdir()) == ["a"]  # nothing left beside the folder
    assert inbox_path(root, "cats/a") == moved and inbox_path(root, "cats/a/") == obj / ".folder"
