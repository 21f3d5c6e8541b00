"""Benchmarks' spread: a claim is met by its worst round; the load meter counts others' CPU only."""

import os
import subprocess
import sys

import pytest

from deeppod.bench.spread import LoadMeter, Spread, _proc_ticks, machine
from tests.helpers import wait_until

BUSY = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_spread_is_met_only_when_the_worst_round_meets_the_aim():
    s = Spread.of([1.45, 1.28, 1.6])
    assert (s.median, s.lo, s.hi, s.rounds) == (1.45, 1.28, 1.6, 3)
    assert not s.met(1.3) and s.met(1.25)
    assert "NOT met" in s.line("DeepPod / DALI", aim=1.3)
    assert "1.45x (rounds 1.28-1.60, n=3)" in str(s)
    assert Spread.of([0.9, 1.1]).met(1.2, higher_is_better=False)
    assert s.as_dict() == {"median": 1.45, "min": 1.28, "max": 1.6, "rounds": 3}
    with pytest.raises(ValueError):
        Spread.of([])


@pytest.mark.slow  # it starts processes
def test_load_meter_counts_other_processes_cpu_and_not_its_own_children(tmp_path):
    # a process that is not ours: started by a child that exits at once (reparented away)
    pidfile = tmp_path / "pid"
    subprocess.run([sys.executable, "-c", f"import subprocess, sys\n"
                    f"p = subprocess.Popen([sys.executable, '-c', {BUSY!r}], start_new_session=True)\n"
                    f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"], check=True)
    stranger = int(pidfile.read_text())
    mine = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        meter = LoadMeter(every=0.1)
        start = _proc_ticks()[stranger][1]
        wait_until(lambda: _proc_ticks()[stranger][1] - start >= 20, 60, what="the stranger to use 20 CPU ticks")
        used = _proc_ticks()[stranger][1] - start
        meter.sample()
        assert stranger not in meter._mine and mine.pid in meter._mine
        # at least the stranger's ticks (others' too on a busy machine), never its own child's
        assert meter.other_ticks >= used
        assert meter.cores() > 0
        assert "other processes used" in meter.line()
        meter.stop()
    finally:
        os.kill(stranger, 9)
        mine.kill()
        mine.wait()


def test_machine_names_the_cores_this_process_may_use():
    assert f"machine: {len(os.sched_getaffinity(0))} cores" in machine()
