"""posix_acl.grant_read: one identity may read a folder of the server's and cross to it; nobody
else may, and no link in it gives anything (the Slurm executor shares a job's datasets so)."""

import os

import pytest

from deeppod.posix_acl import grant_read, keep_private

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="reads as other identities: needs root"),
              pytest.mark.slow]  # it forks to read as them
GIVEN, OTHER = 65534, 65533


def as_identity(uid: int, act) -> bool:
    """Whether ``act()`` succeeds in a fork of this process that runs as ``uid`` (its group its own,
    no other)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            act()
            code = 0
        except OSError:
            pass
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1] == 0


def reads(uid: int, path) -> bool:
    return as_identity(uid, lambda: (path.read_bytes(), os.listdir(path.parent)))


def test_one_identity_reads_the_tree_and_crosses_to_it_and_nobody_else_does(tmp_path):
    server = tmp_path / "home" / "datasets"
    tree = server / "hot" / "digits-v1"
    (tree / "train" / "3").mkdir(parents=True)
    (tree / "train" / "3" / "a.png").write_bytes(b"png")
    (tree / "CHECKSUMS").write_text("x\n")
    secret = server / "secret"
    secret.write_text("the server's")
    (tree / "link").symlink_to(secret)
    for d in (tmp_path / "home", server, server / "hot", tree, tree / "train", tree / "train" / "3"):
        d.chmod(0o700)
    for f in (tree / "CHECKSUMS", tree / "train" / "3" / "a.png", secret):
        f.chmod(0o600)
    assert not reads(GIVEN, tree / "CHECKSUMS")
    grant_read(tree, GIVEN)
    assert reads(GIVEN, tree / "CHECKSUMS") and reads(GIVEN, tree / "train" / "3" / "a.png")
    assert not reads(OTHER, tree / "CHECKSUMS") and not reads(OTHER, tree / "train" / "3" / "a.png")
    assert not reads(GIVEN, secret) and not reads(GIVEN, tree / "link")  # a link gives nothing
    # the server's own bits stay as they were, and the identity may not write
    assert (tree / "CHECKSUMS").stat().st_mode & 0o077 == 0o040  # the mask shows in the group bits
    assert not as_identity(GIVEN, lambda: open(tree / "CHECKSUMS", "a").write("x"))
    grant_read(tree, GIVEN)  # again: the same
    assert reads(GIVEN, tree / "CHECKSUMS") and not reads(OTHER, tree / "CHECKSUMS")


def test_a_file_alone_is_given_as_a_folder_is(tmp_path):
    (tmp_path / "models").mkdir(mode=0o700)
    model = tmp_path / "models" / "model.pt"
    model.write_bytes(b"weights")
    model.chmod(0o600)
    grant_read(model, GIVEN)
    assert as_identity(GIVEN, model.read_bytes) and not as_identity(OTHER, model.read_bytes)


def test_a_folder_kept_private_again_keeps_the_way_it_gave(tmp_path):
    """The Slurm server makes its home's folders private at each start: a job reading its dataset
    through one must not lose it (chmod 0700 would set the ACL's mask to nothing)."""
    server = tmp_path / "datasets"
    (server / "v1").mkdir(parents=True, mode=0o700)
    server.chmod(0o700)  # as the server's first start left it
    (server / "v1" / "x").write_text("data")
    (server / "v1" / "x").chmod(0o600)
    (tmp_path / "other").mkdir(mode=0o755)
    grant_read(server / "v1", GIVEN)
    keep_private(server)
    keep_private(tmp_path / "other")
    assert as_identity(GIVEN, (server / "v1" / "x").read_bytes)
    assert not as_identity(OTHER, lambda: os.listdir(server)) and not as_identity(GIVEN, lambda: os.listdir(server))
    assert (tmp_path / "other").stat().st_mode & 0o777 == 0o700 and server.stat().st_mode & 0o007 == 0
