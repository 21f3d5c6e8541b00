"""memory.py: the server caps glibc's arenas (anywhere else it says it did nothing) and
freezes what start-up made."""

import ctypes.util
import subprocess
import sys

from deeppod import memory


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


def test_what_start_up_made_is_out_of_the_collectors_sight():
    import gc

    try:
        memory.freeze_startup()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
