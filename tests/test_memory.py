"""memory.py: the server caps glibc's arenas (anywhere else it says it did nothing) and
its collector runs less often."""

import ctypes
import ctypes.util
import subprocess
import sys

import pytest

from deeppod import memory


@pytest.mark.slow  # it starts processes
def test_the_cap_takes_effect_on_glibc_in_a_fresh_process():
    code = "from deeppod import memory; print(memory.limit_arenas())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == "True"


def test_malloc_arena_max_in_the_environment_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.limit_arenas() is False


def test_a_c_library_without_mallopt_is_left_alone(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # musl: no mallopt
    assert memory.limit_arenas() is False


def test_the_c_library_is_found_without_starting_a_process(monkeypatch):
    """find_library("c") runs ldconfig: a server start, and any test that builds one, must not."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: pytest.fail("find_library starts ldconfig"))
    assert memory.limit_arenas() is True


def test_the_collector_runs_less_often_and_leaves_what_start_up_made_alone():
    import gc

    before = gc.get_threshold()
    try:
        memory.tune_collector()
        assert gc.get_threshold() == (memory.YOUNG_GENERATION, before[1], before[2])
        assert gc.get_freeze_count() > 0  # what was alive is out of its sight
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
