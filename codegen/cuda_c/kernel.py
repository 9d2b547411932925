"""``compile_loop_fusion``: a loop fusion -> a ``CudaCKernel`` (CUDA C, NVRTC, the driver).

The kernel offers what the CUDA backend's thunks use of a ``TritonKernel``: ``launch(outputs,
inputs, stream=None)`` on torch tensors of the logical shapes (views with any strides),
``name``, ``source``, ``path``, ``template`` (``"loop"``: one pass, each output element
written by the thread that read its inputs), ``config``, ``key``, ``autotune`` (always 0:
one configuration), the cost model's ``predicted_us``/``bytes``/``flops``, and the
fusion's name and kind. It has no ``plan``, so the Triton-only steps (the compile pool,
autotuning) pass it by.

The cubin is compiled in the background from the moment the kernel is made (NVRTC in the
process's compile threads, ``nvrtc.compile_async``); the first launch waits for it, loads
it into the current device's context (``cuModuleLoadData``) and launches with
``cuLaunchKernelEx`` on torch's current stream, so CUDA-graph captures (and the native
graph) record it as they record the Triton kernels' direct launches.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from codegen.cache import KernelCache, cache_root, content_key
from hlo.ir import Instruction

from . import nvrtc
from .emitter import (GENERATOR_VERSION, CudaCodegenError, KernelSource, compile_text,
                      emit_loop_kernel)

_CACHE = KernelCache("cuda_c", ".cu")
# What this process made (exe.report(), benchmarks/compile_time.py).
STATS: dict[str, Any] = {"kernels": 0, "loaded": 0, "launches": 0}
# (cache key, arch, device) -> (module, function): one cuModuleLoadData per cubin and device
# in a process, whatever number of kernels share the cubin (the Adam step's 25 kernels are
# 2 cubins). Modules stay loaded for the process, as Triton's do.
_LOADED: dict[tuple[str, str, int], tuple[ctypes.c_void_p, ctypes.c_void_p]] = {}
_LOAD_LOCK = threading.Lock()


def _memo_key(fusion: Instruction, round_narrow_each_op: bool) -> Optional[tuple]:
    """Fusions of one key emit the same source up to comments: ``flat.flat_key`` (no sizes)
    for a fusion with a flat form, else its structure up to names, shapes included."""
    from codegen.triton.kernel import _structure
    from .flat import flat_key
    fkey = flat_key(fusion, round_narrow_each_op)
    if fkey is not None:
        return ("cuda_c", fkey)
    try:
        mkey = ("cuda_c", _structure(fusion, fusion.attrs["calls"]), round_narrow_each_op)
        hash(mkey)
    except TypeError:          # an attribute value with no hashable form: emit
        return None
    return mkey


def _emitted(fusion: Instruction, round_narrow_each_op: bool) -> tuple:
    """(KernelSource, cache key, source as cached, its file) of one fusion."""
    ks: KernelSource = emit_loop_kernel(fusion, round_narrow_each_op)
    # keyed by the code without its comments: a fusion computing what an earlier one
    # computes (other HLO names) shares that one's file and compile
    key = f"{ks.name}_{content_key(compile_text(ks.source), GENERATOR_VERSION)[:16]}"
    generated = ks.source
    source = _CACHE.get_or_create(key, lambda: generated)
    path = _CACHE.path(key)
    if not path.exists():
        path = cache_root() / "cuda_c" / f"{key}.cu (not written)"
    return ks, key, source, path


@dataclass(eq=False)
class CudaCKernel:
    """A generated CUDA C loop kernel for one fusion."""
    name: str
    source: str
    path: Path
    key: str
    fusion_name: str
    input_shapes: list
    output_shapes: list
    threads: int
    elements: int
    arch: str
    per_thread: int = 1           # output elements a thread computes (flat: its chunk)
    # The flat form (flat.py): pointers and the element count as arguments, no strides;
    # views not dense in their layout are copied to dense ones around the launch.
    flat: bool = False
    waves: int = 0                # flat: cap the grid at this many waves (0: no cap)
    template: str = "loop"
    target: str = "h100"
    predicted_us: float = 0.0
    predicted_bytes: int = 0
    predicted_flops: float = 0.0
    fusion_kind: str = ""
    autotune: int = 0
    emitter: str = "cuda"
    # Makes the fusion's Triton kernel: launched instead where NVRTC fails on this source
    # (``fell_back`` says why), so a compiler error costs a slower compile, not the call.
    fallback: Optional[Callable[[], Any]] = None
    fell_back: str = ""
    _triton: Any = None
    _future: Optional["Future[bytes]"] = None
    _functions: dict = field(default_factory=dict)     # device -> (module, function)
    _lock: Any = field(default_factory=threading.Lock)
    _slots: Any = None
    _params: Any = None
    sms: int = 132                # flat with waves: the target's multiprocessors
    _strides: Optional[list] = None

    @property
    def config(self) -> dict:
        cfg = {"threads": self.threads, "blocks": self.blocks, "per_thread": self.per_thread}
        if self.flat:
            cfg.update(flat=True, waves=self.waves)
        return cfg

    @property
    def blocks(self) -> int:
        if self.flat:
            from .flat import flat_blocks
            return flat_blocks(self.elements, self.per_thread, self.threads, self.waves,
                               self.sms)
        return max(1, -(-self.elements // (self.threads * self.per_thread)))

    @property
    def grid(self) -> tuple:
        return (self.blocks,)

    def start_compile(self) -> None:
        if self._future is None:
            self._future = nvrtc.compile_async(
                self.source, self.name, self.arch,
                f" (fusion %{self.fusion_name}; source {self.path})")

    def cubin(self) -> bytes:
        """The compiled cubin (waits for the background compile); raises
        NvrtcCompileError naming the fusion and the source file."""
        self.start_compile()
        return self._future.result()     # type: ignore[union-attr]

    def report_line(self) -> str:
        form = ", flat" if self.flat else ""
        return f"{self.name} (CUDA C{form}, NVRTC sm_{self.arch}): {self.path}"

    def _check(self, tensors: Sequence[Any], shapes: list, what: str) -> None:
        from codegen.triton.kernel import check_operand_shapes
        check_operand_shapes(self, tensors, shapes, what, CudaCodegenError)

    def _function(self, device: int) -> ctypes.c_void_p:
        entry = self._functions.get(device)
        if entry is None:
            cubin = self.cubin()       # first: an NVRTC failure before any driver call
            with _LOAD_LOCK:
                where = (self.key, self.arch, device)
                entry = _LOADED.get(where)
                if entry is None:
                    entry = _LOADED[where] = self._load(cubin, device)
            self._functions[device] = entry
        return entry[1]

    def _load(self, cubin: bytes, device: int) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        from codegen.triton import direct_launch as dl
        cu = dl._cuda()
        dl._ensure_context(device)
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        dl._check(cu.cuModuleLoadData(ctypes.byref(module), cubin),
                  f"cuModuleLoadData({self.name})")
        dl._check(cu.cuModuleGetFunction(ctypes.byref(fn), module, self.name.encode()),
                  f"cuModuleGetFunction({self.name})")
        STATS["loaded"] += 1
        return module, fn

    def launch(self, outputs: Sequence[Any], inputs: Sequence[Any], stream: Any = None,
               config: Optional[dict] = None) -> None:
        """Run the kernel on torch tensors (logical shapes, any strides) on ``stream`` (a
        torch stream) or torch's current one."""
        self._check(inputs, self.input_shapes, "inputs")
        self._check(outputs, self.output_shapes, "outputs")
        if self.elements == 0 or any(math.prod(s.dims) == 0 for s in self.output_shapes):
            return
        import torch
        from codegen.triton import direct_launch as dl
        if self._triton is not None:
            return self._triton.launch(outputs, inputs, stream=stream)
        device = outputs[0].device.index if outputs[0].device.index is not None \
            else torch.cuda.current_device()
        try:
            fn = self._function(device)
        except nvrtc.NvrtcCompileError as e:
            if self.fallback is None:
                raise
            self.fell_back = str(e).splitlines()[0]
            self._triton = self.fallback()
            return self._triton.launch(outputs, inputs, stream=stream)
        pending: list = []
        if self.flat:
            from codegen.triton.flat_loop import dense_views
            if self._strides is None:
                from hlo.layout_util import dense_strides
                self._strides = [dense_strides(s) for s in
                                 list(self.input_shapes) + list(self.output_shapes)]
            with torch.cuda.stream(stream) if stream is not None else _nothing():
                outputs, inputs, pending = dense_views(outputs, inputs, self._strides)
        tensors = list(inputs) + list(outputs)
        values = [t.data_ptr() for t in tensors]
        if self.flat:
            values.append(self.elements)
        else:
            for t in tensors:
                values.extend(int(s) & 0xFFFFFFFFFFFFFFFF for s in t.stride())
        raw = stream.cuda_stream if stream is not None else \
            torch._C._cuda_getCurrentRawStream(device)
        with self._lock:     # one argument buffer per kernel: filled and handed over here
            if self._slots is None or len(self._slots) != len(values):
                self._slots = (ctypes.c_uint64 * len(values))()
                base = ctypes.addressof(self._slots)
                self._params = (ctypes.c_void_p * len(values))(
                    *(base + 8 * k for k in range(len(values))))
            for k, v in enumerate(values):
                self._slots[k] = v
            cfg = dl._LaunchConfig(gridDimX=self.blocks, gridDimY=1, gridDimZ=1,
                                   blockDimX=self.threads, blockDimY=1, blockDimZ=1,
                                   sharedMemBytes=0, hStream=raw, attrs=None, numAttrs=0)
            r = dl._CU.cuLaunchKernelEx(ctypes.byref(cfg), fn, self._params, None)
            if r == dl.ERR_INVALID_CONTEXT:      # a thread without torch's context current
                dl._ensure_context(device)
                r = dl._CU.cuLaunchKernelEx(ctypes.byref(cfg), fn, self._params, None)
        dl._check(r, f"cuLaunchKernelEx({self.name})")
        STATS["launches"] += 1
        if pending:         # a caller's non-dense output view: the scratch copied over
            with torch.cuda.stream(stream) if stream is not None else _nothing():
                for dst, src in pending:
                    dst.copy_(src)

    def __repr__(self) -> str:
        return f"<CudaCKernel {self.name} sm_{self.arch} {self.blocks}x{self.threads} at {self.path}>"


def _sm_count(target: str) -> int:
    """The target's multiprocessors (the cost model's device table), 0 where unknown."""
    from passes.fusion.cost_model import DeviceSpecError, get_device
    try:
        return get_device(target).sm_count
    except DeviceSpecError:
        return 0


def _nothing() -> Any:
    import contextlib
    return contextlib.nullcontext()


def compile_loop_fusion(fusion: Instruction, *, arch: str, target: str = "h100",
                        round_narrow_each_op: bool = True, start: bool = True,
                        fallback: Optional[Callable[[], Any]] = None,
                        estimate: Any = None, memo: Optional[dict] = None) -> CudaCKernel:
    """The CUDA C kernel of a loop fusion, its cubin compiling in the background
    (``start``). Raises ``CudaCDeclined`` for a fusion the emitter does not take, and
    ``CudaCodegenError`` where NVRTC cannot be loaded. ``fallback``: makes the kernel to
    launch instead if NVRTC fails on the source (the fusion's Triton kernel). ``estimate``:
    the cost model's prediction for the fusion on ``target``, where the caller has it.
    ``memo``: as ``codegen.triton.compile_fusion``'s (one executable's build): a fusion
    equal to an earlier one up to names takes its source, key and file instead of
    emitting and hashing the same code again (issue 13: the Adam step's 24 parameter
    updates are 4 distinct fusions; the emitter's comments print each instruction)."""
    if start:
        nvrtc.load()              # no NVRTC: the caller keeps Triton, with this reason
    mkey = _memo_key(fusion, round_narrow_each_op) if memo is not None else None
    made = memo.get(mkey) if mkey is not None else None      # type: ignore[union-attr]
    if made is None:
        made = _emitted(fusion, round_narrow_each_op)
        if mkey is not None:
            memo[mkey] = made                                   # type: ignore[index]
    ks, key, source, path = made
    if ks.flat and mkey is not None:
        # shared by fusions of other sizes: this one's own shapes and element count
        from .flat import flat_fields
        ks = dataclasses.replace(ks, **flat_fields(fusion))
    from passes.fusion.cost_model import predict
    from passes.fusion.kinds import fusion_kind
    est = estimate if estimate is not None else predict(fusion, target)
    threads, waves = ks.threads, 0
    if ks.flat:
        from .flat import fitted_threads, launch_shape
        threads, waves, fixed = launch_shape()
        sms = _sm_count(target)
        if not fixed and sms:
            threads = fitted_threads(ks.elements, ks.per_thread, threads, sms)
    kernel = CudaCKernel(name=ks.name, source=source, path=path, key=key,
                         fusion_name=fusion.name, input_shapes=ks.input_shapes,
                         output_shapes=ks.output_shapes, threads=threads,
                         elements=ks.elements, per_thread=ks.per_thread, flat=ks.flat,
                         waves=waves, sms=_sm_count(target) or 132, arch=arch, target=target,
                         predicted_us=est.time_us, predicted_bytes=est.bytes_moved,
                         predicted_flops=est.flops, fusion_kind=fusion_kind(fusion),
                         fallback=fallback)
    STATS["kernels"] += 1
    if start:
        kernel.start_compile()
    return kernel
