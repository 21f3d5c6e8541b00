"""Packing a folder to send with a job: deterministic, nothing that is not code, no link out."""

import io
import os
import tarfile

from deeppod.sdk.code import pack


def test_a_folder_packed_twice_is_the_same_archive_and_unpacks_to_its_files(tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "m.py").write_text("X = 1\n")
    os.chmod(src / "train.py", 0o755)
    for skipped in (".git", ".venv", "__pycache__", "outputs"):
        (src / skipped).mkdir()
        (src / skipped / "big").write_bytes(b"0" * 1000)
    (src / ".deeppodignore").write_text("# outputs are not code\noutputs\n*.ckpt\n")
    (src / "model.ckpt").write_bytes(b"w")
    (src / "inside").symlink_to("pkg/m.py")
    (src / "outside").symlink_to("/etc/passwd")
    a, b = pack(src), pack(src)
    assert a.digest == b.digest and a.data == b.data
    assert a.left_out == 1  # the link out of the folder
    with tarfile.open(fileobj=io.BytesIO(a.data), mode="r:gz") as tar:
        members = {m.name: m for m in tar}
        dest = tmp_path / "out"
        tar.extractall(dest, filter="data")
    assert sorted(members) == [".deeppodignore", "inside", "pkg/m.py", "train.py"]
    assert members["inside"].issym() and members["train.py"].uid == 0 and members["train.py"].uname == ""
    assert (dest / "inside").read_text() == "X = 1\n" and os.access(dest / "train.py", os.X_OK)
