"""rootless.enter: a job's identity enters its container image without root (a task on Slurm):
the image read-only, the host's files out of sight, its own folders writable, a link planted in
them not followed."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from deeppod.envs import images
from deeppod.executor import rootless
from deeppod.executor.syscalls import prctl
from tests.helpers import image_archive

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="runs as another identity: needs root"),
              pytest.mark.slow]  # it forks to run as it
JOB = 65534
PR_SET_DUMPABLE = 4
LOOK = ("cat /etc/image-release; echo uid=$(id -u); ls /usr/lib/python3* 2>/dev/null || echo no-host-python; "
        "touch /etc/mine 2>/dev/null || echo image-read-only; touch out && echo workdir-writable; "
        "cat /data/shard; touch /data/x 2>/dev/null || echo data-read-only; touch /tmp/t && echo tmp-writable; "
        "ls /.deeppod/deeppod/runtime >/dev/null && echo runtime-there")


@pytest.fixture(scope="module")
def place():
    """An unpacked image and the job's folders, where the job's identity can reach them."""
    where = Path(tempfile.mkdtemp(prefix="deeppod-rootless-"))
    where.chmod(0o711)
    old = os.umask(0o022)
    try:
        root = where / "image"
        root.mkdir()
        images.unpack(image_archive(where, "tiny"), root)
        for name in images.HOST_FILES:
            (root / name).touch()
        (where / "work").mkdir()
        os.chown(where / "work", JOB, JOB)
        (where / "data").mkdir()
        (where / "data" / "shard").write_text("shard-read\n")
        # the site's deeppod, which the job's identity reads (this checkout's may be in a private folder)
        shutil.copytree(rootless.PACKAGE, where / "site" / "deeppod", ignore=shutil.ignore_patterns("__pycache__"))
    finally:
        os.umask(old)
    package, rootless.PACKAGE = rootless.PACKAGE, str(where / "site" / "deeppod")
    yield where
    rootless.PACKAGE = package
    shutil.rmtree(where, ignore_errors=True)


def run_in(image: Path, binds: list, workdir: str, script: str) -> tuple[int, str]:
    """``sh -c script`` in the image, as the job's identity: (exit status, output)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.setgroups([])
            os.setresgid(JOB, JOB, JOB)
            os.setresuid(JOB, JOB, JOB)
            prctl(PR_SET_DUMPABLE, 1)  # as a process the job's identity started is (a uid change cleared it)
            rootless.enter(str(image), binds, workdir, False)
            os.execvpe("sh", ["sh", "-c", script], {"PATH": "/bin"})
        except OSError as exc:
            os.write(2, f"enter: {exc}\n".encode())
        os._exit(126)
    os.close(w)
    with os.fdopen(r) as out:
        text = out.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text


def test_the_job_runs_on_the_images_files_as_itself_with_its_folders_bound_in(place):
    work = str(place / "work")
    code, out = run_in(place / "image", [[work, work, True], [str(place / "data"), "/data", False]], work, LOOK)
    assert code == 0, out
    for word in ("v2\n", f"uid={JOB}", "no-host-python", "image-read-only", "workdir-writable", "shard-read",
                 "data-read-only", "tmp-writable", "runtime-there"):
        assert word in out, out
    assert (place / "work" / "out").stat().st_uid == JOB  # its own files, as itself outside too
    assert not (place / "image" / "etc" / "mine").exists()


def test_a_link_planted_in_the_jobs_folder_is_not_followed(place):
    trap = place / "trap"
    trap.mkdir(exist_ok=True)
    os.chown(trap, JOB, JOB)
    (trap / "work").unlink(missing_ok=True)
    (trap / "work").symlink_to("/etc")  # the job's to change: it points its workdir at the host's /etc
    code, out = run_in(place / "image", [[str(trap / "work"), "/job", True]], "/", "ls /job")
    assert code == 126 and "cannot be opened as a folder without following a link" in out, out


def test_mount_points_and_the_folders_on_their_way():
    points = rootless.mount_points([["/srv/a/b", "/home/u/work", True], ["/d", "/data/digits", False]], gpus=False)
    assert points["/home/u/work"] == "/srv/a/b" and points["/tmp"] == "" and points["/proc"] == "/proc"
    assert f"{images.RUNTIME}/deeppod" in points
    assert {"/home", "/home/u", "/data", "/etc", images.RUNTIME} <= rootless.on_the_way(points)
    assert "/" not in rootless.on_the_way(points)
