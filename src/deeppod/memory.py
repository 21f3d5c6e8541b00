"""The server process's memory over a long run.

- glibc gives each thread that allocates an arena of its own (up to eight per core), and a
  long-running server whose thread pool comes and goes fragments every one of them. Under a
  soak (30 console users and a 16-way search) that showed as resident memory growing by about
  45 kB per finished trial, with Python's own heap flat; with two arenas about 26 kB, and 16
  kB with the collector below (docs/benchmarks.md: not yet shown to level off). The
  environment's MALLOC_ARENA_MAX, where set, is left as it is.
- Python's cycle collector runs a young collection every 700 allocations (its default): a
  request makes thousands, so collections came many times a request, and every hundredth
  one walked the whole heap. In a soak that was 6.4 s of every minute, in pauses of 30-190
  ms. A young generation of 10,000 makes collections 14x rarer, and what start-up made
  (modules, mappers, the app: three quarters of the heap) is frozen out of the collector's
  sight, so a full collection walks only what requests and rounds make: 2.1 s a minute,
  full collections of about 15 ms. (Either alone did less: frozen, full collections came
  4x more often, since one runs once a quarter of the unfrozen heap is new; unfrozen, each
  walked the whole heap, about 200 ms.)
"""

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
    before the server answers): see the module's notes."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION, middle, old)
