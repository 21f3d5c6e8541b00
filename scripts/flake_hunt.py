"""scripts/flake_hunt: run test files again and again beside a CPU-burning load, and say which
tests failed in which rounds, with each failure's report. A test that depends on the machine's
speed fails here first: the load takes the cores it was counting on.

Each round is one pytest process (the suite's own settings: two files at a time) writing a
JUnit XML report; the busy loops are started here and ended by their own PIDs."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BURN = "import os\nos.nice(0)\nwhile True:\n    pass\n"


def start_load(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    """End the busy loops (and a round still running: SIGINT first, so pytest ends its own tests' processes)."""
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGINT if "pytest" in p.args else signal.SIGKILL)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def failures(report: Path) -> list[tuple[str, str]]:
    """(test id, its report) of each failed or erroring test in a JUnit XML file."""
    if not report.exists():
        return [("(the round wrote no report)", "")]
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            out.append((test, (bad.get("message") or "") + "\n" + (bad.text or "")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/flake_hunt", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--rounds", type=int, default=5)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy loops beside the tests")
    ap.add_argument("--keep", default=str(ROOT / ".flake_hunt"), help="where each round's log and report go")
    ap.add_argument("--workers", default=os.environ.get("DEEPPOD_TEST_WORKERS", "2"), help="pytest -n (0: one process)")
    args, pytest_args = ap.parse_known_args(argv)
    pytest_args = pytest_args or ["tests/e2e"]
    keep = Path(args.keep) / time.strftime("%Y%m%d-%H%M%S")
    keep.mkdir(parents=True, exist_ok=True)
    seen: dict[str, list[int]] = defaultdict(list)
    times = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill of this script ends its busy loops too
    # started in the background, a shell hands this script SIGINT ignored, and pytest after it: it
    # could then not be stopped in order (its tests' servers and jobs would be left running)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load = start_load(args.load)
    try:
        for n in range(1, args.rounds + 1):
            report, log = keep / f"round-{n}.xml", keep / f"round-{n}.log"
            began = time.monotonic()
            with open(log, "wb") as out:
                run = subprocess.Popen(
                    [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}",
                     *(["-n", args.workers, "--dist", "loadfile",
                        "--no-loadscope-reorder"] if args.workers != "0" else []),
                     *pytest_args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
                load.append(run)  # ended with the load if this script is stopped
                code = run.wait()
            times.append(time.monotonic() - began)
            bad = failures(report) if code else []
            print(f"round {n}/{args.rounds}: exit {code} in {times[-1]:.0f} s, {len(bad)} failed", flush=True)
            for test, text in bad:
                seen[test].append(n)
                (keep / f"round-{n}-{len(seen)}.txt").write_text(f"{test}\n{text}")
                print(f"  FAILED {test}\n" + "\n".join("    " + line for line in text.strip().splitlines()[-40:]),
                      flush=True)
    finally:
        stop_load(load)
    print(f"\n{args.rounds} rounds of {' '.join(pytest_args)} beside {args.load} busy loops: "
          f"{min(times):.0f}-{max(times):.0f} s a round; logs and reports in {keep}")
    if not seen:
        print("no failure")
        return 0
    for test, rounds in sorted(seen.items()):
        print(f"{test}: failed in round(s) {', '.join(map(str, rounds))}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
