"""A Slurm site on this host for the tests: Debian's slurmctld, slurmd and munge, started by
scripts/slurm_local (one node, this host's CPUs and memory, 4 logical GPUs as GRES), and the
Python a site installs for its users on its shared file system. Here the server's interpreter is
under /root and a checkout may be in a private folder, neither reachable by a job's identity: the
system's Python 3.11 runs this tree's source and packages, bound read-only into a folder it can
reach (a bind mount does not ask the source's folders)."""

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from deeppod.executor.slurm import SlurmCli
from tests.helpers import ROOT

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SITE = next(p for p in sys.path if p.endswith("site-packages"))


@dataclass(frozen=True)
class Site:
    cli: SlurmCli
    conf: str
    pythonpath: str  # this tree's deeppod and its packages, readable by any identity


@contextmanager
def slurm_site():
    """The site, taken down at the end (skips the test without root: slurmd starts jobs as their users)."""
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (slurmd starts jobs as their users)")
    where = tempfile.mkdtemp(prefix="deeppod-slurm-test-")
    shared = Path(tempfile.mkdtemp(prefix="deeppod-slurm-install-"))
    shared.chmod(0o711)
    mounts = []
    try:
        for name, source in (("src", ROOT / "src"), ("site", Path(SITE))):
            (shared / name).mkdir()
            subprocess.run(["mount", "--bind", str(source), str(shared / name)], check=True)
            mounts.append(shared / name)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(shared / name)], check=True)
        up = subprocess.run([str(ROOT / "scripts" / "slurm_local"), "up", where], capture_output=True, text=True,
                            timeout=180)
        assert up.returncode == 0, up.stderr
        conf = f"{where}/slurm.conf"
        yield Site(SlurmCli(conf=conf), conf, f"{shared / 'src'}:{shared / 'site'}")
    finally:
        subprocess.run([str(ROOT / "scripts" / "slurm_local"), "down", where], capture_output=True, timeout=120)
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
        if not any(os.path.ismount(m) for m in mounts):
            shutil.rmtree(shared, ignore_errors=True)
