"""A worker's control group, for real (root, the host's cgroups): CPU weight and quota, the
devices it may open (v1), and nothing left behind. Skipped where groups cannot be made."""

import os

import pytest

from deeppod.executor import cgroups

pytestmark = pytest.mark.skipif(cgroups.check() is not None, reason=f"no usable cgroups: {cgroups.check()}")


def _in_group(group: cgroups.Group, code: str) -> int:
    """Run ``code`` (a Python body, exit code = result) in a child moved into ``group`` first."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        try:
            exec(code, {})
        except SystemExit as exc:
            os._exit(int(exc.code or 0))
        except BaseException:
            os._exit(99)
        os._exit(0)
    os.close(r)
    group.add(pid)
    os.close(w)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.slow  # it starts processes
def test_cpu_weight_and_quota_follow_the_workers_cpus():
    g = cgroups.create(f"deeppod-test-{os.getpid()}-cpu", cgroups.Limits(cpus=0.5, cpu_quota=True, pids=64))
    try:
        if g.v2:
            folder = g.folders[0]
            assert (folder / "cpu.weight").read_text().strip() == "50"
            assert (folder / "cpu.max").read_text().split() == ["50000", "100000"]
        else:
            cpu = next(f for f in g.folders if f.parts[4] == "cpu")
            assert (cpu / "cpu.shares").read_text().strip() == "512"
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        # the kernel holds it: a busy second of wall time gets about half a CPU second, never more
        used = _in_group(g, """
import os, time, sys
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < 1.0:
    pass
sys.exit(int(100 * (time.process_time() - c0) / (time.monotonic() - t0)))
""")
        assert used <= 60, f"{used}% of a CPU under a 50% quota"
    finally:
        g.remove()
    assert not any(f.exists() for f in g.folders)


def test_share_only_leaves_the_cpu_uncapped():
    g = cgroups.create(f"deeppod-test-{os.getpid()}-share", cgroups.Limits(cpus=2.0, pids=64))
    try:
        if g.v2:
            assert (g.folders[0] / "cpu.max").read_text().split()[0] == "max"
        else:
            cpu = next(f for f in g.folders if f.parts[4] == "cpu")
            assert (cpu / "cpu.shares").read_text().strip() == "2048"
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "-1"
    finally:
        g.remove()


@pytest.mark.skipif(cgroups.unified(), reason="cgroup v2 has no devices controller (eBPF); the sandbox's /dev holds "
                                             "only its devices")
@pytest.mark.slow  # it starts processes
def test_a_worker_opens_only_the_devices_it_was_given():
    null = os.stat("/dev/null").st_rdev
    g = cgroups.create(f"deeppod-test-{os.getpid()}-dev",
                       cgroups.Limits(pids=64, devices=(("c", os.major(null), os.minor(null)),)))
    try:
        assert _in_group(g, "open('/dev/null', 'wb').write(b'x')") == 0
        assert _in_group(g, """
import sys
try:
    open('/dev/zero', 'rb').read(1)
except PermissionError:
    sys.exit(7)
""") == 7  # the node exists here, on the host: the kernel refuses it anyway
    finally:
        g.remove()


def test_a_group_that_cannot_be_made_leaves_nothing(monkeypatch):
    """The cpu limit cannot be written: the memory and pids folders made before it go too."""
    name = f"deeppod-test-{os.getpid()}-half"
    real_write = cgroups.Path.write_text

    def refuse_cpu(self, *a, **kw):
        if self.name.startswith("cpu."):
            raise PermissionError(13, "refused")
        return real_write(self, *a, **kw)
    monkeypatch.setattr(cgroups.Path, "write_text", refuse_cpu)
    with pytest.raises(cgroups.Unavailable):
        cgroups.create(name, cgroups.Limits(memory_mb=64, cpus=1.0))
    monkeypatch.undo()
    assert not list(cgroups.ROOT.rglob(name))


@pytest.mark.slow  # it starts processes
def test_a_group_left_by_a_killed_sandbox_is_swept_and_never_collides():
    """A sandbox killed before its clean-up leaves its group; its PID comes round again. The
    next group made beside it removes it (its owner is gone), keeps a live owner's, and the
    names never repeat."""
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    limits = cgroups.Limits(memory_mb=64)
    left = cgroups.create(f"deeppod-{dead}-0-abcdef", limits)
    live = cgroups.create(f"deeppod-{os.getpid()}-0-abcdef", limits)
    assert cgroups.worker_name("0") != cgroups.worker_name("0")
    fresh = cgroups.create(cgroups.worker_name("0"), limits)
    try:
        assert not left.memory.exists()
        assert live.memory.exists() and fresh.memory.exists()
    finally:
        for g in (left, live, fresh):
            g.remove()
