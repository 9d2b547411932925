"""Argument buffers shared between the parent process and the mesh's workers.

A partitioned call whose arguments already live on the devices (a ``jax.Array`` sharded
over the mesh: shard d on GPU d) should not send them through the pipes as pickled host
copies. The parent keeps, per (executable, argument, device), one buffer it shares with
the worker of that device:

- on GPUs (``nccl``): a torch allocation on ``cuda:d`` exported as a CUDA IPC handle
  (``torch.multiprocessing.reductions.reduce_tensor``); each call copies the shard into it
  device to device and the worker reads it in place (the shard itself belongs to JAX's
  allocator, whose memory cannot be exported);
- on the CPU (``gloo``, the tests' path): a POSIX shared memory block
  (``multiprocessing.shared_memory``).

A handle crosses the pipe once; later calls send only its id. ``SharedStaging`` is the
parent's side, ``SharedOpener`` the worker's. Bytes are shared as uint8 and viewed with
the argument's element type on the worker (so bf16 and the like need no numpy support).
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np


def _bytes_of(a: Any) -> tuple[Any, str, tuple[int, ...]]:
    """(flat uint8 view, element type name, shape) of a torch tensor or numpy array."""
    from hlo.dtypes import from_numpy
    if isinstance(a, np.ndarray) or not hasattr(a, "data_ptr"):
        arr = np.ascontiguousarray(np.asarray(a))
        return arr.reshape(-1).view(np.uint8), from_numpy(arr.dtype).name, tuple(arr.shape)
    import torch
    from .arena import _TORCH_DTYPE_NAMES
    names = {v: k for k, v in _TORCH_DTYPE_NAMES.items()}
    t = a.contiguous()
    flat = t.reshape(-1)
    flat = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    return flat, names[str(a.dtype).replace("torch.", "")], tuple(a.shape)


class SharedStaging:
    """The parent's shared buffers, one per (argument key, device)."""

    def __init__(self, backend: str):
        self.backend = backend
        self._ids = itertools.count()
        self._buffers: dict[tuple, tuple[int, Any, Any, tuple]] = {}   # -> (id, buf, owner, meta)
        self._sent: set[tuple[int, int]] = set()                      # (device, id)
        self._devices: set[int] = set()
        self.stats = {"shared_bytes": 0, "handles_sent": 0}

    def put(self, key: Any, device: int, value: Any) -> tuple:
        """Copy ``value`` into its shared buffer on ``device``; the reference to send to
        that device's worker: (id, None) once it has the handle, (id, handle) before."""
        flat, dtype, shape = _bytes_of(value)
        meta = (dtype, shape)
        hit = self._buffers.get((key, device))
        if hit is None or hit[3] != meta:
            hit = self._allocate((key, device), device, int(flat.numel() if hasattr(flat, "numel")
                                                            else flat.size), meta)
        ident, buf, owner, _ = hit
        if self.backend == "nccl":
            import torch
            if isinstance(flat, np.ndarray):
                flat = torch.from_numpy(flat)
            elif flat.device.type == "cuda":        # a peer copy: wait on the source too
                self._devices.add(flat.device.index)
            buf.copy_(flat, non_blocking=True)
            self._devices.add(device)
        else:
            np.copyto(buf, flat if isinstance(flat, np.ndarray) else flat.numpy())
        self.stats["shared_bytes"] += buf.numel() if hasattr(buf, "numel") else buf.size
        if (device, ident) in self._sent:
            return (ident, None)
        self._sent.add((device, ident))
        self.stats["handles_sent"] += 1
        return (ident, self._handle(ident, buf, owner, meta))

    def _allocate(self, key: tuple, device: int, nbytes: int, meta: tuple) -> tuple:
        ident = next(self._ids)
        n = max(nbytes, 1)
        if self.backend == "nccl":
            import torch
            buf = torch.empty(n, dtype=torch.uint8, device=f"cuda:{device}")
            owner = None
        else:
            from multiprocessing import shared_memory
            owner = shared_memory.SharedMemory(create=True, size=n)
            buf = np.ndarray((n,), np.uint8, buffer=owner.buf)[:nbytes]
        old = self._buffers.pop(key, None)
        if old is not None:
            owner_of_old = old[2]
            del old                      # the view goes before its block closes
            _release(owner_of_old)
        self._buffers[key] = (ident, buf, owner, meta)
        return self._buffers[key]

    def _handle(self, ident: int, buf: Any, owner: Any, meta: tuple) -> tuple:
        if self.backend == "nccl":
            from torch.multiprocessing.reductions import reduce_tensor
            rebuild, args = reduce_tensor(buf)
            return ("cuda", rebuild, args, meta)
        return ("shm", owner.name, buf.size, meta)

    def sync(self) -> None:
        """Wait for this call's device-to-device copies (the workers read the buffers from
        their own streams, which know nothing of ours)."""
        if self.backend == "nccl":
            import torch
            for d in self._devices:
                torch.cuda.synchronize(d)
            self._devices.clear()

    def close(self) -> None:
        owners = [entry[2] for entry in self._buffers.values()]
        self._buffers.clear()            # drops the views into the blocks
        self._sent.clear()
        for owner in owners:
            _release(owner)


def _release(owner: Any) -> None:
    """Close and unlink a shared memory block (None: a CUDA buffer, freed with its tensor)."""
    if owner is None:
        return
    try:
        owner.close()
    except BufferError:          # a view is still alive somewhere: the OS frees it at exit
        pass
    owner.unlink()


class SharedOpener:
    """The worker's side: opens each shared buffer once and keeps it as a tensor of the
    argument's type and shape."""

    def __init__(self, device: str):
        self.device = device
        self._open: dict[int, Any] = {}
        self._keep: list[Any] = []
        self.opened = 0

    def open(self, ref: tuple) -> Any:
        ident, handle = ref
        if handle is None:
            return self._open[ident]
        import torch
        from hlo.dtypes import by_name
        from .arena import torch_dtype
        kind = handle[0]
        if kind == "cuda":
            _, rebuild, args, (dtype, shape) = handle
            raw = rebuild(*args)
        else:
            _, name, nbytes, (dtype, shape) = handle
            raw = torch.frombuffer(_attach(name, self._keep), dtype=torch.uint8, count=nbytes) \
                if nbytes else torch.zeros(0, dtype=torch.uint8)
        t = raw.view(torch_dtype(by_name(dtype))).reshape(shape)
        self._open[ident] = t
        self.opened += 1
        return t


def _attach(name: str, keep: list) -> Any:
    """A shared memory block created by the parent (which owns and unlinks it: this
    process's resource tracker must not)."""
    from multiprocessing import resource_tracker, shared_memory
    shm = shared_memory.SharedMemory(name=name)
    try:
        resource_tracker.unregister(shm._name, "shared_memory")   # noqa: SLF001
    except Exception:  # noqa: BLE001  (newer Pythons do not track attached blocks)
        pass
    keep.append(shm)
    return shm.buf

