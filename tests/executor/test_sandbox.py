"""The worker sandbox, for real: namespaces, another OS identity, only the binds it was given.
Needs root (CI runs as root); skipped where the server could not isolate either."""

import os
import signal
import subprocess
import sys
import time

import pytest

from deeppod.executor import cgroups, sandbox

pytestmark = pytest.mark.skipif(sandbox.supported() is not None, reason=str(sandbox.supported()))
NOBODY = 65534
PYTHON = sorted({sys.prefix, sys.base_prefix, *[p for p in sys.path if p and os.path.isdir(p)]})


def spec(work, uid=NOBODY, binds=(), limits=None):
    out = {"uid": uid, "gid": uid, "workdir": str(work), "python": PYTHON,
           "binds": [[str(work), str(work), True], *binds]}
    if limits is not None:
        out["limits"] = limits
    return out


def workdir(tmp_path, name="work"):
    d = tmp_path / name
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


def in_sandbox(tmp_path, code: str, **kw):
    """Run ``code`` in a sandbox through the module's command line, as the supervisor does."""
    work = workdir(tmp_path)
    job = tmp_path / "job"
    job.mkdir()
    (job / "spec.json").write_text(__import__("json").dumps({
        "command": [sys.executable, "-c", code], "sandbox": spec(work, **kw),
        "workers": [{"rank": 0, "env": {"PATH": "/usr/bin:/bin"}}]}))
    return subprocess.Popen([sys.executable, "-m", "deeppod.executor.sandbox", str(job), "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_it_runs_as_the_given_identity_and_sees_only_its_binds(tmp_path):
    secret = tmp_path / "server-home"
    secret.mkdir()
    (secret / "admin.token").write_text("dp_admin")
    p = in_sandbox(tmp_path, f"""
import os
print(os.getuid(), os.getgid(), os.getgroups())
print(sorted(int(x) for x in os.listdir('/proc') if x.isdigit()))
print(os.path.exists({str(secret)!r}), os.path.exists({str(tmp_path / 'job' / 'spec.json')!r}))
open('written', 'w').write('ok')
print(len(open('/dev/urandom', 'rb').read(8)), open('/dev/null', 'w').write('x'))
""")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    uid, procs, seen = out.splitlines()[:3]
    assert uid == f"{NOBODY} {NOBODY} []"
    assert procs == "[1, 2]"  # its init and itself: no other process on the host is visible
    assert seen == "False False"  # the server's home, its job spec (and all not bound) are not there
    assert out.splitlines()[3] == "8 1"  # its devices work (torch reads /dev/urandom at import)
    assert (tmp_path / "work" / "written").stat().st_uid == NOBODY


def test_sigterm_reaches_the_command_and_its_exit_code_comes_back(tmp_path):
    p = in_sandbox(tmp_path, """
import os, signal, sys, time
# os.write, not print: the signal may land while print('ready') is still flushing, and a
# second print in the handler would then raise "reentrant call"
signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'checkpointed\\n'), sys.exit(75)))
print('ready', flush=True)
time.sleep(60)
""")
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 75 and "checkpointed" in out


def test_a_command_killed_by_a_signal_is_reported_as_killed(tmp_path):
    p = in_sandbox(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL


def test_it_cannot_signal_processes_outside_or_read_another_sandboxes_folder(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    other = workdir(tmp_path, "other-tenant")
    (other / "checkpoint.pt").write_text("weights")
    os.chmod(other, 0o700)
    try:
        p = in_sandbox(tmp_path, f"""
import os
try:
    os.kill({victim.pid}, 9); print('killed')
except ProcessLookupError:
    print('no such process')
print(os.path.exists({str(other)!r}))
""", uid=NOBODY - 1)
        out, _ = p.communicate(timeout=60)
        assert out.split() == ["no", "such", "process", "False"], out
        time.sleep(0.2)
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_a_missing_workdir_says_so(tmp_path):
    p = in_sandbox(tmp_path, "print(1)", binds=())
    os.rmdir(tmp_path / "work")
    out, _ = p.communicate(timeout=30)
    assert p.returncode in (126, 127) and "deeppod sandbox: cannot" in out


def test_a_writable_folder_reached_through_a_link_is_not_bound(tmp_path):
    """A tenant's earlier job made a part of a later job's folder a link to another's folder:
    the sandbox refuses to start rather than bind what the link points at."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "theirs").write_text("another tenant's")
    os.symlink(victim, tmp_path / "mine")
    (tmp_path / "again").mkdir()
    p = in_sandbox(tmp_path, "import os; print(os.listdir('/x'))", binds=[[str(tmp_path / "mine"), "/x", True]])
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 126 and "without following a link" in out and "theirs" not in out
    os.unlink(tmp_path / "mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "own").write_text("")
    p = in_sandbox(tmp_path / "again", "import os; print(os.listdir('/x'))", binds=[[str(tmp_path / "mine"), "/x",
                                                                                     True]])
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and "['own']" in out, out


needs_cgroups = pytest.mark.skipif(cgroups.check() is not None, reason=f"no usable cgroups: {cgroups.check()}")


@needs_cgroups
@pytest.mark.parametrize("how", ["itself", "a setsid child", "its /dev/shm", "its /tmp"])
def test_the_kernel_holds_a_worker_to_its_memory_limit(tmp_path, how):
    """128 MiB, and a worker that takes 512 MiB: in its own memory, in a child that left its
    session, or as files in its tmpfs folders. It is killed (or refused) at the limit."""
    take = {
        "itself": "x = bytearray(512 << 20)\nx[::4096] = b'1' * len(x[::4096])",
        "a setsid child": "import subprocess, sys\n"
                          "c = subprocess.Popen([sys.executable, '-c', 'import os; os.setsid(); "
                          "x = bytearray(512 << 20); x[::4096] = b\"1\" * len(x[::4096])'])\n"
                          "sys.exit(0 if c.wait() == 0 else 3)",
        "its /dev/shm": "open('/dev/shm/fill', 'wb').write(b'1' * (512 << 20))",
        "its /tmp": "open('/tmp/fill', 'wb').write(b'1' * (512 << 20))",
    }[how]
    p = in_sandbox(tmp_path, take + "\nprint('took 512 MiB')", limits={"memory_mb": 128, "pids": 256})
    out, _ = p.communicate(timeout=120)
    assert p.returncode != 0 and "took 512 MiB" not in out, (how, p.returncode, out)
    assert (tmp_path / "job" / "exit" / "oom-0").read_text() == "128"  # what the supervisor reports
    assert not list(cgroups.ROOT.rglob(f"deeppod-{p.pid}-0")), "its control group was left behind"


@needs_cgroups
def test_a_fork_bomb_stops_at_the_workers_process_limit(tmp_path):
    p = in_sandbox(tmp_path, """
import subprocess
started = []
try:
    for _ in range(300):
        started.append(subprocess.Popen(['sleep', '30']))
except OSError as exc:
    print('refused after', len(started), type(exc).__name__)
for c in started:
    c.kill()
""", limits={"memory_mb": None, "pids": 64})
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and "refused after" in out, out
    assert int(out.split("refused after")[1].split()[0]) < 64


def test_a_worker_sees_only_its_own_gpus_device_nodes():
    """Checked on a fake /dev listing (no GPU here): the control devices and its GPUs' nodes."""
    host = ["null", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
            "nvidia-modeset", "nvidia-caps", "nvme0n1"]
    assert sandbox.gpu_devices(host, "1,3") == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia1",
                                                "nvidia3", "nvidiactl"]
    assert sandbox.gpu_devices(host, "") == []  # a CPU worker: no GPU device at all
    assert sandbox.gpu_devices(host, "2") == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia2",
                                              "nvidiactl"]
    # a warm spare runs the job's code before it is a worker: it holds no GPU (issue 70), and a worker
    # given real GPUs does not start from one; logical GPU slots have no device nodes to hold
    spare = {"DEEPPOD_SPARE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert sandbox._visible(spare) == "" and sandbox.gpu_devices(host, sandbox._visible(spare)) == []
    assert not sandbox.spare_may_become({"CUDA_VISIBLE_DEVICES": "1"}, host)
    assert sandbox.spare_may_become({"CUDA_VISIBLE_DEVICES": "1"}, ["null", "zero"])  # logical slots
    assert sandbox.spare_may_become({"CUDA_VISIBLE_DEVICES": ""}, host)  # a CPU worker


def test_the_sandbox_binds_only_the_gpu_nodes_it_is_given(tmp_path):
    p = in_sandbox(tmp_path, "import os; print(sorted(d for d in os.listdir('/dev') if d.startswith('nvidia')))")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and out.strip().splitlines()[-1] == "[]", out  # its env names no GPU


@needs_cgroups
def test_a_workers_private_tmpfs_folders_are_no_larger_than_its_memory(tmp_path):
    p = in_sandbox(tmp_path, "import os\nfor d in ('/tmp', '/dev/shm'):\n    s = os.statvfs(d)\n"
                             "    print(d, s.f_blocks * s.f_frsize >> 20)", limits={"memory_mb": 96, "pids": 64})
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "/tmp 96" in out and "/dev/shm 96" in out, out


@needs_cgroups
def test_the_memory_limit_is_the_one_asked_for_within_five_percent(tmp_path):
    """256 MiB: a worker holding 90% of it runs to the end; one reaching 105% is killed."""
    hold = "x = bytearray({n} << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('held', {n})"
    for n, survives in ((230, True), (269, False)):
        (tmp_path / str(n)).mkdir()
        p = in_sandbox(tmp_path / str(n), hold.format(n=n), limits={"memory_mb": 256, "pids": 64})
        out, _ = p.communicate(timeout=120)
        assert (p.returncode == 0 and f"held {n}" in out) == survives, (n, p.returncode, out)
