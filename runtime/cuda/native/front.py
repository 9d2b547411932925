"""The ``jax.jit`` fronts of ``runtime.jit(f, backend="cuda")`` and of its ``Compiled``.

``Jitted.__call__`` becomes one ``jax.jit`` of a wrapper whose trace (once per signature, as
jax.jit caches) looks the signature up in hlotk's own cache, compiles on a miss, and emits
the executable's FFI call (launcher.py); every later call of that signature is JAX's C++
dispatch end to end. ``Compiled.__call__`` does the same for its one signature.

Declining: a signature whose executable keeps the Python path (launcher.eligibility) raises
``Declined`` inside the trace; the caller then takes the checked Python path for this call,
and a ``Jitted`` stops trying the front altogether (its later calls compute the signature
in Python and go to each ``Compiled``, which uses its own native call where it has one).
Arguments JAX refuses before tracing (a string, an unhashable static argument) also go to
the checked path, which raises the project's error naming the argument.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from hlo.errors import HlotkError

from ..errors import NativeLauncherError
from . import warn_fallback

_HANDLER_MARK = "hlotk native graph"


class Declined(Exception):
    """Raised inside a trace: this signature is not for the native path."""


def disabled() -> Optional[str]:
    """Why the native path is off for the whole process (``HLOTK_NATIVE=0``), or None."""
    if os.environ.get("HLOTK_NATIVE", "1") in ("0", "false", "False", "no", "off"):
        return "HLOTK_NATIVE=0"
    return None


def jax_sees(device: Any) -> Optional[str]:
    """Why JAX cannot run a custom call on this torch device (None: it can)."""
    import jax
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        return "JAX has no GPU backend (JAX_PLATFORMS excludes cuda?)"
    if not any(d.local_hardware_id == (device.index or 0) for d in gpus):
        return f"JAX has no GPU with hardware id {device.index or 0}"
    return None


def cuda_executable(compiled: Any) -> Any:
    """The CudaExecutable behind a Compiled, or None."""
    from ..backend import CudaExecutable
    exe = getattr(getattr(compiled.executable, "_body", None), "executable", None)
    return exe if isinstance(exe, CudaExecutable) else None


# A call taking longer than this traced and compiled a new signature: not host time.
_TRACING_S = 0.05


def _guarded(fast: Callable, slow: Callable, timing: list, name: str,
             disable: Callable, on_decline: Callable = lambda: None,
             graphs: Any = None) -> Callable:
    """``run(args, kwargs)``: the jitted ``fast`` call, or ``slow(args, kwargs)`` where it
    declines or JAX refuses the arguments. Where ``fast`` itself fails on arguments the
    checked path accepts (a bug or a handler failure, not bad input), ``disable()`` turns the
    native path off for good, with one warning, and the call's result comes from ``slow``.
    ``timing`` accumulates [calls, host seconds] of the fast calls (exe.report()).
    ``graphs``: the executable's GraphSettings; with graphs off, calls take ``slow``."""
    clock = time.perf_counter

    def run(args: tuple, kwargs: dict) -> Any:
        if graphs is not None and not graphs.enabled:
            return slow(args, kwargs)
        t0 = clock()
        try:
            out = fast(*args, **kwargs)
        except Declined:
            on_decline()
            return slow(args, kwargs)
        except HlotkError:
            raise
        except Exception as e:  # noqa: BLE001
            return _recover(e, args, kwargs)
        dt = clock() - t0
        if dt < _TRACING_S:
            timing[0] += 1
            timing[1] += dt
        return out

    def _recover(e: Exception, args: tuple, kwargs: dict) -> Any:
        import jax
        message = str(e).strip()
        if _HANDLER_MARK in message and any(
                getattr(x, "is_deleted", lambda: False)()
                for x in jax.tree_util.tree_leaves((args, kwargs))):
            # Donated arguments are gone with the failed call: nothing left to rerun on.
            disable()
            raise NativeLauncherError(message) from e
        out = slow(args, kwargs)      # bad arguments raise the project's error here
        disable()                     # once: later calls take ``slow`` directly
        warn_fallback(f"{name}: the native call failed "
                      f"({type(e).__name__}: {message.splitlines()[0] if message else ''})")
        return out
    return run


def compiled_caller(compiled: Any) -> Any:
    """``run(args, kwargs)`` calling ``compiled`` through its native graph, or False when it
    has none (the reason is in ``exe.native_reason``)."""
    import jax
    exe = cuda_executable(compiled)
    if exe is None or exe.native_graph() is None:
        return False
    graph = exe.native
    lowered = compiled.lowered
    in_tree, out_tree, specs = compiled.in_tree, compiled.out_tree, lowered.in_specs

    def body(*args: Any, **kwargs: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if tree != in_tree or any(tuple(x.shape) != s.shape or x.dtype != s.dtype
                                  for x, s in zip(leaves, specs)):
            raise Declined()
        return jax.tree_util.tree_unflatten(out_tree, graph.call(*leaves))
    fast = jax.jit(body, donate_argnums=getattr(lowered, "donate_dynamic", ()))
    compiled._native_jit = fast          # the bare jax.jit function (benchmarks, HLO text)
    def disable() -> None:
        compiled._native = False
    return _guarded(fast, compiled._call_checked, exe.native_timing, compiled.lowered.name,
                    disable, graphs=exe.graphs)


def jitted_front(jitted: Any) -> Any:
    """``run(args, kwargs)`` for a ``runtime.jit(f, backend="cuda")`` object, or False."""
    import jax
    if jitted.backend != "cuda" or jitted._sharding_kwargs or disabled():
        return False
    try:
        from . import driver_library
        from ..backend import resolve_device
        device = resolve_device()
        if device.type != "cuda" or jax_sees(device) is not None:
            return False
        driver_library()
    except (HlotkError, ImportError):
        return False
    timing = [0, 0.0]

    def body(*args: Any, **kwargs: Any) -> Any:
        sig, dynamic = jitted._signature(args, kwargs)
        compiled = jitted._compiled_for(sig, len(dynamic))
        exe = cuda_executable(compiled)
        if exe is None or exe.native_graph() is None:
            raise Declined()
        exe.native_timing = timing
        leaves = jax.tree_util.tree_leaves((dynamic, kwargs))
        return jax.tree_util.tree_unflatten(compiled.out_tree, exe.native.call(*leaves))

    static = sorted(jitted.static_argnums)
    fast = jax.jit(body, static_argnums=static,
                   donate_argnums=sorted(jitted.donate_argnums - jitted.static_argnums))

    def decline() -> None:
        jitted._front = False
    jitted._front_jit = fast             # the bare jax.jit function (benchmarks, HLO text)
    return _guarded(fast, jitted._call_checked, timing, jitted.__name__, decline,
                    on_decline=decline)
