"""EPIC_BUILD_IN_BACKGROUND=1 (opt-in): a call whose kernels are not built yet does not wait for nvcc
(a minute per kernel): it runs the program's unfused torch form while one background thread builds
the kernels, and the first call after the build has finished binds and launches them. A failed build
is not hidden: that next call builds again in the foreground and raises what nvcc said."""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import threading

from .. import envflags
from . import build, cache

_ONE_AT_A_TIME = threading.Lock()      # build_all runs its own nvccs in parallel: one build at a time


def enabled() -> bool:
    return envflags.enabled("EPIC_BUILD_IN_BACKGROUND")


def _start(units) -> concurrent.futures.Future:
    """build_all(units) in a daemon thread: a process that exits meanwhile does not wait for nvcc, whose
    runs are stopped at exit (their leftovers in the cache are what `epic cache --prune` removes)."""
    future = concurrent.futures.Future()

    def run():
        try:
            with _ONE_AT_A_TIME:
                build.build_all(units, None, True)
            future.set_result(None)
        except BaseException as e:          # kept for the record; the next call's bind raises it again
            future.set_exception(e)

    stop_at_exit()
    threading.Thread(target=run, name="epic-build", daemon=True).start()
    return future


@functools.lru_cache(maxsize=1)
def stop_at_exit() -> None:
    # before Python joins build_all's worker threads at exit (which would wait for nvcc to finish):
    # threading's exit hooks run first, the last registered first; atexit's run after the joins
    import concurrent.futures.thread    # noqa: F401  (registers its join hook now, so that ours runs first)
    getattr(threading, "_register_atexit", atexit.register)(build.stop_all)


class Builds:
    """The background builds of one program, per kernel configuration."""

    def __init__(self):
        self._pending: dict[tuple, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def ready(self, key: tuple, units) -> bool:
        """Whether the kernels of configuration `key` can be bound now. units: a function giving their
        translation units (called only for a configuration not seen before: rendering them takes ms)."""
        with self._lock:
            future = self._pending.get(key)
            if future is None:
                todo = units()
                if all(cache.problem(build.library_path(u)) is None for u in todo):
                    future = concurrent.futures.Future()
                    future.set_result(None)
                else:
                    future = _start(todo)
                self._pending[key] = future
        return future.done()        # an error shows when the call binds: build_all runs again and raises
