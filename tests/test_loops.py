"""The control plane's loops (loops.py): a tick that fails or is refused is survived, an
idle loop sleeps until woken, a busy one runs at once when hurried, and stop ends it."""

import threading
import time

from deeppod.errors import NotLeader
from deeppod.loops import IDLE, run_ticks
from tests.helpers import wait_until


def test_a_failing_or_refused_tick_does_not_end_the_loop():
    rounds, stop = [], threading.Event()

    def tick():
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("a bad round")
        if len(rounds) == 2:
            raise NotLeader("another server leads")

    t = threading.Thread(target=run_ticks, args=(tick, stop, 0.01, "test"), daemon=True)
    t.start()
    wait_until(lambda: len(rounds) >= 3, 5, interval=0.01, what="a third round")
    stop.set()
    t.join(2)
    assert not t.is_alive()


def test_an_idle_loop_sleeps_until_woken():
    rounds, stop, wake = [], threading.Event(), threading.Event()

    def tick():
        rounds.append(time.monotonic())
        return IDLE

    t = threading.Thread(target=run_ticks, args=(tick, stop, 0.01, "test"),
                         kwargs={"wake": wake, "idle_interval": 30.0}, daemon=True)
    t.start()
    wait_until(lambda: len(rounds) == 1, 5, interval=0.01)
    time.sleep(0.3)
    assert len(rounds) == 1  # idle: no round every 10 ms
    wake.set()
    wait_until(lambda: len(rounds) == 2, 5, interval=0.01, what="the woken round")
    stop.set()
    t.join(2)
    assert not t.is_alive()  # stop is seen while it sleeps


def test_a_busy_loop_runs_its_next_round_as_soon_as_it_is_hurried():
    rounds, stop, hurry = [], threading.Event(), threading.Event()
    t = threading.Thread(target=run_ticks, args=(lambda: rounds.append(time.monotonic()), stop, 30.0, "test"),
                         kwargs={"hurry": hurry}, daemon=True)
    t.start()
    wait_until(lambda: len(rounds) == 1, 5, interval=0.01)
    time.sleep(0.2)
    assert len(rounds) == 1  # busy, not hurried: the next round comes after the interval
    hurry.set()
    wait_until(lambda: len(rounds) == 2, 5, interval=0.01, what="the hurried round")
    assert not hurry.is_set()  # the flag is spent (and the round came long before the 30 s interval)
    stop.set()
    t.join(2)
    assert not t.is_alive()
