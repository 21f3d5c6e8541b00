"""A sandboxed job's /dev/shm (executor/job_shm.py), for real (root): a tmpfs of its own, sized,
owned by the job, resized on a grow and gone with the job; a link planted where it goes is
never followed (issue 70: spares of a --memory 256M job left 1,600 MiB in a host folder)."""

import errno
import os

import pytest

from deeppod.executor.job_shm import mount_shm, unmount_shm

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")

MiB = 1 << 20


def _fill(folder, size: int) -> int:
    """Write up to ``size`` bytes in ``folder``; what was written before it was full."""
    done = 0
    with open(os.path.join(folder, "data"), "wb") as f:
        try:
            while done < size:
                f.write(bytes(MiB))
                f.flush()
                done += MiB
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return done


def test_the_jobs_tmpfs_is_sized_owned_resized_and_gone_with_it(tmp_path):
    path = str(tmp_path / "deeppod-job-7")
    mount_shm(path, 4321, 4321, 8)
    try:
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, oct(st.st_mode)[-3:]) == (4321, 4321, "700")
        vfs = os.statvfs(path)
        assert vfs.f_blocks * vfs.f_frsize == 8 * MiB
        assert _fill(path, 32 * MiB) <= 8 * MiB  # no more than the job's memory, whoever writes
        mount_shm(path, 4321, 4321, 16)  # a grow: the same mount, larger, what it holds kept
        vfs = os.statvfs(path)
        assert vfs.f_blocks * vfs.f_frsize == 16 * MiB and os.path.exists(os.path.join(path, "data"))
    finally:
        unmount_shm(path)
    assert not os.path.ismount(path) and os.listdir(path) == []  # its pages went with it
    assert os.stat(path).st_uid == 0  # the mount point is root's: the job cannot swap it for a link
    unmount_shm(path)  # twice, or never mounted: nothing to do


def test_a_link_planted_where_the_tmpfs_goes_is_not_followed(tmp_path):
    target = tmp_path / "etc"
    target.mkdir()
    path = tmp_path / "deeppod-job-8"
    os.symlink(target, path)
    with pytest.raises(OSError) as e:
        mount_shm(str(path), 4321, 4321, 8)
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)  # O_NOFOLLOW with O_DIRECTORY says either
    assert not os.path.ismount(target) and target.stat().st_uid == 0
