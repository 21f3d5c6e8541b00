"""memory.py: the server caps glibc's arenas (anywhere else it says it did nothing) and
its collector runs less often."""

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


def test_without_a_c_library_to_ask_it_does_nothing(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert memory.limit_arenas() is False


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
