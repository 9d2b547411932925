"""Work a compile may leave for later: done while the process would otherwise wait.

A cold compile ends with work its own call never needs: the on-disk caches' entries
(runtime/compile_cache.py) are pickled at once, but checking that each unpickles to the
same module and writing it (~10 ms for the Adam step on a fast host, twice that on the
GPU machines) can wait. On the CUDA backend it runs while the first call waits for its
kernels (the Triton compile pool, NVRTC's threads): ``drain()`` is called there, and at
exit; ``drain(key)`` runs the items of one key (a cache lookup of the entry a pending
store will write, so this process never misses an entry it has just made).
Everything runs in the calling thread, in the order given; a failing item is dropped (the
items are cache stores: a store that fails only means a later compile is not cached).
"""
from __future__ import annotations

import atexit
import threading
from typing import Callable, Hashable, Optional

_PENDING: list[tuple[Hashable, Callable[[], None]]] = []
_LOCK = threading.Lock()


def defer(work: Callable[[], None], key: Hashable = None) -> None:
    """Run ``work`` at the next ``drain()`` (at the latest at exit), or at ``drain(key)``."""
    with _LOCK:
        _PENDING.append((key, work))


def pending() -> int:
    return len(_PENDING)


def drain(key: Optional[Hashable] = None) -> int:
    """Run the deferred items now: every one, or those deferred with ``key``. Returns how
    many ran."""
    ran = 0
    while True:
        with _LOCK:
            k = next((i for i, (kk, _) in enumerate(_PENDING) if key is None or kk == key),
                     None)
            if k is None:
                return ran
            work = _PENDING.pop(k)[1]
        try:
            work()
        except Exception:  # noqa: BLE001  (a cache store: not cached is all it means)
            pass
        ran += 1


atexit.register(drain)
