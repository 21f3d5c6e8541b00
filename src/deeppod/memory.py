"""The server process's memory over a long run: glibc's malloc arenas capped (a thread pool
whose threads come and go fragments one arena per thread; the environment's MALLOC_ARENA_MAX,
where set, is kept), and Python's cycle collector run less often, with what start-up made
frozen out of its sight. What each did under a soak: docs/benchmarks.md ("Soak, 10 minutes")."""

from __future__ import annotations

import ctypes
import gc
import logging
import os

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's malloc.h
SERVER_ARENAS = 2


def limit_arenas(arenas: int = SERVER_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (call it before threads start); whether it
    took effect (False on another C library, or where MALLOC_ARENA_MAX says otherwise)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        # the process's own symbols, which hold its C library's: find_library would start ldconfig
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = mallopt(M_ARENA_MAX, arenas) == 1
    if not done:
        log.debug("mallopt(M_ARENA_MAX, %d) was refused", arenas)
    return done


YOUNG_GENERATION = 10_000  # allocations between young collections (Python's default: 700)


def tune_collector() -> None:
    """Collect less often, and never walk what start-up made (call it once start-up is done,
    before the server answers): a young collection every YOUNG_GENERATION allocations."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION, middle, old)
