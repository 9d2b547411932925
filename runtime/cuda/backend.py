"""The CUDA executable and the ``cuda`` backend of ``runtime.Client``.

    exe = CudaExecutable.build(module)              # module scheduled (``schedule`` pass)
    outs = exe.run([x, y])                          # JAX arrays out (DLPack, no copy)
    outs = exe.run([x, y], output="torch")          # or torch tensors / "numpy"
    print(exe.describe()); exe.report()             # thunks, graphs, host fallbacks

Building: buffer assignment places every value; the arena (``temp_size`` bytes) and the
constants are allocated on the device once; each instruction of the scheduled entry (and of
loop bodies and branches) becomes a thunk (thunks.py), and straight-line runs of capturable
thunks become CUDA graph segments (graphs.py).

``device="cpu"`` runs the same executable on CPU torch tensors with Triton's interpreter
(``TRITON_INTERPRET=1``) and no graphs: the arena/thunk/launch logic is testable on a
machine without a GPU. ``runtime.jit(f, backend="cuda")`` picks it by itself when there is
no GPU but ``TRITON_INTERPRET=1`` is set.

Options (keyword arguments, or environment for ``runtime.jit``): ``cuda_graphs``
(``HLOTK_CUDA_GRAPHS``, default on), ``autotune`` (``HLOTK_AUTOTUNE``: 0 off, the
templates' configs; 1 the cost model's best few configs timed on first launch; 2 every
config; results persisted, ``codegen/triton/autotune.py``), ``poison``
(``HLOTK_POISON_ARENA``: 0xFF bytes in the arena and outputs before every run).

Two host paths (``report()`` says which one an executable takes, and why):
- native (``runtime/cuda/native``): the whole executable is one CUDA graph launched by an XLA
  FFI custom call inside ``jax.jit``; ``runtime.jit`` and ``Compiled`` calls use it where
  every thunk can be captured (``HLOTK_NATIVE=0`` turns it off);
- Python (``run``): memory binding, thunks (straight-line runs replayed as CUDA graphs),
  results handed to JAX through DLPack. Host-driven loops and branches, host fallbacks,
  torch/numpy outputs and ``poison`` take it.
"""
from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections import OrderedDict
from typing import Any, Iterator, Optional

from hlo.evaluator.core import EvalContext, Evaluator
from hlo.errors import InvalidArgumentError
from hlo.ir import Computation, Instruction, Module
from hlo.limits import check_arena, check_module
from hlo.trip_count import known_trip_count
from passes.buffer_assignment import BufferAssignment, assign_buffers
from passes.dataflow import array_leaves
from passes.fusion.kinds import fusion_kind
from runtime import deferred
from runtime.thunks import Slot

from . import arena as ar
from . import prewarm
from .collectives import ASYNC_COLLECTIVES, COLLECTIVE_OPS
from .errors import NoCudaDeviceError
from .graphs import GraphSegment, GraphSettings, segment
from .linalg_calls import linalg_call_thunk
from .torch_ops import DEVICE_OPS, device_op_thunk
from .thunks import (BytesCopyThunk, ConditionalThunk, CopyThunk, CountedLoopThunk,
                     HostThunk, KernelThunk, LibraryThunk, RunContext, SequenceThunk, Thunk,
                     WhileThunk, one_instruction_fusion)

_LIBRARY_OPS = {"dot", "convolution"}
# A counted loop is unrolled into the program's CUDA graph up to this many body thunks in
# all (trips x thunks per trip); a longer one stays host-driven (its graph would be large
# and slow to capture four times for the native path).
MAX_UNROLLED_THUNKS = 8192
_NO_THUNK = {"parameter", "constant", "tuple", "get-tuple-element", "optimization-barrier"}
# Never worth asking the Triton generator for (no template takes them).
_HOST_ONLY = {"sort", "scatter", "rng", "rng-bit-generator", "rng-get-and-update-state",
              "custom-call", "fft", "convolution", "reduce-window", "select-and-scatter",
              "triangular-solve", "cholesky", "infeed", "outfeed", "send", "recv", "send-done",
              "recv-done", "after-all", "all-reduce", "all-gather", "reduce-scatter",
              "all-to-all", "collective-permute", "partition-id", "replica-id", "topk",
              "domain", "add-dependency", "while", "conditional", "call", "map",
              "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
              "collective-permute-start", "collective-permute-done", "async-start",
              "async-done",
              "batch-norm-training", "batch-norm-inference", "batch-norm-grad"}


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v not in ("0", "false", "False", "no", "off")


def _interpret() -> bool:
    return _env_flag("TRITON_INTERPRET", False)


def resolve_device(device: Optional[str] = None) -> Any:
    """The concrete torch device to run on: ``cuda:N`` (a GPU), or ``cpu`` (Triton's
    interpreter). Raises NoCudaDeviceError when neither is possible."""
    try:
        import torch
    except ImportError:
        raise NoCudaDeviceError("backend 'cuda' needs PyTorch (the device layer) and Triton; "
                                "torch is not installed (pip install torch triton), or use "
                                "backend='cpu'") from None
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        elif _interpret():
            device = "cpu"
        else:
            raise NoCudaDeviceError(
                "backend 'cuda': no CUDA device (torch.cuda.is_available() is False). Use "
                "backend='cpu', or set TRITON_INTERPRET=1 to run the CUDA executable on the "
                "CPU through Triton's interpreter (slow; for testing)")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaDeviceError(f"device {device!r}: no CUDA device "
                                    "(torch.cuda.is_available() is False)")
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    elif dev.type == "cpu":
        if not _interpret():
            raise NoCudaDeviceError("device 'cpu' runs Triton kernels in Triton's interpreter: "
                                    "set TRITON_INTERPRET=1 before importing triton")
    else:
        raise NoCudaDeviceError(f"device {device!r}: expected 'cuda', 'cuda:N' or 'cpu'")
    try:
        import triton  # noqa: F401
    except ImportError:
        raise NoCudaDeviceError("backend 'cuda' needs Triton for its kernels; it is not "
                                "installed (pip install triton)") from None
    return dev


def default_target(device: Any) -> str:
    """The fusion/codegen target for a device: h200 / h100 (by name), else h100."""
    if device.type == "cuda":
        import torch
        name = torch.cuda.get_device_name(device).lower()
        for t in ("h200", "h100", "a100"):
            if t in name:
                return t
    return "h100"


class CudaExecutable:
    def __init__(self, module: Module, assignment: BufferAssignment, *,
                 device: Optional[str] = None, cuda_graphs: Optional[bool] = None,
                 autotune: Optional[bool | int] = None, poison: Optional[bool] = None,
                 target: Optional[str] = None, communicator: Optional[Any] = None,
                 capture_collectives: Optional[bool] = None):
        self.device = resolve_device(device)
        # One GPU of a partitioned run (runtime/cuda/distributed.py): collectives go
        # through torch.distributed (collectives.py); None: a single-device program.
        self.comm = communicator
        # Collectives inside CUDA graphs (NCCL only; HLOTK_CAPTURE_COLLECTIVES, default on).
        self.capture_collectives = (_env_flag("HLOTK_CAPTURE_COLLECTIVES", True)
                                    if capture_collectives is None else capture_collectives)
        self.on_gpu = self.device.type == "cuda"
        self.module = module
        self.assignment = assignment
        self.target = target or default_target(self.device)
        from codegen.triton.autotune import autotune_level
        from codegen.triton.pdl import mode as pdl_mode
        self.autotune = autotune_level(autotune)
        from codegen.cuda_c import loop_emitter
        self.loop_emitter = loop_emitter()   # a bad HLOTK_LOOP_EMITTER raises here
        if self.loop_emitter != "triton":
            from codegen.cuda_c.emitter import per_thread_for
            from codegen.cuda_c.flat import launch_shape
            per_thread_for(0, 1)             # and a bad HLOTK_CUDA_C_PER_THREAD
            launch_shape()                   # or HLOTK_CUDA_C_FLAT_LAUNCH
        pdl_mode()    # a bad HLOTK_PDL raises here, not as every kernel's host fallback
        self.poison = _env_flag("HLOTK_POISON_ARENA", False) if poison is None else poison
        graphs = _env_flag("HLOTK_CUDA_GRAPHS", True) if cuda_graphs is None else cuda_graphs
        self.graphs = GraphSettings(enabled=bool(graphs) and self.on_gpu)
        self.stats: dict[str, Any] = {}
        a = assignment
        self._dynamic = {al.index for al in a.allocations if al.kind in ("parameter", "output")}
        table: dict[int, dict[tuple[int, ...], Slot]] = {}
        for comp in a.flow.computations:
            for inst in comp.instructions:
                table[inst.uid] = {ix: Slot(*_slice(a, inst, ix), shape)
                                   for ix, shape in array_leaves(inst.shape)}
        self.table = table
        self._n_assigned = len(a.allocations)
        self.scratch_sizes: list[int] = []     # buffers of split GEMM fusions (split.py)
        self._async_starts: dict[int, Any] = {}  # start uid -> its thunk (for the done)
        # One generated kernel per distinct fused computation of this build (compile_fusion's
        # ``memo``): the Adam step's 25 fusions are 11 generations.
        self._codegen_memo: dict = {}
        t0 = time.perf_counter()
        self.sequence = self._sequence(module.entry)
        self.build_seconds = time.perf_counter() - t0
        self._codegen_memo.clear()      # its keys hold the fused computations' literals
        self._untuned = sum(1 for k in self._triton_kernels() if k.autotune)
        self._precompiled = not self.on_gpu or _interpret()
        self.parameter_slots = [[(ix, table[p.uid][ix]) for ix, _ in array_leaves(p.shape)]
                                for p in module.entry.parameters]
        self.output_slots = [table[module.entry.root.uid][ix]
                             for ix, _ in array_leaves(module.entry.root.shape)]
        self.aliased_parameters = set(a.aliased_outputs.values())
        self.donated_parameters: list[int] = []     # donation is not zero-copy here (yet)
        # Device memory that lives as long as the executable: the arena and the constants.
        self.fixed: dict[int, Any] = {}
        for alloc in a.allocations:
            if alloc.kind == "temp":
                self.fixed[alloc.index] = ar.allocate(alloc.size, self.device,
                                                      f"the temp arena of {module.name}")
        self._upload_constants()
        for k, size in enumerate(self.scratch_sizes):
            self.fixed[self._n_assigned + k] = ar.allocate(size, self.device, "a scratch buffer")
        self._view_cache: dict = {}
        self._dlpack: "OrderedDict[int, tuple[Any, Any]]" = OrderedDict()
        self._in_flight: list[tuple[Any, list]] = []
        # Outputs from a pool when graphs replay (fixed addresses; see arena.OutputPool).
        self._outputs = ar.OutputPool({al.index: al.size for al in a.allocations
                                       if al.kind == "output"}, self.device) \
            if self.graphs.enabled else None
        # The native path (native_graph()): built on first use; why not, where not.
        self.native: Optional[Any] = None
        self.native_reason = "not tried (the first runtime.jit / Compiled call decides)"
        self._native_tried = False
        self.native_timing = [0, 0.0]      # [calls, host seconds] of native calls
        # Host time of the Python path's steps: calls, then seconds per step.
        self.host_time = {"calls": 0, "memory": 0.0, "thunks": 0.0, "results": 0.0,
                          "keep-alive": 0.0}

    @classmethod
    def build(cls, module: Module, **options: Any) -> "CudaExecutable":
        check_module(module)       # absurd shapes stop here, before the arena exists
        assignment = assign_buffers(module)
        check_arena(assignment.allocations, f"the device arena of {module.name}")
        return cls(module, assignment, **options)

    # --- building ------------------------------------------------------------------------
    def _sequence(self, comp: Computation) -> SequenceThunk:
        thunks: list[Thunk] = []
        for inst in comp.instructions:
            thunks.extend(self._thunks(inst))
        if self.comm is not None:
            from .collectives import pair_capturable
            pair_capturable(thunks)
        if self.on_gpu:
            thunks = segment(thunks, self._dynamic)
        return SequenceThunk(None, thunks)

    def leaves(self, inst: Instruction) -> dict[tuple[int, ...], Slot]:
        return self.table[inst.uid]

    def _array_slot(self, inst: Instruction) -> Optional[Slot]:
        """The one slot of an array-shaped value with a torch dtype, else None."""
        leaves = self.leaves(inst)
        s = leaves.get(())
        if s is None or len(leaves) != 1 or ar.torch_dtype(s.shape.dtype) is None:
            return None
        return s

    def _thunks(self, inst: Instruction) -> list[Thunk]:
        op = inst.opcode
        if op in _NO_THUNK:
            return []
        if op == "bitcast":
            src, dst = self.leaves(inst.operands[0]).get(()), self.leaves(inst).get(())
            if src is None or dst is None or (src.allocation, src.offset) == (dst.allocation, dst.offset):
                return []     # a view: the same bytes, read with another shape
            return [BytesCopyThunk(inst, [src], [dst])]
        if op == "while":
            cond = inst.attrs["condition"]
            body = [t for b in inst.attrs["body"].instructions for t in self._thunks(b)]
            if self.comm is not None:     # as _sequence does for any computation
                from .collectives import pair_capturable
                pair_capturable(body)
            trips = known_trip_count(inst)
            if trips is not None and all(t.capturable for t in body) and \
                    trips * len(body) <= MAX_UNROLLED_THUNKS:
                return [CountedLoopThunk(inst, body, trips)]
            if self.on_gpu:
                body = segment(body, self._dynamic)
            return [WhileThunk(inst, self._sequence(cond), SequenceThunk(None, body),
                               self.leaves(cond.root)[()])]
        if op == "conditional":
            if "branch_computations" in inst.attrs:
                branches, indexed = list(inst.attrs["branch_computations"]), True
            else:
                branches = [inst.attrs["true_computation"], inst.attrs["false_computation"]]
                indexed = False
            return [ConditionalThunk(inst, [self._sequence(b) for b in branches], indexed,
                                     self.leaves(inst.operands[0])[()])]
        if op == "call":    # inlined into this sequence, so its kernels join graphs here
            callee = inst.attrs["to_apply"]
            out: list[Thunk] = []
            for i in callee.instructions:
                out.extend(self._thunks(i))
            return out
        # A gather (alone or fused, with no scatter/sort/reduce-window beside it) is a
        # Triton kernel: the emitter computes its operand at the gathered index
        # (codegen/triton/gather.py). What the generator refuses keeps the torch path.
        if _gathers_only(inst):
            t = self._gather_kernel(inst)
            return list(t.thunks) if isinstance(t, SplitThunk) else [t]
        # scatter / sort / reduce-window (alone or fused): no Triton template takes them;
        # torch ops on arena views where torch_ops.py can, else a HostThunk.
        t = device_op_thunk(inst, self.leaves) if op in DEVICE_OPS else None
        if t is not None:
            return [t]
        if op == "fusion" and fusion_kind(inst) == "attention":
            return [self._flash_attention(inst)]
        if op == "custom-call":
            # cusolver_* calls JAX emits for linear algebra: torch.linalg on the device.
            t = linalg_call_thunk(inst, self.leaves)
            if t is not None:
                return [t]
        if op == "fusion" and fusion_kind(inst) == "attention_backward":
            return [self._flash_attention(inst)]
        if op == "fusion":
            t = self._kernel(inst, inst, wrapped=False)
            return list(t.thunks) if isinstance(t, SplitThunk) else _operand_first(t)
        if op == "copy":
            if all(ar.torch_dtype(s.shape.dtype) is not None for s in self.leaves(inst).values()):
                ins = [self.leaves(inst.operands[0])[ix] for ix in self.leaves(inst)]
                copy = CopyThunk(inst, ins, list(self.leaves(inst).values()))
                tiled = self._tiled_copy(inst, copy)
                return [tiled if tiled is not None else copy]
            return [self._host(inst, "no torch dtype")]
        if self.comm is not None and op in COLLECTIVE_OPS | ASYNC_COLLECTIVES:
            from .collectives import collective_thunk
            return [collective_thunk(inst, self.leaves, self.comm, self._async_starts,
                                     self.capture_collectives)]
        if op in _LIBRARY_OPS:        # cuBLAS dots, cuDNN convolutions (codegen/library)
            from codegen.library import lookup
            call = lookup("cuda", inst)
            slots = [self._array_slot(o) for o in inst.operands]
            res = self._array_slot(inst)
            if call is not None and res is not None and all(s is not None for s in slots):
                return [LibraryThunk(inst, call, slots, [res])]   # type: ignore[arg-type]
        if op in _HOST_ONLY or inst.is_side_effecting:
            return [self._host(inst, "no kernel generator for this op")]
        t = self._kernel(inst, one_instruction_fusion(inst), wrapped=True)
        return list(t.thunks) if isinstance(t, SplitThunk) else _operand_first(t)

    def _flash_attention(self, inst: Instruction) -> Thunk:
        """A flash-attention fusion (forward, maybe with its row max and sum, or backward):
        its Triton kernels (codegen/triton/attention.py, attention_backward.py)."""
        from codegen.triton.attention import Unsupported
        if fusion_kind(inst) == "attention":
            from codegen.triton.attention import flash_attention as call, plan_for
        else:
            from codegen.triton.attention_backward import (  # type: ignore[assignment]
                flash_attention_backward as call, plan_for)
        ins = [self._array_slot(o) for o in inst.operands]
        if inst.shape.is_tuple:     # forward + row max and sum, or the backward's dQ, dK, dV
            outs = [self.leaves(inst).get((k,)) for k in range(len(inst.shape.elements))]
        else:
            outs = [self._array_slot(inst)]
        try:
            plan_for(inst)
        except Unsupported as e:
            return self._host(inst, f"flash attention: {e}")
        if any(s is None for s in outs + ins):
            return self._host(inst, "flash attention: a tuple operand")
        return LibraryThunk(inst, call, ins, outs)  # type: ignore[arg-type]

    def _gather_kernel(self, inst: Instruction) -> Thunk:
        """A gather, or a fusion around gathers, as a Triton kernel; what the generator
        refuses goes to torch ops (torch_ops.py), then to the host."""
        def refused(reason: str) -> Thunk:
            t = device_op_thunk(inst, self.leaves)
            if t is None:
                return self._host(inst, reason)
            self.stats.setdefault("gather_torch_fallbacks", []).append(
                f"%{inst.name}: {reason}")
            return t
        fusion = inst if inst.opcode == "fusion" else one_instruction_fusion(inst)
        t = self._kernel(inst, fusion, wrapped=inst.opcode != "fusion", refused=refused)
        if isinstance(t, KernelThunk):
            # Should Triton fail to compile the kernel at its first launch, the torch ops
            # that ran these gathers before take over (not the host evaluator).
            torch_thunk = device_op_thunk(inst, self.leaves)
            if torch_thunk is not None:
                t.fallback = torch_thunk     # type: ignore[assignment]
        return t

    def _kernel(self, inst: Instruction, fusion: Instruction, wrapped: bool,
                refused: Optional[Any] = None) -> Thunk:
        """A Triton kernel thunk for ``fusion`` (the instruction itself, or its one-op
        wrapper), or a host fallback when the generator cannot make one (``refused(reason)``
        instead, when given)."""
        from codegen.triton import TritonCodegenError, compile_fusion
        host = refused if refused is not None else (lambda why: self._host(inst, why))
        ins = [self._array_slot(o) for o in inst.operands]
        if any(s is None for s in ins):
            return host("a tuple or untyped operand")
        root = fusion.attrs["calls"].root
        if inst.shape.is_tuple:
            if root.opcode not in ("tuple", "reduce") or any(not e.is_array for e in inst.shape.elements):
                return self._host(inst, "a nested tuple result")
            outs = [self.leaves(inst).get((k,)) for k in range(len(inst.shape.elements))]
        else:
            outs = [self.leaves(inst).get(())]
        if any(s is None or ar.torch_dtype(s.shape.dtype) is None for s in outs):
            return host("a result type torch has no dtype for")
        split = self._split_reduction(inst, fusion, ins, outs)   # type: ignore[arg-type]
        if split is not None:
            return split
        if not wrapped and _library_epilogue(fusion):
            # One cuBLASLt call with the epilogue, as the fusion pass priced it (split_gemm.py),
            # where the Triton template could also tile it.
            split = self._split(inst, ins, outs)   # type: ignore[arg-type]
            if split is not None:
                return split
        kernel = self._cuda_c_kernel(fusion)
        try:
            if kernel is None:
                kernel = compile_fusion(fusion, target=self.target, autotune=self.autotune,
                                        memo=self._codegen_memo)
        except TritonCodegenError as e:
            return host(f"Triton codegen: {str(e).splitlines()[0]}")
        if not wrapped and (kernel.template == "generic" and any(
                i.opcode == "dot" for i in fusion.attrs["calls"].instructions)
                or kernel.template == "gemm" and (_expensive_prologue(fusion)
                                                  or _f32_dot(fusion)
                                                  or self._library_faster(fusion))):
            split = self._split(inst, ins, outs)   # type: ignore[arg-type]
            if split is not None:
                return split
        fallback = self._host(inst, "Triton could not compile it") if wrapped else None
        return KernelThunk(inst, kernel, ins, outs, fusion,  # type: ignore[arg-type]
                           wrapped=wrapped, fallback=fallback)

    def _cuda_c_kernel(self, fusion: Instruction) -> Optional[Any]:
        """With ``HLOTK_LOOP_EMITTER`` auto or cuda on a GPU: the loop fusion's CUDA C
        kernel (codegen/cuda_c, compiled by NVRTC in the background from here on), or None
        where the fusion keeps Triton (not a loop fusion, predicted at or over
        ``AUTO_MAX_US`` under auto, an op or type the emitter declines, no NVRTC), the
        reason counted in ``stats`` for ``report()``."""
        if self.loop_emitter == "triton" or not self.on_gpu:
            return None
        from codegen.cuda_c import AUTO_MAX_US, CudaCDeclined, CudaCodegenError, takes
        from codegen.cuda_c.kernel import compile_loop_fusion
        from codegen.triton import compile_fusion
        from codegen.triton.kernel import classify
        if classify(fusion) != "loop":
            return None         # reductions, GEMMs, tiled transposes: Triton's templates
        estimate = None
        if self.loop_emitter == "auto":
            from passes.fusion.cost_model import DeviceSpecError, predict
            try:
                estimate = predict(fusion, self.target)
            except DeviceSpecError:
                return None
            # the flat form asked for only where it decides (a kernel at or over the bound)
            flat = estimate.time_us >= AUTO_MAX_US and _has_flat_form(fusion)
            if not takes(self.loop_emitter, estimate.time_us, flat=flat):
                self.stats["cuda_c_large"] = self.stats.get("cuda_c_large", 0) + 1
                return None
        declined = self.stats.setdefault("cuda_c_declined", [])
        try:
            kernel = compile_loop_fusion(
                fusion, arch=self._arch(), target=self.target, estimate=estimate,
                memo=self._codegen_memo,
                fallback=lambda: compile_fusion(fusion, target=self.target,
                                                autotune=self.autotune,
                                                memo=self._codegen_memo))
        except CudaCDeclined as e:
            declined.append(str(e))
            return None
        except CudaCodegenError as e:      # NVRTC cannot be loaded: every loop keeps Triton
            declined.append(f"%{fusion.name}: {e}")
            return None
        self.stats["cuda_c_kernels"] = self.stats.get("cuda_c_kernels", 0) + 1
        return kernel

    def _arch(self) -> str:
        import torch
        major, minor = torch.cuda.get_device_capability(self.device)
        return f"{major}{minor}"

    def _library_faster(self, fusion: Instruction) -> bool:
        """Whether this GEMM fusion runs faster as cuBLAS + an epilogue kernel on this
        target (split_gemm.library_gemm_reason); the reason goes to ``stats``."""
        from passes.fusion.cost_model import DeviceSpecError, get_device
        from passes.fusion.split_gemm import library_gemm_reason
        try:
            spec = get_device(self.target)
        except DeviceSpecError:
            return False
        comp = fusion.attrs["calls"]
        root = comp.root
        outs = list(root.operands) if root.opcode == "tuple" else [root]
        why = library_gemm_reason(list(comp.instructions), outs, spec)
        if why is not None:
            self.stats.setdefault("library_gemms", []).append(f"%{fusion.name}: {why}")
        return why is not None

    def _tiled_copy(self, inst: Instruction, copy: CopyThunk) -> Optional[Thunk]:
        """A copy that moves the minor dimension (a layout change such as the K-major copy
        of an 8-bit GEMM operand) as a tiled Triton transpose: torch's strided copy reads or
        writes one element per memory transaction there (370 µs for 64 MB of s8 on the H200,
        benchmarks/NOTES.md run 10). Any other copy stays a torch copy."""
        from codegen.triton import TritonCodegenError, compile_fusion
        from codegen.triton.templates import transpose_tile_dims
        if not inst.shape.is_array or inst.shape.dtype.name == "pred":
            return None
        fusion = one_instruction_fusion(inst)
        if transpose_tile_dims(fusion.attrs["calls"]) is None:
            return None
        try:
            kernel = compile_fusion(fusion, target=self.target, autotune=self.autotune,
                                    memo=self._codegen_memo)
        except TritonCodegenError:
            return None
        if kernel.template != "transpose":
            return None
        return KernelThunk(inst, kernel, copy.inputs, copy.outputs, fusion, wrapped=True,
                           fallback=copy)

    def _split(self, inst: Instruction, ins: list[Slot], outs: list[Slot]) -> Optional[Any]:
        """The GEMM fusion as prologue kernels + cuBLAS + epilogue kernel (split.py), as one
        SequenceThunk, or None."""
        from codegen.library.cublas import cublas_dot, cublas_epilogue_call
        from codegen.triton import TritonCodegenError, compile_fusion
        from .split import split_gemm_fusion
        n_scratch = len(self.scratch_sizes)

        def scratch(shape: Any) -> Slot:
            self.scratch_sizes.append(max(shape.byte_size, 1))
            return Slot(self._n_assigned + len(self.scratch_sizes) - 1, 0, shape)

        def kernel(f: Instruction, fins: list[Slot], fouts: list[Slot]) -> Thunk:
            k = compile_fusion(f, target=self.target, autotune=self.autotune,
                               memo=self._codegen_memo)
            if k.template == "generic":
                raise TritonCodegenError(f"part %{f.name} would be a generic kernel")
            return KernelThunk(f, k, fins, fouts, f)

        def library(dot: Instruction, dins: list[Slot], douts: list[Slot],
                    epilogue: Optional[Any] = None) -> Thunk:
            call = cublas_dot if epilogue is None else cublas_epilogue_call(epilogue)
            return LibraryThunk(dot, call, dins, douts)
        try:
            thunks = split_gemm_fusion(inst, ins, outs, scratch, kernel, library)
        except (TritonCodegenError, KeyError):
            thunks = None
        if thunks is None:
            del self.scratch_sizes[n_scratch:]
            return None
        self.stats["split_gemm_fusions"] = self.stats.get("split_gemm_fusions", 0) + 1
        return SplitThunk(inst, thunks)

    def _split_reduction(self, inst: Instruction, fusion: Instruction, ins: list[Slot],
                         outs: list[Slot]) -> Optional["SplitThunk"]:
        """A reduction with too few kept elements to fill the GPU (a loss to a scalar, a
        weight gradient over the token rows) as two kernels: partial reductions over P
        chunks of the reduced range into scratch buffers, then a finishing fusion that
        reduces the partials and computes the outputs (codegen/triton/reductions.py).
        None: one kernel does it."""
        from codegen.triton import TritonCodegenError, compile_fusion
        from codegen.triton.kernel import classify
        from codegen.triton.pdl import role as pdl_role
        from codegen.triton.reductions import finish_fusion, split_of, split_outputs
        if classify(fusion) != "rows":
            return None
        plan = split_of(fusion.attrs["calls"])
        if plan is None:
            return None
        try:
            part = compile_fusion(fusion, target=self.target, autotune=self.autotune, split=plan,
                                  memo=self._codegen_memo)
            fin_fusion = finish_fusion(fusion, plan)
            # HLOTK_PDL=split|all: the finishing kernel launches while the partials kernel
            # runs and waits for it at its top (codegen/triton/pdl.py)
            fin = compile_fusion(fin_fusion, target=self.target, autotune=self.autotune,
                                 pdl=pdl_role("split_finish"), memo=self._codegen_memo)
        except TritonCodegenError:
            return None
        if fin.template == "generic":
            return None
        full, kept = split_outputs(fusion.attrs["calls"])
        slots = []
        for shape in part.output_shapes[:len(part.output_shapes) - len(full)]:
            self.scratch_sizes.append(max(shape.byte_size, 1))
            slots.append(Slot(self._n_assigned + len(self.scratch_sizes) - 1, 0, shape))
        self.stats["split_reductions"] = self.stats.get("split_reductions", 0) + 1
        # The partials kernel also stores the full-shape outputs that need no reduction.
        return SplitThunk(inst, [
            KernelThunk(inst, part, ins, slots + [outs[k] for k in full], fusion),
            KernelThunk(inst, fin, ins + slots, [outs[k] for k in kept], fin_fusion)])

    def _host(self, inst: Instruction, reason: str) -> HostThunk:
        operand_leaves = [list(self.leaves(o).items()) for o in inst.operands]
        return HostThunk(inst, operand_leaves, list(self.leaves(inst).items()), reason)

    def _upload_constants(self) -> None:
        for comp in self.assignment.flow.computations:
            for inst in comp.instructions:
                if inst.opcode != "constant" or inst.literal is None:
                    continue
                for ix, shape in array_leaves(inst.shape):
                    slot = self.table[inst.uid][ix]
                    v = ar.leaf_of(inst.literal, ix)
                    self.fixed[slot.allocation] = ar.constant_bytes(v, shape, self.device)
        for alloc in self.assignment.allocations:
            if alloc.kind == "constant" and alloc.index not in self.fixed:
                self.fixed[alloc.index] = ar.allocate(alloc.size, self.device, "a constant")

    # --- running -------------------------------------------------------------------------
    def _parameter(self, x: Any, shape: Any, writable: bool) -> Any:
        """The parameter's bytes; a JAX array passed again reuses its DLPack tensor."""
        key = id(x)
        hit = self._dlpack.get(key)
        if hit is not None and hit[0]() is x and not writable:
            self._dlpack.move_to_end(key)
            return hit[1]
        raw = ar.parameter_bytes(x, shape, self.device, writable)
        if not writable and not isinstance(x, ar.np.ndarray):
            cache = self._dlpack
            try:
                # Dropped with the array: the tensor keeps the array's memory alive.
                ref = weakref.ref(x, lambda _r, k=key: cache.pop(k, None)
                                  if k in cache and cache[k][0] is _r else None)
            except TypeError:
                return raw
            self._dlpack[key] = (ref, raw)
            if len(self._dlpack) > 64:
                self._dlpack.popitem(last=False)
        return raw

    def memory(self, args: list[Any]) -> ar.Memory:
        a = self.assignment
        buffers: list[Any] = [None] * (len(a.allocations) + len(self.scratch_sizes))
        for k, t in self.fixed.items():
            buffers[k] = t
        for pnum, (leaves, arg) in enumerate(zip(self.parameter_slots, args)):
            for ix, slot in leaves:
                buffers[slot.allocation] = self._parameter(
                    ar.leaf_of(arg, ix), slot.shape, pnum in self.aliased_parameters)
        pooled = self._outputs.take() if self._outputs is not None else None
        if self._outputs is not None:
            key = "pooled_outputs" if pooled is not None else "fresh_outputs"
            self.stats[key] = self.stats.get(key, 0) + 1
        for alloc in a.allocations:
            if alloc.kind == "output":
                buffers[alloc.index] = pooled[alloc.index] if pooled is not None else \
                    ar.allocate(alloc.size, self.device, "an output")
        import torch
        for k, b in enumerate(buffers):
            if b is None and k < self._n_assigned:   # a parameter with no bytes (zero-size)
                buffers[k] = torch.zeros(max(a.allocations[k].size, 1), dtype=torch.uint8,
                                         device=self.device)
        if self.poison:
            for alloc in a.allocations:
                if alloc.kind in ("temp", "output"):
                    buffers[alloc.index].fill_(0xFF)
        return ar.Memory(buffers, frozenset(self.fixed), self._view_cache)

    def run(self, args: list[Any], output: str = "jax") -> list[Any]:
        """Run on the flat arguments (JAX arrays, torch tensors, numpy arrays; a tuple for a
        tuple parameter). Returns one value per array leaf of the result, as ``output``
        says: ``jax`` (DLPack, no copy), ``torch`` or ``numpy``."""
        if len(args) != len(self.parameter_slots):
            raise InvalidArgumentError(f"{self.module.name} takes {len(self.parameter_slots)} "
                                       f"arguments, got {len(args)}")
        if output not in ("jax", "torch", "numpy"):
            raise InvalidArgumentError(f"output must be 'jax', 'torch' or 'numpy', got {output!r}")
        if self.native is not None:       # the native path's launches share the arena
            __import__("torch").cuda.synchronize(self.device)
        clock = time.perf_counter
        t0 = clock()
        mem = self.memory(list(args))
        ctx = RunContext(self._eval_context(), self.stats)
        ctx.graphs = self.graphs          # type: ignore[attr-defined]
        self.stats["runs"] = self.stats.get("runs", 0) + 1
        t1 = clock()
        if self._precompiled and not self._untuned:
            self.sequence.run(mem, ctx)
        else:
            with self.first_run(mem):
                self.sequence.run(mem, ctx)
        t2 = clock()
        results, event = ar.output_values(mem, self.output_slots, output, self.device)
        t3 = clock()
        self._keep_alive(mem, event)
        t4 = clock()
        h = self.host_time
        h["calls"] += 1
        h["memory"] += t1 - t0
        h["thunks"] += t2 - t1
        h["results"] += t3 - t2
        h["keep-alive"] += t4 - t3
        if self.native is not None:
            __import__("torch").cuda.synchronize(self.device)
        return results

    def native_graph(self) -> Optional[Any]:
        """The executable as one patched CUDA graph (runtime/cuda/native), built on the first
        call; None where it keeps the Python path (``native_reason`` says why)."""
        if self._native_tried:
            return self.native
        self._native_tried = True
        from .errors import NativeLauncherError
        from .native import driver_library, front, launcher, warn_fallback
        reason = front.disabled() or launcher.eligibility(self) or front.jax_sees(self.device)
        if reason is None:
            prewarm.wait()        # the library may be building in the background
            try:
                driver_library()
            except NativeLauncherError as e:     # once per process: no compiler, no driver
                reason = f"the native launcher is unavailable: {e}"
                warn_fallback(reason, key="library")
        if reason is None:
            try:
                self.native = launcher.NativeGraph(self)
            except Exception as e:  # noqa: BLE001  (never worse than the Python path)
                reason = f"{type(e).__name__}: {e}"
                warn_fallback(f"{self.module.name}: the native launcher cannot run this "
                              f"executable ({reason})")
        self.native_reason = reason or "native"
        return self.native

    def _eval_context(self) -> EvalContext:
        """The interpreter context of host fallbacks: this GPU's partition of the run."""
        if self.comm is None:
            return EvalContext(Evaluator())
        return EvalContext(Evaluator(), partition_id=self.comm.rank,
                           num_partitions=self.comm.world)

    def _keep_alive(self, mem: ar.Memory, event: Any = None) -> None:
        """Keep this run's parameter tensors (other frameworks' memory, seen through DLPack)
        referenced until the device is done with them: the caller may drop its arrays as
        soon as we return, while our kernels are still queued. ``event``: one already
        recorded after the call's work (the JAX handoff's), else one is recorded here."""
        if not self.on_gpu:
            return
        import torch
        if event is None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        self._in_flight.append((event, [mem.buffers[k] for k in self._dynamic]))
        while len(self._in_flight) > 2 or (self._in_flight and self._in_flight[0][0].query()):
            old, _ = self._in_flight.pop(0)
            old.synchronize()

    def profile(self, args: list[Any], reps: int = 10) -> list[tuple[str, float]]:
        """Device time of each top-level thunk (ms, CUDA events around ``reps`` eager runs
        of it alone, after one warm-up run of the whole program): where the time goes.
        Thunks are re-run on whatever their operands hold, so only the times mean anything."""
        import torch
        self.run(list(args), output="torch")
        mem = self.memory(list(args))
        ctx = RunContext(self._eval_context(), {})
        out: list[tuple[str, float]] = []
        flat: list[Thunk] = []
        for t in self.sequence.thunks:
            flat.extend(t.thunks if isinstance(t, GraphSegment) else [t])
        # An asynchronous collective is timed as one unit: its start, then its done.
        from .collectives import AsyncDoneThunk, AsyncStartThunk
        done_of = {id(t.start): t for t in flat if isinstance(t, AsyncDoneThunk)}
        for t in flat:
            if isinstance(t, AsyncDoneThunk):
                continue
            parts = [t, done_of[id(t)]] if isinstance(t, AsyncStartThunk) else [t]

            def once() -> None:
                for part in parts:
                    part.run(mem, ctx)
            once()
            if self.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    once()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / reps
            else:
                t0 = time.perf_counter()
                for _ in range(reps):
                    once()
                ms = (time.perf_counter() - t0) * 1e3 / reps
            out.append((t.describe().strip().splitlines()[0], ms))
            kernel = getattr(t, "kernel", None)
            if self.on_gpu and kernel is not None and hasattr(kernel, "predicted_us"):
                from codegen.triton.autotune import record_measurement
                record_measurement(kernel, ms * 1e3, source="profile")
        return out

    @contextlib.contextmanager
    def first_run(self, mem: ar.Memory) -> Iterator[None]:
        """Around the first run (this one's, or the native graph's warm-up): every kernel
        compiled at once first, then one progress bar over the kernels it autotunes."""
        if not self._precompiled:
            self._precompile(mem)
        # The compile's deferred cache stores, while NVRTC's threads still compile (the
        # Triton pool's wait ran them already, where there was one).
        deferred.drain()
        # cuDNN's early start-up (prewarm.start_libraries) launched work of its own: done
        # before this run launches anything (and long before any graph capture).
        prewarm.wait_for("cudnn")
        if not self._untuned:
            yield
            return
        from codegen.triton.autotune import autotune_progress
        with autotune_progress(self._untuned, self.module.name):
            yield
        self._untuned = 0

    def _precompile(self, mem: ar.Memory) -> None:
        """Before the first launch: every Triton kernel (and every config autotuning will
        time) compiled at once in a process pool (codegen/triton/parallel.py) instead of
        one after another at each launch."""
        from codegen.triton.parallel import precompile
        self._precompiled = True
        t0 = time.perf_counter()
        jobs = []
        for t, configs in self._variant_thunks():
            k = t.kernel
            try:
                args = k._args(t._outs(mem)[0], [mem.view(s) for s in t.inputs])
            except Exception:  # noqa: BLE001  (the launch reports it)
                continue
            jobs += [(k, args, c) for c in configs]
        self.stats["precompile"] = precompile(jobs, self._collect_flash(mem),
                                              idle=lambda: self._while_compiling(mem))
        self.stats["precompile_s"] = time.perf_counter() - t0

    def _while_compiling(self, mem: ar.Memory) -> None:
        """This thread's work while the pool compiles: the compile's deferred cache stores,
        then each pure library call run once on a scratch output (cuDNN's and cuBLAS's
        set-up, plans and kernel loads: runtime/cuda/library_warm.py)."""
        deferred.drain()
        from . import library_warm
        if library_warm.enabled():
            prewarm.wait_for("cudnn")      # its early start-up, where one was begun
            self.stats["library_warm"] = library_warm.warm(self.thunks(), mem)

    def _flash_thunks(self) -> list[Any]:
        """The flash-attention thunks (forward and backward: hand-written Triton kernels
        whose candidates ``attention._pick`` times at their first launch)."""
        mods = ("codegen.triton.attention", "codegen.triton.attention_backward")
        return [t for t in self.thunks() if isinstance(t, LibraryThunk)
                and getattr(t.call, "__module__", "") in mods]

    def _collect_flash(self, mem: ar.Memory) -> list[tuple[str, str, str]]:
        """What the flash-attention thunks' first launches (every candidate they will time)
        would compile, as pool jobs: each call runs with ``parallel.collecting()`` on its
        inputs and scratch outputs shaped like its arena outputs (``scratch_like``: same
        strides and 16-byte alignment, so the same specialization; the arena is not
        written: an output may share bytes with a parameter an earlier thunk still reads),
        and its launches only report their specializations."""
        from codegen.triton.parallel import collecting
        jobs: list[tuple[str, str, str]] = []
        for t in self._flash_thunks():
            with collecting() as got:
                try:
                    outs = [scratch_like(mem.view(s)) for s in t.outputs]
                    t.call(t.inst, [mem.view(s) for s in t.inputs],
                           out=tuple(outs) if len(outs) > 1 else outs[0])
                except Exception:  # noqa: BLE001  (the launch compiles it, or reports it)
                    pass
            jobs += got
        return jobs

    def _variant_thunks(self) -> list[tuple[Any, list[dict]]]:
        """Each Triton kernel thunk not launched yet, with the configs its first call
        compiles: the kernel's own, or every candidate autotuning will time."""
        from codegen.triton.autotune import ranked_candidates
        from passes.fusion.cost_model import get_device
        out = []
        for t in self.thunks():
            if not isinstance(t, KernelThunk) or t.state != "new" or not hasattr(t.kernel, "plan"):
                continue
            k = t.kernel
            out.append((t, ranked_candidates(k, k.autotune, get_device(k.target)) if k.autotune
                        else [k.config]))
        return out

    def variants(self) -> list[tuple[Any, list[dict]]]:
        """(kernel, configs) its first call compiles (``prewarm.start_workers``)."""
        return [(t.kernel, configs) for t, configs in self._variant_thunks()]

    def _triton_kernels(self) -> list[Any]:
        return [t.kernel for t in self.thunks() if hasattr(getattr(t, "kernel", None), "plan")]

    # --- reports -------------------------------------------------------------------------
    def thunks(self) -> list[Thunk]:
        return [t for t in self.sequence.walk() if not isinstance(t, (GraphSegment, SequenceThunk))]

    def kernel_count(self) -> dict[str, int]:
        """Thunks by kind (kernel, library-call, copy, host-fallback, while ...)."""
        out: dict[str, int] = {}
        for t in self.thunks():
            out[t.kind] = out.get(t.kind, 0) + 1
        return out

    def host_fallbacks(self) -> list[HostThunk]:
        return [t for t in self.thunks() if isinstance(t, HostThunk)]

    def graph_segments(self) -> list[GraphSegment]:
        return [t for t in self.sequence.walk() if isinstance(t, GraphSegment)]

    def describe(self) -> str:
        """The thunk sequence, one line per thunk (graphs and nested sequences indented)."""
        return self.sequence.describe()

    def report(self) -> str:
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(self.kernel_count().items()))
        hf = self.host_fallbacks()
        lines = [f"{self.module.name} on {self.device} (target {self.target}): {kinds}; "
                 f"{len(self.graph_segments())} graph segments; arena "
                 f"{ar.human_bytes(self.assignment.temp_size)}",
                 f"stats: {dict((k, v) for k, v in self.stats.items() if not isinstance(v, list))}"]
        if hf:
            lines.append(f"{len(hf)} host fallbacks (break graphs): " + "; ".join(
                t.label() for t in hf[:8]) + (" ..." if len(hf) > 8 else ""))
        if ar.DLPACK_FALLBACK["count"]:
            lines.append(f"{ar.DLPACK_FALLBACK['count']} results left the device as host copies "
                         f"(DLPack to JAX failed: {ar.DLPACK_FALLBACK['public']}; fast path: "
                         f"{ar.DLPACK_FALLBACK['fast']})")
        for f in self.graphs.failures:
            lines.append(f"graph capture failed: {f}")
        lines += self.emitter_report()
        lines += self.host_report()
        return "\n".join(lines)

    def emitter_report(self) -> list[str]:
        """Which generator made the loop kernels (HLOTK_LOOP_EMITTER), why a loop fusion
        kept Triton, and which CUDA C kernels NVRTC failed on (Triton ran them)."""
        from codegen.cuda_c import AUTO_MAX_US
        if self.loop_emitter == "triton" or not self.on_gpu:
            return []
        declined = self.stats.get("cuda_c_declined", [])
        large = self.stats.get("cuda_c_large", 0)
        lines = [f"loop emitter {self.loop_emitter}: {self.stats.get('cuda_c_kernels', 0)} "
                 f"CUDA C kernels (NVRTC), {len(declined)} loop fusions kept Triton"
                 + (f", {large} without a flat form predicted at or over {AUTO_MAX_US:g} µs "
                    "made by Triton"
                    if large else "")]
        fell_back = [t.kernel for t in self.thunks() if getattr(
            getattr(t, "kernel", None), "fell_back", None)]
        lines += [f"  NVRTC failed, Triton launched: {k.name}: {k.fell_back}"
                  for k in fell_back[:8]]
        lines += [f"  kept Triton: {why}" for why in declined[:8]]
        if len(declined) > 8:
            lines.append(f"  ... and {len(declined) - 8} more")
        return lines

    def host_report(self) -> list[str]:
        """Which host path calls take, and the mean host time per call of its steps."""
        lines = []
        if self.native is not None:
            s = self.native.stats()
            calls, seconds = self.native_timing
            handler = s["gather_us"] + s["patch_us"] + s["launch_us"]
            lines.append(f"host path: native: {self.native.describe()}")
            if calls:
                total = seconds / calls * 1e6
                lines.append(
                    f"host us per call ({calls} calls): {total:.1f} in all = jax.jit dispatch "
                    f"+ XLA {total - handler:.1f}, FFI handler {handler:.1f} (gather addresses "
                    f"{s['gather_us']:.2f}, patch {s['nodes_patched'] / max(s['calls'], 1):.1f} "
                    f"nodes {s['patch_us']:.2f}, cuGraphLaunch {s['launch_us']:.2f})")
        else:
            lines.append(f"host path: python ({self.native_reason})")
        h = self.host_time
        if h["calls"]:
            steps = ", ".join(f"{k} {v / h['calls'] * 1e6:.1f}" for k, v in h.items() if k != "calls")
            lines.append(f"python path host us per call ({h['calls']} calls): {steps}")
        return lines


def _gathers_only(inst: Instruction) -> bool:
    """A gather, or a plain fusion holding gathers but none of the other ops only torch
    runs (scatter, sort, reduce-window): the Triton generator is tried first."""
    if inst.opcode == "gather":
        return True
    if inst.opcode != "fusion" or fusion_kind(inst) in ("attention", "attention_backward"):
        return False
    ops = {i.opcode for i in inst.attrs["calls"].instructions}
    return "gather" in ops and not ops & {"scatter", "sort", "reduce-window"}


def _f32_dot(fusion: Instruction) -> bool:
    """A GEMM fusion on f32 operands: Triton's TF32 GEMM measured 28-112 TFLOP/s on the
    H200 where cuBLAS reaches 390 (benchmarks/NOTES.md), so these run as cuBLAS + loops."""
    dots = [i for i in fusion.attrs["calls"].instructions if i.opcode == "dot"]
    return len(dots) == 1 and all(o.shape.dtype.name == "f32" for o in dots[0].operands)


def _library_epilogue(fusion: Instruction) -> bool:
    """A GEMM fusion of one dot on its parameters (or views of them) followed by an epilogue
    cuBLASLt applies itself (bias, GELU, ReLU: passes/fusion/split_gemm.epilogue_of_group)."""
    from passes.fusion.split_gemm import epilogue_of_group
    comp = fusion.attrs["calls"]
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]
    return epilogue_of_group(list(comp.instructions), outs) is not None


def _expensive_prologue(fusion: Instruction) -> bool:
    """A GEMM fusion whose dot operands are computed with transcendental functions (gelu's
    tanh before the second matmul of an MLP, say): the GEMM template recomputes an operand
    tile for every output tile that reads it (N / BLOCK_N times), which costs more than
    writing the operand out once and reading it back; such fusions are split. The fusion
    pass prices them the same way (split_gemm.transcendental_prologue)."""
    from passes.fusion.split_gemm import transcendental_prologue
    comp = fusion.attrs["calls"]
    dots = [i for i in comp.instructions if i.opcode == "dot"]
    if len(dots) != 1:
        return False
    return transcendental_prologue(dots[0], {id(i) for i in comp.instructions}) is not None


def scratch_like(view: Any) -> Any:
    """A fresh tensor with ``view``'s shape, dtype, device and strides whose address is
    16-byte aligned exactly when ``view``'s is (what Triton specializes a pointer on)."""
    import torch
    extent = 1 + sum((n - 1) * st for n, st in zip(view.shape, view.stride())) \
        if view.numel() else 0
    shift = 0 if view.data_ptr() % 16 == 0 else 1      # elements: 2+ bytes each
    buf = torch.empty(extent + shift, dtype=view.dtype, device=view.device)
    return torch.as_strided(buf, tuple(view.shape), tuple(view.stride()), shift)


def _operand_first(t: Thunk) -> list[Thunk]:
    """``[t]``, or ``[copy of the operand into the output, t]`` where ``t``'s kernel writes
    only a window of its output (an in-place dynamic-update-slice, ``Plan.in_place``) and
    buffer assignment did not give the output the operand's buffer."""
    plan = getattr(getattr(t, "kernel", None), "plan", None)
    p = getattr(plan, "in_place", None)
    if not isinstance(t, KernelThunk) or p is None:
        return [t]
    src, dst = t.inputs[p], t.outputs[0]
    if (src.allocation, src.offset) == (dst.allocation, dst.offset):
        return [t]
    return [BytesCopyThunk(t.inst, [src], [dst]), t]


class SplitThunk(SequenceThunk):
    """The thunks one split GEMM fusion or split reduction became (flattened into the
    enclosing sequence)."""


def _slice(a: BufferAssignment, inst: Instruction, ix: tuple[int, ...]) -> tuple[int, int]:
    alloc, offset = a.slice(inst, ix)
    return alloc.index, offset


class CudaBackend:
    """``BACKENDS["cuda"]``: builds a CudaExecutable for a compiled module."""

    def __init__(self, client: Any, device: Optional[str] = None):
        self.client = client
        self.device = resolve_device(device)    # fails now, clearly, without a GPU
        self.device_kind = (__import__("torch").cuda.get_device_name(self.device)
                            if self.device.type == "cuda" else "cpu (Triton interpreter)")
        prewarm.start(self.device)

    @property
    def fusion_target(self) -> Optional[str]:
        """The device spec the compile pipeline decides fusion for: this GPU's (h200, h100,
        a100 by name); None under Triton's interpreter (the pipeline's own default)."""
        return default_target(self.device) if self.device.type == "cuda" else None

    def compile_started(self, module: Module) -> None:
        """The client's compile of ``module`` begins (before its passes): library set-up
        it will need starts in the background (prewarm.start_libraries)."""
        if self.device.type == "cuda":
            prewarm.start_libraries(module, self.device)

    def prepare(self, module: Module, poison: Optional[bool] = None,
                target: Optional[str] = None) -> Any:
        from passes.scheduling import Schedule
        if not module.is_scheduled:
            module = module.clone()
            Schedule().run(module)
        target = target if target in ("h100", "h200", "a100") else None
        exe = CudaExecutable.build(module, device=str(self.device), poison=poison, target=target)
        prewarm.start_workers(exe)

        def run(args: list[Any], donated: frozenset[int] = frozenset()) -> list[Any]:
            return exe.run(args, output="numpy")

        def run_device(args: list[Any]) -> list[Any]:
            return exe.run(args, output="jax")
        run.module = module                  # type: ignore[attr-defined]
        run.executable = exe                 # type: ignore[attr-defined]
        run.run_device = run_device          # type: ignore[attr-defined]
        run.donated_parameters = []          # type: ignore[attr-defined]
        return run


def _has_flat_form(fusion: Instruction) -> bool:
    """Whether the CUDA C emitter takes this loop fusion in its flat form (cheap: no
    emitting), which ``auto`` sends to CUDA C at any size (codegen/cuda_c/__init__.py)."""
    from codegen.cuda_c import AUTO_FLAT_ANY_SIZE, decline_reason
    if not AUTO_FLAT_ANY_SIZE or decline_reason(fusion):
        return False
    from codegen.cuda_c.flat import flat_reason
    return not flat_reason(fusion)
