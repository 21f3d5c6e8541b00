"""Every test that starts real servers or processes carries the 'slow' mark."""

import subprocess
import sys

from tests.helpers import ROOT


def collected(*args: str) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode in (0, 5), p.stdout + p.stderr  # 5: nothing selected
    return [line for line in p.stdout.splitlines() if "::" in line]


def test_the_quick_run_starts_no_servers_or_processes():
    quick = collected("-m", "not slow", "tests/e2e", "tests/cli/test_cli.py", "tests/executor/test_local.py")
    assert quick == []
    slow = collected("-m", "slow", "tests/e2e", "tests/cli", "tests/executor", "tests/datasets/test_tiers.py")
    assert any("test_training.py" in t for t in slow) and any("test_cli.py" in t for t in slow)
    assert any("killed_midway" in t for t in slow)
