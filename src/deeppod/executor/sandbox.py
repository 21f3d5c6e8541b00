"""Run one worker in a sandbox as its tenant's OS identity:
``python -m deeppod.executor.sandbox JOB_DIR RANK`` (started as root by the supervisor).

The worker gets a PID namespace of its own (other jobs' processes are invisible and cannot
be signalled), an IPC namespace, and a mount namespace whose root is a fresh tmpfs holding
only: the system's programs and libraries read-only (/usr, /etc, ...), the Python
environment read-only, the binds the job was given (its workdir and job folders read-write,
its datasets read-only), a private /tmp, a /dev/shm shared only by the job's workers on this
node, and a minimal /dev. Then it drops to
the tenant's uid and gid with no supplementary groups, no capabilities and no_new_privs.

Three processes: this one (outside, what the supervisor signals and waits for), an init
(PID 1 inside: builds the mounts, forwards signals, reaps) and the command (PID 2, the
tenant's identity). SIGTERM and SIGINT reach the command; the command's exit code, or the
signal that killed it, is this process's.

Standard library only (the system calls Python 3.11 lacks are in syscalls.py).
"""

from __future__ import annotations

import functools
import os
import signal
import stat
import sys
from dataclasses import replace
from pathlib import Path

from deeppod.contract import ENV_SPARE
from deeppod.envs import build as envs
from deeppod.envs import images
from deeppod.executor import cgroups
from deeppod.executor.syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    mount,
    prctl,
    setns,
    unshare,
)
from deeppod.job_folder import JobFolder
from deeppod.nofollow import open_dir

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
# what every sandbox sees of the host, read-only
SYSTEM = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

def supported() -> str | None:
    """None when this process can build sandboxes (root, namespaces allowed); else why not."""
    if os.geteuid() != 0:
        return "the server does not run as root, so it cannot switch jobs to other OS identities"
    return _namespaces()


@functools.cache
def _namespaces() -> str | None:
    """Whether a child can enter new mount, PID and IPC namespaces (a fork: asked once a process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # try in a child: namespaces, once entered, cannot be left
        os.close(r)
        try:
            unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            os.write(w, b"ok")
        except OSError as exc:
            os.write(w, str(exc).encode())
        os._exit(0)
    os.close(w)
    said = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return None if said == "ok" else f"namespaces are not available here ({said})"


def _bind(src: str, dst: str, writable: bool, device: bool = False) -> None:
    """Mount ``src`` on ``dst`` in the sandbox. A writable folder is the job's (its tenant's
    files, which its earlier jobs could change): opened with no link followed in its path and
    mounted through that descriptor, so a link planted there cannot make it another folder."""
    fd = None
    if writable and not device:
        try:
            fd = open_dir(src, flags=os.O_PATH)
        except OSError as exc:
            raise OSError(exc.errno, f"{src} cannot be opened as a folder without following a link "
                                     f"({exc.strerror})") from None
        os.makedirs(dst, exist_ok=True)
    elif os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    try:
        mount(src if fd is None else f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
    finally:
        if fd is not None:
            os.close(fd)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if device else MS_NODEV) | (0 if writable else MS_RDONLY)
    mount(None, dst, None, flags)


NVIDIA_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def gpu_devices(listing: list[str], visible: str) -> list[str]:
    """Of the host's /dev entries, the NVIDIA ones a worker given GPUs ``visible`` (its
    CUDA_VISIBLE_DEVICES: NVML indices, PCI bus order) may open: the driver's control devices
    and its own GPUs' nodes. None at all for a worker without GPUs (a warm spare among them);
    never another job's GPU."""
    mine = {f"nvidia{i.strip()}" for i in visible.split(",") if i.strip().isdigit()}
    if not mine:
        return []
    return sorted(d for d in listing if d in mine or d in NVIDIA_CONTROL)


def spare_may_become(env: dict[str, str], listing: list[str]) -> bool:
    """A warm spare (no GPU) may become this worker unless it was given GPU device nodes here."""
    return not gpu_devices(listing, env.get("CUDA_VISIBLE_DEVICES", ""))


def allowed_devices(visible: str) -> list[str]:
    """The /dev entries a worker's sandbox holds (and, on cgroup v1, the only ones it may open)."""
    return list(DEVICES) + gpu_devices(os.listdir("/dev"), visible)


# its own terminals (the devpts instance mounted in its /dev): the multiplexer, and the Unix98
# pty majors its ptys get
PTYS = (("c", 5, 2), *(("c", major, -1) for major in range(136, 144)))


def _device_numbers(names: list[str]) -> tuple[tuple[str, int, int], ...]:
    found = []
    for name in names:
        try:
            st = os.stat("/dev/" + name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            found.append(("c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev), os.minor(st.st_rdev)))
    return tuple(found)


def _visible(env: dict[str, str]) -> str:
    """A warm spare holds no GPU: it runs the job's code before it has a rank (supervisor.py)."""
    return "" if env.get(ENV_SPARE) else env.get("CUDA_VISIBLE_DEVICES", "")


def _build_root(root: str, sb: dict, visible: str = "") -> None:
    """The sandbox's file system under ``root`` (in this process's own mount namespace)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    if sb.get("image"):
        _image_root(root, sb["image"], visible)
    else:
        for path in SYSTEM:
            if os.path.islink(path):
                os.symlink(os.readlink(path), root + path)
            elif os.path.isdir(path):
                _bind(path, root + path, False)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's only
    os.makedirs(root + "/dev", exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for dev in allowed_devices(visible):  # its own GPUs only
        if os.path.exists("/dev/" + dev) and not os.path.isdir("/dev/" + dev):
            _bind("/dev/" + dev, f"{root}/dev/{dev}", True, device=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{root}/dev/{name}")
    # terminals of its own (a notebook's, a shell's): a devpts instance of this sandbox alone, so
    # its ptys are not the host's and no other job's are in it
    os.makedirs(root + "/dev/pts")
    mount("devpts", root + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    memory_mb = (sb.get("limits") or {}).get("memory_mb")
    size = f",size={memory_mb}m" if memory_mb else ""  # and their pages are charged to its memory limit
    for tmp in ("/tmp", "/dev/shm"):  # private: PyTorch's DataLoader shares tensors through /dev/shm
        os.makedirs(root + tmp, exist_ok=True)
        mount("tmpfs", root + tmp, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" + size)
    if sb.get("shm"):  # the job's workers on this node share one (NCCL's intra-node transport needs it)
        _bind(sb["shm"], root + "/dev/shm", True)
    # last, so that a bind under /tmp (a workdir there) lands on top of the private /tmp
    for path in [] if sb.get("image") else sb.get("python", []):
        if os.path.exists(path):
            _bind(path, root + path, False)
    for src, dst, writable in sb.get("binds", []):
        _bind(src, root + dst, bool(writable))
    if sb.get("image"):  # every mount point is made: the image's files become read-only
        mount(None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _image_root(root: str, image: str, visible: str) -> None:
    """A container image's root file system as the sandbox's root: the image read-only under
    an overlay whose upper layer (on the tmpfs at ``root``) only holds the mount points made
    next; the host's DNS files; deeppod.runtime; the NVIDIA driver's libraries for a worker
    with GPUs."""
    os.makedirs(root + "/.layer/upper")
    os.makedirs(root + "/.layer/work")
    mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV,
          f"lowerdir={image},upperdir={root}/.layer/upper,workdir={root}/.layer/work")
    for name in images.HOST_FILES:
        if os.path.isfile("/" + name):
            _bind("/" + name, f"{root}/{name}", False)
    _bind(str(Path(images.__file__).resolve().parents[1]), f"{root}{images.RUNTIME}/deeppod", False)
    if gpu_devices(os.listdir("/dev"), visible):
        for name, path in images.driver_libraries():
            _bind(path, f"{root}{images.RUNTIME}-driver/{name}", False)


def _command(sb: dict, command: list[str], env: dict[str, str]) -> None:
    """In the sandbox, as the tenant: never returns."""
    step = "switch to the tenant's identity"
    try:
        os.setgroups([])
        os.setgid(int(sb["gid"]))
        os.setuid(int(sb["uid"]))  # from root to another uid: every capability goes
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        step = f"enter the working directory {sb['workdir']}"
        os.chdir(sb["workdir"])
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        step = f"start {command[0]!r}"
        os.execvpe(command[0], command, env)
    except OSError as exc:
        sys.stderr.write(f"deeppod sandbox: cannot {step}: {exc.strerror}\n")
    os._exit(127)


def _init(sb: dict, command: list[str], env: dict[str, str], root: str, report: int) -> None:
    """PID 1 of the sandbox: build it, start the command, pass signals on, reap; never returns."""
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the outside process died: so do we, and the namespace
        unshare(CLONE_NEWNS | CLONE_NEWIPC)
        _build_root(root, sb, _visible(env))
        os.chroot(root)
        os.chdir("/")
    except OSError as exc:
        sys.stderr.write(f"deeppod sandbox: cannot build the sandbox: {exc}\n")
        os.write(report, b"exit 126")
        os._exit(0)
    child = os.fork()
    if child == 0:
        _command(sb, command, env)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    status = None
    while status is None:
        try:
            pid, st = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            status = st
    if status is None:
        os.write(report, b"exit 1")
    elif os.WIFSIGNALED(status):
        os.write(report, f"signal {os.WTERMSIG(status)}".encode())
    else:
        os.write(report, f"exit {os.WEXITSTATUS(status)}".encode())
    os._exit(0)  # the kernel now kills whatever the command left in the namespace


def run(sb: dict, command: list[str], env: dict[str, str], root: str, group: cgroups.Group | None = None,
        netns: int | None = None) -> int:
    """Run ``command`` in a sandbox described by ``sb`` (uid, gid, workdir, python, binds);
    return its exit code, or -N if signal N killed it. ``root``: an empty folder of the
    server's that the sandbox's root is mounted on (only inside its own mount namespace, so
    nothing is left on the host, whatever kills it). ``group``: the control group the
    sandbox's first process is moved into before it does anything (its limits). ``netns``: a
    descriptor of the job's own network namespace (executor/netns.py) it runs in."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        if netns is not None:
            setns(netns)
            os.close(netns)
        unshare(CLONE_NEWPID)  # only our children enter it: the next fork is its PID 1
        init = os.fork()
        if init == 0:
            os.close(r)
            os.close(go_w)
            os.read(go_r, 1)  # in its control group first: everything it starts is limited
            os.close(go_r)
            _init(sb, command, env, root, w)
        os.close(w)
        os.close(go_r)
        try:
            if group is not None:
                group.add(init)
        except OSError:
            os.kill(init, signal.SIGKILL)
            os.waitpid(init, 0)
            raise
        finally:
            os.close(go_w)  # go (or, killed, nothing more to do)
        for sig in FORWARDED:
            signal.signal(sig, lambda s, _f: os.kill(init, s))
        os.waitpid(init, 0)
        said = os.read(r, 64).decode().split()
    finally:
        os.close(r)
    if said and said[0] == "signal":
        return -int(said[1])
    return int(said[1]) if len(said) == 2 else 1


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: python -m deeppod.executor.sandbox JOB_DIR RANK|spare-N [NETNS_FD]", file=sys.stderr)
        return 2
    netns = int(argv[3]) if len(argv) == 4 else None  # the job's own network, a descriptor the supervisor passed
    folder = JobFolder(Path(argv[1]))
    spec = folder.read_spec()
    if argv[2].startswith("spare-"):  # a warm spare (runtime/spare.py): its env until it is handed a rank's
        name = f"spare-{int(argv[2][6:])}"
        env = spec["spares"][name[6:]]
    else:
        name = str(int(argv[2]))
        env = next(w for w in spec["workers"] if int(w["rank"]) == int(argv[2]))["env"]
    if (spec.get("env") or {}).get("image"):  # a container image (envs/images.py), unpacked by the supervisor
        spec["sandbox"]["image"] = str(images.image_path(spec["env"]))
        env = images.activate(spec["env"], env, bool(gpu_devices(os.listdir("/dev"), _visible(env))))
    elif spec.get("env"):  # its own Python environment (envs/), built by the supervisor: read-only, first on PATH
        spec["sandbox"]["python"] = [*spec["sandbox"]["python"], str(envs.env_path(spec["env"]))]
        env = envs.activate(spec["env"], env)
    root = folder.sandbox_root(name)
    root.mkdir(mode=0o700, exist_ok=True)
    if (spec["sandbox"].get("network") or {}).get("mode", "host") != "host" and netns is None:
        print("deeppod sandbox: the job asks for its own network and none was given", file=sys.stderr)
        return 126
    limits = spec["sandbox"].get("limits")  # set when the server enforces them (the host's cgroups)
    group = None
    if limits is not None:
        held = replace(cgroups.Limits.from_spec(limits), devices=_device_numbers(allowed_devices(_visible(env))) + PTYS)
        try:
            group = cgroups.create(cgroups.worker_name(name), held)
        except cgroups.Unavailable as exc:
            print(f"deeppod sandbox: cannot enforce the job's memory, process and CPU limits: {exc}", file=sys.stderr)
            return 126
    try:
        code = run(spec["sandbox"], spec["command"], env, str(root), group, netns)
    finally:
        if group is not None:
            if group.out_of_memory():
                folder.record_oom(name, limits.get("memory_mb"))
            group.remove()
    if code < 0:  # die the way the command died, so the supervisor reports the signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
