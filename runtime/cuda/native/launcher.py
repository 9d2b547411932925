"""A CudaExecutable as one patchable CUDA graph, called through ``jax.ffi.ffi_call``.

    reason = eligibility(exe)          # None, or why the executable keeps the Python path
    graph = NativeGraph(exe)           # warm up, capture four times, diff, instantiate
    outs = graph.call(*leaves)         # inside jax.jit: one FFI custom call

Buffers, as the handler numbers them: the entry parameters in order (one allocation each),
then each result that is not an alias of a donated parameter, in result order. The arena,
the constants and the split-GEMM scratch buffers stay at the addresses they were captured
with: the graph owns them, and launches of one graph are ordered (CUDA orders each launch
of a graph exec behind the previous ones), so one arena serves every call.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Optional, Sequence

from hlo.layout_util import is_default
from passes.dataflow import array_leaves

from ..errors import NativeLauncherError
from . import DRY_RUN_TARGET, TARGET, _ERRBUF, check, driver_library, int_array
from .patch import NotPatchable, PatchSite, parse_nodes, patch_sites

# XLA's device buffers start on 256-byte boundaries (its BFC allocator); the handler refuses
# an address that is not ALIGNMENT-aligned, and the captures see their buffers exactly that
# aligned (an allocation's start, 512-aligned, plus STAGING_SKEW), never more.
ALIGNMENT = 64
STAGING_SKEW = 64


def eligibility(exe: Any) -> Optional[str]:
    """Why ``exe`` cannot run as one patched graph (None: it can)."""
    if not exe.on_gpu:
        return "not on a GPU"
    if exe.poison:
        return "poison mode fills the arena before every run"
    if not exe.graphs.enabled:
        return "CUDA graphs are off"
    return program_reason(exe)


def program_reason(exe: Any) -> Optional[str]:
    """What in the program itself keeps it off the native path (None: nothing): thunks
    that cannot be captured, arguments or results that are not plain arrays."""
    from ..graphs import GraphSegment
    from ..thunks import SequenceThunk
    if exe.comm is not None:
        return "one GPU of a partitioned program (collectives through torch.distributed)"
    thunks = flat_thunks(exe)
    if not thunks:
        return "no device work to capture"
    blocking = [t for t in exe.sequence.walk()
                if not isinstance(t, (GraphSegment, SequenceThunk)) and not t.capturable]
    if blocking:
        return "host control flow or host fallbacks: " + "; ".join(
            f"{t.kind} {t.label()}" for t in blocking[:4]) + (" ..." if len(blocking) > 4 else "")
    try:
        io_plan(exe)
    except NotPatchable as e:
        return str(e)
    return None


def flat_thunks(exe: Any) -> list[Any]:
    """The entry sequence's thunks in order, graph segments opened."""
    from ..graphs import GraphSegment
    out: list[Any] = []
    for t in exe.sequence.thunks:
        out.extend(t.thunks if isinstance(t, GraphSegment) else [t])
    return out


def io_plan(exe: Any) -> tuple[list[int], list[int], dict[int, int]]:
    """(allocation of each buffer, result j -> buffer or -1, parameter -> result aliases),
    or NotPatchable when an argument or result is not a plain dense row-major array with
    an allocation of its own."""
    a = exe.assignment
    entry = exe.module.entry
    buffers: list[int] = []
    for p, param in enumerate(entry.parameters):
        leaves = list(array_leaves(param.shape))
        if param.shape.is_tuple or len(leaves) != 1:
            raise NotPatchable(f"parameter {p} is a tuple")
        _plain(leaves[0][1], f"parameter {p}")
        slot = exe.table[param.uid][()]
        if a.allocations[slot.allocation].kind != "parameter" or slot.offset:
            raise NotPatchable(f"parameter {p} does not own its allocation")
        buffers.append(slot.allocation)
    ret_buffer: list[int] = []
    aliases: dict[int, int] = {}
    seen: set[int] = set()
    for j, (ix, shape) in enumerate(array_leaves(entry.root.shape)):
        _plain(shape, f"result {j}")
        slot = exe.output_slots[j]
        alloc = a.allocations[slot.allocation]
        if slot.offset or slot.allocation in seen:
            raise NotPatchable(f"result {j} shares an allocation with another result")
        seen.add(slot.allocation)
        if alloc.kind == "parameter" and a.aliased_outputs.get(ix) == alloc.parameter:
            aliases[alloc.parameter] = j           # donated: the parameter's buffer
            ret_buffer.append(-1)
        elif alloc.kind == "output":
            ret_buffer.append(len(buffers))
            buffers.append(slot.allocation)
        else:
            raise NotPatchable(f"result {j} lives in a {alloc.kind} allocation")
    return buffers, ret_buffer, aliases


def _plain(shape: Any, what: str) -> None:
    if not shape.is_array:
        raise NotPatchable(f"{what} is not an array")
    if shape.byte_size == 0:
        raise NotPatchable(f"{what} has no elements (XLA may pass no address for it)")
    if not is_default(shape.layout):
        raise NotPatchable(f"{what} has a non-default layout {shape.layout}")


class NativeGraph:
    """One executable, captured (four times, to find its address words), launched per
    call by the FFI handler with XLA's buffers patched in."""

    def __init__(self, exe: Any):
        import torch
        self.lib = driver_library()
        self.exe = exe
        self.id = 0
        t0 = time.perf_counter()
        self.buffers, self.ret_buffer, self.aliases = io_plan(exe)
        self.sizes = [exe.assignment.allocations[k].size for k in self.buffers]
        self.num_args = len(exe.module.entry.parameters)
        self.thunks = flat_thunks(exe)
        device = exe.device
        staging_a, staging_b = self.staging(), self.staging()
        # Warm-up, eagerly on torch's stream: Triton compiles (and tunes) on a first launch,
        # which must not happen inside a capture. Zeros are valid input to every kernel
        # (indices in range).
        ctx = self._context()
        mem_a = self._memory(staging_a)
        with exe.first_run(mem_a):       # kernels compiled in parallel, then tuned
            for t in self.thunks:
                t.run(mem_a, ctx)
        torch.cuda.synchronize(device)
        fell_back = [t for t in self.thunks if not t.capturable]
        if fell_back:
            raise NotPatchable("kernels fell back to the host on their first launch: " +
                               "; ".join(t.label() for t in fell_back[:4]))
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        # Capture A is kept and instantiated; B (other staging buffers), C (A's again) and D
        # (B's again), into the same pool (so that what the thunks allocate during capture
        # tends to land where it did in A), only for the diff (patch.py).
        # Copies and fills of an argument or result become kernel nodes (graph_launch.cc,
        # LowerCopies) in each capture before the diff.
        # C and D run over A's and B's addresses again, through new tensor objects: struct
        # padding holding stack bytes or host pointers (torch's TensorIterator kernels) then
        # differs within a pair of captures over the same buffers, which no address does.
        staging_c = [t.view(t.shape) for t in staging_a]
        staging_d = [t.view(t.shape) for t in staging_b]
        self._graph, self.lowered_copies = self._capture(mem_a, staging_a)
        graph_b, _ = self._capture(self._memory(staging_b), staging_b)
        graph_c, _ = self._capture(self._memory(staging_c), staging_c)
        graph_d, _ = self._capture(self._memory(staging_d), staging_d)
        self.nodes = self._describe(self._graph.raw_cuda_graph())
        nodes_b, nodes_c, nodes_d = (self._describe(g.raw_cuda_graph())
                                     for g in (graph_b, graph_c, graph_d))
        self.kept_words: list[str] = []     # capture-local words kept (patch.py)
        self.sites: list[PatchSite] = patch_sites(
            self.nodes, nodes_b, [t.data_ptr() for t in staging_a],
            [t.data_ptr() for t in staging_b], self.sizes, nodes_c,
            allocation_of=self._allocations, kept=self.kept_words, nodes_d=nodes_d,
            skew=STAGING_SKEW)
        del graph_b, graph_c, graph_d
        self.id = self._create(self._graph.raw_cuda_graph(), device.index or 0)
        # Further instantiations keep other address sets (graph_launch.cc, Exec::Choose):
        # calls alternating between a few sets of buffers then patch nothing.
        self.slots = self._add_slots(self._graph.raw_cuda_graph(), slot_count())
        # A trial launch over capture B's buffers: every site re-pointed and the graph run
        # once before any user call depends on it (a refused update fails here, and the
        # executable keeps the Python path). The first FFI call re-points again. A failure
        # inside a later FFI call surfaces only when its results are read (XLA reports it
        # asynchronously), too late to rerun the call on the Python path.
        self.launch([t.data_ptr() for t in staging_b],
                    torch.cuda.current_stream(device).cuda_stream)
        torch.cuda.synchronize(device)
        self.build_seconds = time.perf_counter() - t0
        self._calls_at_reset = [0] * 6

    # --- building ------------------------------------------------------------------------
    def staging(self) -> list[Any]:
        """Zeroed stand-ins for the argument/result buffers, each starting ``STAGING_SKEW``
        bytes into an allocation: kernels that pick their vector width from their pointers'
        alignment (torch's elementwise kernels, cuBLAS) then choose one that XLA's buffers
        (at least ``ALIGNMENT``-aligned, checked per call by the handler) also satisfy."""
        import torch
        return [torch.zeros(max(n, 1) + STAGING_SKEW, dtype=torch.uint8,
                            device=self.exe.device)[STAGING_SKEW:] for n in self.sizes]

    def _memory(self, staging: list[Any]) -> Any:
        from ..arena import Memory
        exe = self.exe
        buffers: list[Any] = [None] * (len(exe.assignment.allocations) + len(exe.scratch_sizes))
        for k, t in exe.fixed.items():
            buffers[k] = t
        for alloc, t in zip(self.buffers, staging):
            buffers[alloc] = t
        missing = [k for k, b in enumerate(buffers) if b is None]
        if missing:
            raise NotPatchable(f"allocations {missing} are neither fixed nor arguments/results")
        return Memory(buffers, frozenset(exe.fixed), exe._view_cache)

    def _context(self) -> Any:
        from ..thunks import RunContext
        ctx = RunContext(self.exe._eval_context(), {})
        ctx.kernel_copies = True      # type: ignore[attr-defined]  (see thunks.copy_bytes)
        return ctx

    def _capture(self, mem: Any, staging: list[Any]) -> tuple[Any, int]:
        """(the captured graph, how many copy/fill nodes touching ``staging`` became
        kernels)."""
        import torch
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:
            raise NotPatchable(f"torch {torch.__version__} cannot keep a captured graph "
                               "(CUDAGraph(keep_graph=True) needs torch >= 2.8)") from None
        ctx = self._context()
        current = torch.cuda.current_stream(self.exe.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                for t in self.thunks:
                    t.run(mem, ctx)       # recorded, not run
            finally:
                graph.capture_end()
        current.wait_stream(self.stream)
        err = ctypes.create_string_buffer(_ERRBUF)
        lowered = self.lib.hk_graph_lower_copies(
            graph.raw_cuda_graph(), len(staging), int_array((t.data_ptr() for t in staging),
                                                            ctypes.c_uint64),
            int_array((t.numel() for t in staging), ctypes.c_uint64), err, _ERRBUF)
        if lowered < 0:
            raise NotPatchable("replacing the copies of arguments/results by kernels failed: "
                               + err.value.decode(errors="replace"))
        return graph, lowered

    def _allocations(self, words: list[int]) -> list[int]:
        """For each word, the start of the CUDA allocation holding it, or 0 where the driver
        manages no memory there (no kernel can read through such a word)."""
        out = (ctypes.c_uint64 * max(len(words), 1))()
        if self.lib.hk_cuda_allocations(int_array(words, ctypes.c_uint64), len(words), out) < 0:
            raise NotPatchable("the CUDA driver cannot say which memory a differing word "
                               "points into (cuPointerGetAttribute)")
        return list(out[:len(words)])

    def _describe(self, graph: int) -> list:
        err = ctypes.create_string_buffer(_ERRBUF)
        size = ctypes.c_uint64(0)
        status = self.lib.hk_graph_describe(graph, None, ctypes.byref(size), err, _ERRBUF)
        check(status, err, "reading the captured graph")
        buf = ctypes.create_string_buffer(max(size.value, 1))
        status = self.lib.hk_graph_describe(graph, buf, ctypes.byref(size), err, _ERRBUF)
        check(status, err, "reading the captured graph")
        return parse_nodes(buf.raw[:size.value])

    def _create(self, graph: int, device: int) -> int:
        err = ctypes.create_string_buffer(_ERRBUF)
        s = self.sites
        c = ctypes
        exe_id = self.lib.hk_exec_create(
            graph, device, len(self.buffers), self.num_args, len(self.ret_buffer),
            int_array(self.ret_buffer, c.c_int32), len(s),
            int_array((x.node for x in s), c.c_int32), int_array((x.offset for x in s), c.c_int64),
            int_array((x.buffer for x in s), c.c_int32), int_array((x.delta for x in s), c.c_int64),
            err, _ERRBUF)
        check(exe_id, err, "instantiating the captured graph")
        return exe_id

    def _add_slots(self, graph: int, count: int) -> int:
        if count <= 1:
            return 1
        err = ctypes.create_string_buffer(_ERRBUF)
        status = self.lib.hk_exec_add_slots(self.id, graph, count - 1, err, _ERRBUF)
        check(status, err, "instantiating the captured graph again (address-set slots)")
        return status

    def __del__(self) -> None:
        if getattr(self, "id", 0) > 0:
            self.lib.hk_exec_destroy(self.id)   # waits for queued launches first
            self.id = 0

    # --- calling ---------------------------------------------------------------------------
    def call(self, *leaves: Any) -> list[Any]:
        """Inside a jax trace: the FFI custom call running the graph on ``leaves`` (one per
        entry parameter); returns one traced array per result leaf."""
        return ffi_call(self.id, self.exe.module, self.aliases)(*leaves)

    def launch(self, addresses: list[int], stream: int) -> None:
        """Patch to ``addresses`` (one per buffer) and launch on ``stream`` (a raw handle)."""
        err = ctypes.create_string_buffer(_ERRBUF)
        status = self.lib.hk_exec_launch(self.id, int_array(addresses, ctypes.c_uint64),
                                         len(addresses), stream, err, _ERRBUF)
        check(status, err, "launching the graph")

    def trace(self, on: bool) -> None:
        """Record host times and device events around each launch (benchmarks only)."""
        if self.lib.hk_exec_trace(self.id, 1 if on else 0) < 0:
            raise NativeLauncherError("the CUDA driver has no event calls for the trace")

    def trace_read(self) -> dict[str, float]:
        """The last traced call (waits for it): host ns (CLOCK_MONOTONIC, as
        time.perf_counter_ns) at the handler's entry, after patching and after launching;
        device ms from the base event (``trace_base``) to the launch's start and end, and the
        launch's own device time."""
        host = (ctypes.c_uint64 * 3)()
        ms = (ctypes.c_float * 3)()
        if self.lib.hk_exec_trace_read(self.id, host, ms) < 0:
            raise NativeLauncherError("no traced call to read (trace off, or no base event)")
        return {"entry_ns": host[0], "patched_ns": host[1], "launched_ns": host[2],
                "start_ms": ms[0], "device_ms": ms[1], "end_ms": ms[2]}

    def trace_base(self, stream: int) -> None:
        """Record the trace's base event on ``stream`` (a raw CUDA stream handle)."""
        if self.lib.hk_trace_base(stream) < 0:
            raise NativeLauncherError("recording the trace's base event failed")

    def replay_on_staging(self, arguments: Optional[Sequence[Any]] = None) -> Any:
        """A function launching the graph on torch's current stream over fresh staging
        buffers (device time of the graph alone; the next FFI call patches back). With
        ``arguments`` (the entry parameters' arrays, in order: numpy, JAX or torch), the
        argument buffers hold a copy of their bytes, else zeros. Zeros are not neutral:
        an IEEE division or square root with a zero operand takes its slow path, which
        Triton's approximate ones never do (i13-flat-sass), so timings that compare
        kernels should replay on the call's own data."""
        import torch
        staging = self.staging()
        if arguments is not None:
            if len(arguments) != self.num_args:
                raise NativeLauncherError(f"replay_on_staging: {len(arguments)} arguments for "
                                          f"{self.num_args} entry parameters")
            for k, (buf, x) in enumerate(zip(staging, arguments)):
                raw = _argument_bytes(x)
                if raw.numel() > self.sizes[k]:
                    raise NativeLauncherError(
                        f"replay_on_staging: argument {k} has {raw.numel()} bytes, its "
                        f"buffer {self.sizes[k]}")
                buf[:raw.numel()].copy_(raw)
        addresses = [t.data_ptr() for t in staging]

        def replay() -> None:
            staging  # noqa: B018  (kept alive with the closure)
            self.launch(addresses, torch.cuda.current_stream(self.exe.device).cuda_stream)
        replay.buffers = staging    # type: ignore[attr-defined]  (arguments, then results)
        return replay

    def stats(self) -> dict[str, float]:
        """Counters of the handler since the last ``reset_stats``: calls, nodes patched,
        address changes, and the mean µs per call of its steps."""
        raw = (ctypes.c_uint64 * 6)()
        self.lib.hk_exec_stats(self.id, raw)
        vals = [v - b for v, b in zip(raw, self._calls_at_reset)]
        calls = max(vals[0], 1)
        return {"calls": vals[0], "nodes_patched": vals[1], "address_changes": vals[2],
                "gather_us": vals[3] / calls / 1e3, "patch_us": vals[4] / calls / 1e3,
                "launch_us": vals[5] / calls / 1e3}

    def reset_stats(self) -> None:
        raw = (ctypes.c_uint64 * 6)()
        self.lib.hk_exec_stats(self.id, raw)
        self._calls_at_reset = list(raw)

    def describe(self) -> str:
        patched = len({s.node for s in self.sites})
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        return (f"one CUDA graph of {len(self.nodes)} nodes ("
                + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
                + f"), {len(self.sites)} address words in {patched} nodes patched per moved "
                f"buffer; {len(self.buffers)} buffers ({self.num_args} arguments); "
                + (f"{self.lowered_copies} copies/fills of arguments or results run as "
                   "kernels; " if self.lowered_copies else "")
                + (f"{len(self.kept_words)} capture-local words kept as captured; "
                   if self.kept_words else "")
                + (f"{self.slots} instantiations (address sets kept); " if self.slots > 1 else "")
                + f"built in {self.build_seconds:.2f} s")


def slot_count() -> int:
    """Instantiations of each native graph (``HLOTK_NATIVE_SLOTS``, default 4, at least 1):
    how many address sets of its arguments and results calls can alternate between without
    re-patching kernel parameters."""
    raw = os.environ.get("HLOTK_NATIVE_SLOTS", "4")
    try:
        return max(1, min(int(raw), 64))
    except ValueError:
        raise NativeLauncherError(f"HLOTK_NATIVE_SLOTS={raw!r} is not a whole number") from None


def ffi_call(exe_id: int, module: Any, aliases: dict[int, int], dry_run: bool = False) -> Any:
    """``jax.ffi.ffi_call`` of the launcher for executable ``exe_id``: one operand per entry
    parameter, one result per result leaf of ``module``; donated parameters alias their
    results (``input_output_aliases``)."""
    import jax
    import numpy as np
    outs = [jax.ShapeDtypeStruct(tuple(s.dims), s.dtype.np_dtype)
            for _, s in array_leaves(module.entry.root.shape)]
    call = jax.ffi.ffi_call(DRY_RUN_TARGET if dry_run else TARGET, outs,
                            input_output_aliases=dict(aliases) or None)
    attr = np.int64(exe_id)
    return lambda *leaves: call(*leaves, exe=attr)


def _argument_bytes(x: Any) -> Any:
    """``x``'s bytes in row-major order as a flat uint8 torch tensor (on x's device for a
    torch tensor, else on the host)."""
    import numpy as np
    import torch
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous().reshape(-1).view(torch.uint8)
    arr = np.ascontiguousarray(np.asarray(x))      # JAX arrays come to the host once
    return torch.from_numpy(arr.reshape(-1).view(np.uint8))
