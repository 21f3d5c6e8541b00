"""`deeppod shell` and `deeppod exec` as a user runs them, into a running job sandboxed as the
server's defaults make it (as root): the command runs as the job's identity, in its folder,
its PID namespace (it sees the job's processes only), its control group; its exit status is
the CLI's; another tenant is told the job does not exist. The shell is driven through a real
pseudo-terminal: its size follows the window's, Ctrl-C interrupts what runs in it, `exit 5`
ends the CLI with 5."""

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from deeppod import Client
from deeppod.executor import sandbox
from tests.helpers import LiveServer, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox.supported() is not None,
                                                   reason=str(sandbox.supported()))]

SLEEPER = "import os, time\nprint('rank', os.environ['RANK'], 'up', flush=True)\ntime.sleep(600)\n"


def _cli_env(server, token):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update(DEEPPOD_API_URL=server.url, DEEPPOD_TOKEN=token, DEEPPOD_CONFIG=str(server.home / "cli.json"))
    return env


def _exec(server, token, *args):
    return subprocess.run([sys.executable, "-m", "deeppod.cli", "exec", *args], env=_cli_env(server, token),
                          capture_output=True, text=True, timeout=60)


class Terminal:
    """The CLI under a pseudo-terminal of ours, as in a user's terminal window."""

    def __init__(self, argv, env, rows=30, cols=100):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(argv[0], argv, env)
        self.resize(rows, cols, signal_it=False)
        self.seen = b""

    def resize(self, rows, cols, signal_it=True):
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signal_it:
            os.kill(self.pid, signal.SIGWINCH)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern.encode(), self.seen)
            if found:
                self.seen = self.seen[found.end():]
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-2000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # the CLI ended
                    assert re.search(pattern.encode(), self.seen), f"ended without {pattern!r}: {self.seen!r}"

    def status(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(st)
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.seen += os.read(self.fd, 65536)
            except OSError:
                pass
        raise AssertionError(f"the CLI did not end: {self.seen[-2000:]!r}")


def test_exec_and_shell_run_inside_the_jobs_sandbox_as_its_identity(tmp_path):
    server = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        admin = Client(server.url, server.admin_token)
        admin.create_tenant("lab")
        admin.create_tenant("other")
        alice = admin.create_user("alice", "lab")["token"]
        eve = admin.create_user("eve", "other")["token"]
        (tmp_path / "code").mkdir()
        (tmp_path / "code" / "sleeper.py").write_text(SLEEPER)
        job = Client(server.url, alice).submit([sys.executable, "sleeper.py"], code=str(tmp_path / "code"),
                                               workers=2, gpus_per_worker=1)
        folder = server.home / "jobs" / str(job["id"])
        wait_until(lambda: all(f"rank {r} up" in (folder / "logs" / f"rank-{r}.log").read_text()
                               for r in (0, 1) if (folder / "logs" / f"rank-{r}.log").exists())
                   and (folder / "logs" / "rank-1.log").exists(), 120, 0.2, "both ranks to run")
        jid = str(job["id"])

        p = _exec(server, alice, jid, "--", "sh", "-c", "id -u; pwd; echo rank $RANK; ls /proc | grep -c '^[0-9]'")
        assert p.returncode == 0, p.stdout + p.stderr
        uid, cwd, rank, procs = p.stdout.splitlines()[:4]
        assert int(uid) not in (0, os.getuid()) and cwd == str(folder / "code") and rank == "rank 0"
        assert int(procs) <= 5  # its PID namespace: the job's command, its init, this sh, ls and grep; no more
        p = _exec(server, alice, jid, "--rank", "1", "--", "sh", "-c", "echo rank $RANK; cat /proc/self/cgroup; exit 3")
        assert p.returncode == 3 and "rank 1" in p.stdout, p.stdout + p.stderr
        assert f"job-{job['id']}" in p.stdout or "deeppod" in p.stdout  # the worker's control group
        refused = _exec(server, eve, jid, "--", "id")
        assert refused.returncode != 0 and f"job {jid} not found" in refused.stderr
        missing = _exec(server, alice, jid, "--rank", "7", "--", "id")
        assert missing.returncode != 0 and "no rank 7" in missing.stderr

        term = Terminal([sys.executable, "-m", "deeppod.cli", "shell", jid], _cli_env(server, alice))
        term.expect(r"code\$ ")  # bash's prompt, in the job's folder: typing before it would be lost, as anywhere
        term.type("stty size\r")
        term.expect(r"30 100")
        term.resize(40, 120)
        term.type("stty size\r")
        term.expect(r"40 120")
        term.type("sh -c 'trap \"echo got-int; exit 7\" INT; echo ready-$((1+1)); while :; do sleep 1; done'\r")
        term.expect(r"ready-2")  # its trap is set: Ctrl-C is now the terminal's SIGINT to it
        term.type("\x03")
        term.expect(r"got-int")
        term.type("echo after-$?\r")
        term.expect(r"after-7")
        term.type("exit 5\r")
        assert term.status() == 5
        Client(server.url, alice).cancel(job["id"])
    finally:
        server.stop()
        server.cleanup_jobs()
