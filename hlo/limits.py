"""Resource limits: an absurd shape stops with a clear error before any memory is touched.

Every place that materializes a value checks its shape here first: the reference
interpreter (each instruction's result, before its rule runs), the CPU and CUDA buffer
arenas (each instruction, then the arena's total), constants built by the HLO text parser
and the StableHLO importer, and constant folding. ``f32[100000000000]`` then ends in a
``ResourceLimitError`` naming the instruction and how to raise the limit, not in numpy's
MemoryError (or the machine swapping).

The limits, most specific first:

* ``with hlo.resource_limits(max_elements=..., max_bytes=...):`` around compiling or
  evaluating (``None`` keeps a limit as it is; ``0`` means no limit);
* the environment: ``HLOTK_MAX_ELEMENTS`` (elements of one array) and ``HLOTK_MAX_BYTES``
  (bytes of one value, and of one executable's arena);
* the defaults: 2**36 elements and 256 GiB, above any array one GPU holds today (an
  H200 holds 141 GB, so 2**32 elements of f32 would refuse real programs there).

A host arena is also checked against the host's physical memory (``check_arena(...,
capacity=host_memory_bytes())``): numpy's ``np.empty`` of more than that succeeds lazily
and the process is killed when the pages are touched, so it must stop here instead.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

from .errors import HlotkError

ENV_MAX_ELEMENTS = "HLOTK_MAX_ELEMENTS"
ENV_MAX_BYTES = "HLOTK_MAX_BYTES"
DEFAULT_MAX_ELEMENTS = 1 << 36
DEFAULT_MAX_BYTES = 256 << 30

HOW_TO_RAISE = (f"raise it with {ENV_MAX_ELEMENTS}=N / {ENV_MAX_BYTES}=N in the environment or "
                "`with hlo.resource_limits(max_elements=N, max_bytes=N):` (0 = no limit)")


class ResourceLimitError(HlotkError):
    """A value (or an arena) larger than the resource limits allow; nothing was allocated."""


@dataclass(frozen=True)
class Limits:
    max_elements: int   # 0: unlimited
    max_bytes: int      # 0: unlimited


_override = threading.local()


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text)) if any(c in text for c in ".eE") else int(text, 0)
    except ValueError:
        raise ResourceLimitError(f"{name}={text!r} is not a number of "
                                 f"{'elements' if 'ELEMENTS' in name else 'bytes'}") from None
    if value < 0:
        raise ResourceLimitError(f"{name}={text!r} is negative (0 means no limit)")
    return value


def current() -> Limits:
    """The limits in force here: the innermost ``resource_limits`` block, else the env."""
    elements = _env_int(ENV_MAX_ELEMENTS, DEFAULT_MAX_ELEMENTS)
    nbytes = _env_int(ENV_MAX_BYTES, DEFAULT_MAX_BYTES)
    for e, b in getattr(_override, "stack", ()):
        elements = elements if e is None else e
        nbytes = nbytes if b is None else b
    return Limits(elements, nbytes)


@contextlib.contextmanager
def resource_limits(max_elements: Optional[int] = None,
                    max_bytes: Optional[int] = None) -> Iterator[Limits]:
    """Override the limits inside a ``with`` block (this thread only)."""
    for name, v in (("max_elements", max_elements), ("max_bytes", max_bytes)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise ResourceLimitError(f"{name} must be a non-negative int (0 = no limit), "
                                     f"got {v!r}")
    stack = _override.__dict__.setdefault("stack", [])
    stack.append((max_elements, max_bytes))
    try:
        yield current()
    finally:
        stack.pop()


def _human(nbytes: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def check_array(what: str, dims: tuple[int, ...] | list[int], itemsize: float,
                limits: Optional[Limits] = None) -> None:
    """Raise before allocating an array of ``dims`` (``what`` names it: instruction, place)."""
    limits = limits or current()
    elements = 1
    for d in dims:
        elements *= int(d)
    if limits.max_elements and elements > limits.max_elements:
        raise ResourceLimitError(
            f"{what}: {elements} elements, over the limit of {limits.max_elements} "
            f"({ENV_MAX_ELEMENTS}); {HOW_TO_RAISE}")
    check_bytes(what, int(elements * itemsize), limits)


def check_bytes(what: str, nbytes: int, limits: Optional[Limits] = None) -> None:
    limits = limits or current()
    if limits.max_bytes and nbytes > limits.max_bytes:
        raise ResourceLimitError(
            f"{what}: {_human(nbytes)} ({nbytes} bytes), over the limit of "
            f"{_human(limits.max_bytes)} ({ENV_MAX_BYTES}); {HOW_TO_RAISE}")


def check_shape(what: str, shape, limits: Optional[Limits] = None) -> None:
    """``check_array`` for each array leaf of an HLO shape, then their total bytes."""
    from .shape import leaf_paths
    limits = limits or current()
    total = 0
    for _, leaf in leaf_paths(shape):
        if not leaf.is_array:
            continue
        np_dtype = leaf.dtype.np_dtype    # numpy stores sub-byte types one per byte
        itemsize = np_dtype.itemsize if np_dtype is not None else leaf.dtype.bits / 8
        check_array(f"{what} ({leaf})", leaf.dims, itemsize, limits)
        elements = 1
        for d in leaf.dims:
            elements *= int(d)
        total += int(elements * itemsize)
    check_bytes(what, total, limits)


def check_module(module, what: str = "") -> None:
    """Every instruction of every computation (fusion bodies too: a fused kernel builds
    its intermediates) against the limits, before anything runs."""
    limits = current()
    if not (limits.max_elements or limits.max_bytes):
        return
    within: set[int] = set()     # ids of the shapes found within the limits (alive here)
    for comp in module.computations:
        for inst in comp.instructions:
            shape = inst.shape
            if id(shape) in within:
                continue
            if _within(shape, limits):
                within.add(id(shape))
                continue
            # over a limit: check_shape raises, naming the instruction (issue 13: its
            # message was formatted for each of a compile's ~1,000 instructions)
            check_shape(f"{what}instruction %{inst.name} in %{comp.name}", shape, limits)


def _within(shape, limits: Limits) -> bool:
    """Whether ``check_shape(..., shape, limits)`` passes (the same sums, no message)."""
    from .shape import leaf_paths
    total = 0
    for _, leaf in leaf_paths(shape) if shape.is_tuple else (((), shape),):
        if not leaf.is_array:
            continue
        np_dtype = leaf.dtype.np_dtype
        itemsize = np_dtype.itemsize if np_dtype is not None else leaf.dtype.bits / 8
        elements = 1
        for d in leaf.dims:
            elements *= int(d)
        if limits.max_elements and elements > limits.max_elements:
            return False
        nbytes = int(elements * itemsize)
        if limits.max_bytes and nbytes > limits.max_bytes:
            return False
        total += nbytes
    return not (limits.max_bytes and total > limits.max_bytes)


def host_memory_bytes() -> Optional[int]:
    """This host's physical memory, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_arena(allocations, what: str = "buffer arena",
                capacity: Optional[int] = None) -> None:
    """The total of an executable's allocations (``.size`` bytes each) against max_bytes,
    and against ``capacity`` (the memory it will live in) unless the limits are off."""
    total = sum(int(a.size) for a in allocations)
    limits = current()
    check_bytes(what, total, limits)
    if limits.max_bytes and capacity and total > capacity:
        raise ResourceLimitError(
            f"{what}: {_human(total)} ({total} bytes), more than this host's "
            f"{_human(capacity)} of memory; {HOW_TO_RAISE}")
