"""Device memory of a CUDA executable: one arena, constants, parameters, outputs.

Every allocation of the buffer assignment is one flat ``uint8`` torch tensor:

- the temp arena: allocated ONCE per executable (``assignment.temp_size`` bytes); every
  temporary is a typed, strided view into it at the offset buffer assignment chose;
- constants: uploaded once, when the executable is built;
- parameters: the caller's own memory (a JAX array through DLPack, zero-copy; a numpy array
  is copied to the device once), read through a byte view;
- outputs: a fresh allocation per call, handed to the caller (as a JAX array through DLPack).

A leaf's logical view has the leaf's logical dims and the strides its PHYSICAL layout gives
(``minor_to_major``), so kernels and library calls index it logically and read the bytes
where the layout put them.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from hlo.dtypes import DType
from hlo.layout_util import (dense_strides, from_physical, is_default, major_to_minor,
                              physical_dims, to_physical)
from hlo.shape import Shape
from runtime.thunks import Slot

from .errors import DeviceMemoryError

# HLO element type -> name of the torch dtype holding it (types torch lacks, s4 say, have no
# typed view: only host fallbacks, which work on raw bytes, may touch them).
_TORCH_DTYPE_NAMES = {
    "pred": "bool", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}


def torch_dtype(dtype: DType) -> Optional[Any]:
    """The torch dtype for an HLO element type, or None when torch has none."""
    import torch
    name = _TORCH_DTYPE_NAMES.get(dtype.name)
    return getattr(torch, name, None) if name else None


logical_strides = dense_strides     # the name this module's callers use


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def allocate(nbytes: int, device: Any, what: str) -> Any:
    """``torch.empty(nbytes, uint8)`` on ``device``; out of memory is a DeviceMemoryError
    saying how many bytes were needed and how many the device has free."""
    import torch
    try:
        return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(device)
        raise DeviceMemoryError(
            f"{what} needs {nbytes} bytes ({human_bytes(nbytes)}) of device memory; "
            f"{device} has {free} bytes ({human_bytes(free)}) free of {human_bytes(total)}"
        ) from None


class OutputPool:
    """Output buffers reused from call to call while the caller no longer holds them.

    A CUDA graph records the addresses it writes, so fresh outputs every call (XLA's way)
    would make every call a new graph key: captured graphs would rarely replay and each such
    call launches its kernels from Python (~0.1-0.4 ms). The pool keeps up to ``max_sets``
    sets of output buffers and hands out a set whose previous results nobody references any
    more (the storage's reference count is back to the pool's own: every view we returned,
    and every DLPack export JAX holds, counts), so a caller that drops its results cycles
    through a few fixed address sets and every segment replays. A caller that keeps all its
    results gets fresh buffers once the pool is full.

    A JAX array made from a pooled buffer releases its DLPack reference when PJRT frees the
    array. The pool relies on PJRT doing that only once the device work that read the
    buffer is done (PJRT holds a buffer until its usage events complete), so that our next
    call's kernels cannot overwrite what a JAX kernel still reads; measured, a dropped
    result's set is free again 3-30 µs later (benchmarks/gpu_probe.md)."""

    def __init__(self, sizes: dict[int, int], device: Any, max_sets: int = 4):
        import torch
        self.sizes = sizes
        self.device = device
        self.max_sets = max_sets
        self.sets: list[dict[int, tuple[Any, int]]] = []
        self._count = getattr(torch._C, "_storage_Use_Count", None)

    def _refs(self, t: Any) -> int:
        return self._count(t.untyped_storage()._cdata)

    def take(self) -> Optional[dict[int, Any]]:
        """A free set of output buffers {allocation: uint8 tensor}, or None (allocate fresh)."""
        if self._count is None:       # a torch without storage reference counts: no pool
            return None
        for out_set in self.sets:
            if all(self._refs(t) == base for t, base in out_set.values()):
                return {k: t for k, (t, _) in out_set.items()}
        if len(self.sets) >= self.max_sets:
            return None
        fresh = {k: allocate(n, self.device, "an output") for k, n in self.sizes.items()}
        self.sets.append({k: (t, self._refs(t)) for k, t in fresh.items()})
        return fresh


class Memory:
    """The allocations of one run, by allocation number: flat uint8 tensors.

    ``fixed`` allocations (arena, constants) are the same tensors in every run, so their
    views are computed once and kept in ``view_cache`` (shared across runs), with the
    dtype, dims and strides of every other slot's view under ``("geometry", slot)``.
    """

    def __init__(self, buffers: list[Any], fixed: frozenset[int], view_cache: dict):
        self.buffers = buffers
        self.fixed = fixed
        self.view_cache = view_cache

    def raw(self, slot: Slot) -> Any:
        return self.buffers[slot.allocation][slot.offset:slot.offset + slot.nbytes]

    def view(self, slot: Slot) -> Any:
        """The leaf as a torch tensor of its logical dims with its layout's strides."""
        if slot.allocation in self.fixed:
            v = self.view_cache.get(slot)
            if v is None:
                v = self.view_cache[slot] = self._view(slot)
            return v
        return self._view(slot)

    def _view(self, slot: Slot) -> Any:
        key = ("geometry", slot)
        geometry = self.view_cache.get(key)
        if geometry is None:
            s = slot.shape
            td = torch_dtype(s.dtype)
            if td is None:
                raise DeviceMemoryError(f"element type {s.dtype.name} has no torch dtype: {s} "
                                        "can only be read by a host fallback")
            # Per slot, once: a result's view is made on every call (pooled output buffers
            # change between calls), and the stride computation cost more than the view.
            geometry = self.view_cache[key] = (td, tuple(s.dims), logical_strides(s))
        td, dims, strides = geometry
        return self.raw(slot).view(td).as_strided(dims, strides)

    def ptr(self, allocation: int) -> int:
        return self.buffers[allocation].data_ptr()

    # --- host access (fallback thunks, predicates) -----------------------------------------
    def read_host(self, slot: Slot) -> np.ndarray:
        """The leaf as a logical numpy array (copied to the host; synchronizes)."""
        s = slot.shape
        raw = self.raw(slot).cpu().numpy()
        if self.raw(slot).device.type == "cpu":
            raw = raw.copy()      # an owned copy, as from a GPU: later writes must not show
        phys = raw.view(s.dtype.np_dtype).reshape(physical_dims(s))
        if is_default(s.layout):
            return phys.reshape(s.dims)
        return from_physical(phys, s)

    def write_host(self, slot: Slot, value: Any) -> None:
        import torch
        s = slot.shape
        arr = np.asarray(value)
        if arr.dtype != s.dtype.np_dtype:
            arr = arr.astype(s.dtype.np_dtype)
        phys = to_physical(arr.reshape(s.dims), s.layout)
        src = torch.from_numpy(np.ascontiguousarray(phys).reshape(-1).view(np.uint8))
        dst = self.raw(slot)
        if src.numel():
            dst.copy_(src)


# --- inputs and outputs ----------------------------------------------------------------------
def to_tensor(x: Any) -> Optional[Any]:
    """A torch tensor sharing ``x``'s memory where one can (torch tensors, JAX arrays and
    anything else with ``__dlpack__``, except numpy arrays), else None."""
    import torch
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray) or np.isscalar(x) or not hasattr(x, "__dlpack__"):
        return None
    try:
        return torch.from_dlpack(x)
    except Exception:   # noqa: BLE001  (a dtype DLPack cannot carry: go through numpy)
        return None


def parameter_bytes(x: Any, shape: Shape, device: Any, writable: bool) -> Any:
    """The flat uint8 tensor holding parameter value ``x`` in ``shape``'s physical layout on
    ``device``: the caller's memory itself when it already is (a JAX array on this GPU),
    else a copy. ``writable``: the executable writes this allocation (an aliased output), so
    the caller's memory must not be used."""
    import torch
    t = to_tensor(x)
    td = torch_dtype(shape.dtype)
    if t is not None and td is not None and t.dtype == td and tuple(t.shape) == tuple(shape.dims):
        if t.device != device:      # ``device`` is concrete (cuda:0), as tensors' are
            t = t.to(device)
            writable = False      # already a private copy
        if is_default(shape.layout) and t.is_contiguous():
            flat = t.reshape(-1)
        else:
            phys = torch.empty_strided(tuple(shape.dims), logical_strides(shape), dtype=td,
                                       device=device)
            phys.copy_(t)
            # Memory order of the strided tensor: its dims by decreasing stride.
            flat = phys.permute(*major_to_minor(shape.layout, shape.rank)).reshape(-1)
            writable = False
        if writable:
            flat = flat.clone()
        return flat.view(torch.uint8) if flat.numel() else torch.empty(1, dtype=torch.uint8,
                                                                       device=device)
    # numpy (or anything numpy can read): physical bytes on the host, copied once.
    arr = np.asarray(x)
    if arr.dtype != shape.dtype.np_dtype:
        arr = arr.astype(shape.dtype.np_dtype)
    phys = np.ascontiguousarray(to_physical(arr.reshape(shape.dims), shape.layout))
    host = torch.from_numpy(phys.reshape(-1).view(np.uint8).copy())
    if host.numel() == 0:
        host = torch.zeros(1, dtype=torch.uint8)
    return host.to(device)


def constant_bytes(values: np.ndarray, shape: Shape, device: Any) -> Any:
    import torch
    v = np.asarray(values, dtype=shape.dtype.np_dtype).reshape(shape.dims)
    phys = np.ascontiguousarray(to_physical(v, shape.layout)).reshape(-1).view(np.uint8)
    host = torch.from_numpy(phys.copy()) if phys.size else torch.zeros(1, dtype=torch.uint8)
    return host.to(device)


def output_values(mem: Memory, slots: Sequence[Slot], kind: str, device: Any) -> tuple[list, Any]:
    """The output leaves as the caller asked: ``jax`` (DLPack, no copy), ``torch`` or
    ``numpy`` (copied to the host); and, for ``jax`` on a GPU, the event the handoff
    recorded after the last of this call's work (None otherwise)."""
    if kind == "numpy":
        return [mem.read_host(s) for s in slots], None
    out: list[Any] = []
    for slot in slots:
        if torch_dtype(slot.shape.dtype) is None:
            out.append(mem.read_host(slot))
            continue
        t = mem.view(slot)
        # A non-default entry layout: hand out row-major memory (a copy, queued before the
        # handoff's event below).
        out.append(t if t.is_contiguous() else t.contiguous())
    if kind == "torch":
        return out, None
    handoff = jax_handoff(device)
    event = handoff.begin() if handoff is not None else None
    return [to_jax(t, s.shape, handoff) if not isinstance(t, np.ndarray) else t
            for t, s in zip(out, slots)], event


# Why results last left the device through a host copy instead of DLPack (the fast path's
# and the public path's errors), and how often: a silent copy costs a device sync and the
# transfer on every call, so executables report it.
DLPACK_FALLBACK: dict[str, Any] = {"count": 0, "fast": None, "public": None}


class JaxHandoff:
    """Hands one call's results to JAX through DLPack with one stream handshake for all of
    them. ``torch.Tensor.__dlpack__(stream=...)`` records an event and makes JAX's stream
    wait on it for every tensor, through Python-level stream lookups: ~60 µs a result on the
    H200 host (benchmarks/NOTES.md run 13), more than the kernels of a small program. Here
    the handshake is made once a call (``begin``: an event on torch's current stream, JAX's
    external-ready-events stream waits on it), each result is exported without one, and
    PJRT records the result's definition event on that JAX stream, so JAX's readers and
    ``block_until_ready`` still wait for our kernels. JAX internals; any failure sends the
    caller to ``jax.dlpack.from_dlpack``."""

    # Per torch device: its handoff, or None where JAX has no backend for the device
    # (looked up once: a failed lookup costs more than the call it would serve).
    _BY_DEVICE: dict = {}

    def __init__(self, device: Any):
        import torch
        from jax._src import xla_bridge
        from jax._src.dlpack import _DL_DEVICE_TO_PLATFORM
        from jax._src.lib import _jax
        probe = torch.empty(1, device=device)
        dl_type, dev_id = probe.__dlpack_device__()
        backend = xla_bridge.get_backend(_DL_DEVICE_TO_PLATFORM[dl_type])
        self.jax_device = backend.device_from_local_hardware_id(dev_id)
        self.convert = _jax.dlpack_managed_tensor_to_buffer
        self.dl_type = int(dl_type)
        self.device = device
        try:
            self.stream: Optional[int] = self.jax_device.get_stream_for_external_ready_events()
        except Exception:  # noqa: BLE001  (CPU: no streams)
            self.stream = None
        self.external = (torch.cuda.ExternalStream(self.stream, device=device)
                         if self.stream and device.type == "cuda" else None)
        self._stream: Any = None

    @classmethod
    def for_device(cls, device: Any) -> Optional["JaxHandoff"]:
        if device not in cls._BY_DEVICE:
            try:
                cls._BY_DEVICE[device] = cls(device)
            except Exception as e:  # noqa: BLE001
                DLPACK_FALLBACK["fast"] = f"{type(e).__name__}: {e}"
                cls._BY_DEVICE[device] = None
        return cls._BY_DEVICE[device]

    def begin(self) -> Any:
        """The handshake for this call's results; returns the event (recorded after the
        call's work on torch's current stream), or None without a CUDA stream."""
        if self.external is None:
            return None
        import torch
        event = torch.cuda.Event()
        event.record(self._current_stream())
        self.external.wait_event(event)
        return event

    def _current_stream(self) -> Any:
        """torch's current stream on this device. ``torch.cuda.current_stream`` costs ~3 µs
        of Python a call; the raw handle is one C call, so the Stream object is looked up
        again only when the caller switched streams."""
        import torch
        raw_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        cached = self._stream
        if cached is None or raw_of is None or cached.cuda_stream != raw_of(self.device.index or 0):
            cached = self._stream = torch.cuda.current_stream(self.device)
        return cached

    def export(self, t: Any) -> Any:
        from torch.utils.dlpack import to_dlpack
        capsule = to_dlpack(t)
        try:
            return self.convert(capsule, self.jax_device, self.stream, None, self.dl_type)
        except TypeError:       # older jaxlib: four arguments
            return self.convert(capsule, self.jax_device, self.stream, None)


def jax_handoff(device: Any) -> Optional[JaxHandoff]:
    """The device's ``JaxHandoff``, or None where JAX has no backend for it (the public
    DLPack path then decides)."""
    return JaxHandoff.for_device(device)


def to_jax(t: Any, shape: Shape, handoff: Optional[JaxHandoff] = None) -> Any:
    """A JAX array sharing the tensor's memory (DLPack); where JAX has no backend for the
    tensor's device (JAX_PLATFORMS=cpu beside a GPU), a host copy as a numpy array.
    ``handoff`` with a ``begin`` made after the tensor's last writer: no per-tensor handshake."""
    import jax
    if handoff is not None:
        try:
            out = handoff.export(t)
            if isinstance(out, jax.Array) and out.dtype == shape.dtype.np_dtype:
                return out
            DLPACK_FALLBACK["fast"] = f"returned {type(out).__name__} of {getattr(out, 'dtype', '?')}"
        except Exception as e:   # noqa: BLE001
            DLPACK_FALLBACK["fast"] = f"{type(e).__name__}: {e}"
    try:
        return jax.dlpack.from_dlpack(t)
    except Exception as e:   # noqa: BLE001
        DLPACK_FALLBACK["public"] = f"{type(e).__name__}: {e}"
        DLPACK_FALLBACK["count"] += 1
        raw = t.reshape(-1).view(__import__("torch").uint8).cpu().numpy()
        return raw.view(shape.dtype.np_dtype).reshape(shape.dims)


def leaf_of(value: Any, index: Sequence[int]) -> Any:
    for i in index:
        value = value[i]
    return value
