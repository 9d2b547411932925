"""The flat form of a CUDA C loop kernel: a runtime element count and 16-byte vectors.

A fusion ``codegen/triton/flat_loop.flat_reason`` accepts (purely elementwise; every
parameter one element or dense in the outputs' memory order) needs no coordinates: element
``i`` in memory of every full-size buffer is the same logical element. Its CUDA C kernel
then reads and writes ``ptr[i]`` for ``i < n``, ``n`` a launch argument, so the source
names no shape and same-math fusions of every size share one NVRTC compile (as the Triton
flat kernels share one Triton compile).

Why a form of its own: the strided kernel (``emitter.emit_loop_kernel``) delinearizes a
64-bit index and reads each operand through runtime strides, 4 bytes at a time; on large
elementwise work it ran 25-80% slower than Triton's kernels (H200, NOTES "i13-nvrtc").
Here a thread owns chunks of ``CHUNK`` consecutive elements, ``CHUNK`` = 16 bytes of the
narrowest full-size type (4 f32, 8 bf16), and where every full-size pointer is 16-byte
aligned and the chunk is whole, each buffer moves as ``uint4`` words (one 16-byte load per
f32 operand per chunk, as XLA's elementwise kernels do). Otherwise (a misaligned view, the
last partial chunk) the same chunk is read element by element, past-the-end lanes reading
element ``n - 1`` and storing nothing. Every load of a chunk precedes its stores: an output
may share an input's buffer (buffer assignment), element for element.

Measured on the H200: an Adam step's kernels summed 199.0 µs per step against Triton's
210.4 run back to back (CUPTI; NOTES "i13-cudac-flat"); alone with their inputs in L2 they
are 3-15% slower than Triton's 8-elements-a-thread kernels. The step's CUDA graph replayed
with L2 flushed took 0.240-0.242 ms against Triton's 0.219-0.221 (NOTES session 8,
"i13-flat-sass"), but that replay runs on zeroed staging buffers: there every IEEE
division and square root of the Adam update takes NVRTC's slow path (a call; zero is
outside the fast paths' range), which Triton's approximate ``div.full`` / ``sqrt.approx``
never branch to. With Triton's instructions (``DIVSQRT_ENV=approx``) the same replay took
0.196 ms; on real Adam data, alone and L2 flushed, the modes are within a few % of each
other ([1536,1536] 21.7 µs, ncu: 70% of stalls waiting for memory either way). So the
SASS difference (16 branch-and-call regions a chunk, scheduled one after another, against
straight-line code) costs on zeros, not on the data a step sees: replayed on the call's own
arguments (session 9, final call A) the step took 0.2037 ms against Triton's 0.2201.
``DIVSQRT_ENV`` keeps a slow-path-free form of the same bits ("chunk": 0.1978 there) and
Triton's ("approx": 0.1974) to compare.

The grid strides over chunks (``c += gridDim.x * blockDim.x``), so the launch may cap the
grid without another source. Index arithmetic is 32-bit where ``n`` leaves room
(``INDEX32_MAX``), else 64-bit (another source, one compile more, only for such sizes).
Numerics are the strided emitter's: the same C expression per op (``CEmitter``).
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np

from hlo.ir import Computation, Instruction

from .emitter import C_STORED, CEmitter, CudaCodegenError, KernelSource, _header, kernel_name
from .prelude import prelude_for

FLAT_ENV = "HLOTK_CUDA_C_FLAT"            # "0": every loop kernel in the strided form
# "1": inputs as const T* __restrict__ (ld.global.nc). Off by default: no gain measured
# (H200, Adam step 199.3 against 199.0 µs), and an output may share an input's buffer,
# which __restrict__ declares impossible.
RESTRICT_ENV = "HLOTK_CUDA_C_RESTRICT"
LAUNCH_ENV = "HLOTK_CUDA_C_FLAT_LAUNCH"   # "threads[/waves]": the launch, to compare on a GPU
VECTOR_BYTES = 16
# Bytes of the narrowest full-size type a thread takes per chunk: one 16-byte vector, or
# more (``HLOTK_CUDA_C_FLAT_CHUNK=32|64``, to compare on a GPU). Measured (H200, adam_step's
# graph replays, L2 flushed, session 8): 16 bytes 0.243 ms, 32 0.314, 64 0.599, Triton's
# flat kernels 0.221. Not for want of coalescing: two or four 16-byte chunks a thread, a
# grid apart (every warp-wide load coalesced), took 0.312 and 0.500 ms (NOTES, session 8).
# No local memory either way (ptxas: 40 and 56 registers). Those replays ran on zeroed
# staging buffers, where each IEEE division and square root calls its slow path (see
# ``DIVSQRT_ENV``): more chunks a thread, more such calls one after another (i13-flat-sass).
CHUNK_ENV = "HLOTK_CUDA_C_FLAT_CHUNK"
# How a flat kernel divides and takes square roots of full-size f32 values (one-element
# values, before the loop, and f64 always use ``/`` and ``sqrt``):
# "ieee" (default): ``/`` and ``sqrtf`` per op: NVRTC emits each as a fast path, a check
#   and a branch to a call of the slow path (16 such branches in an Adam chunk of 4
#   elements, which ptxas schedules one after another). The slow path runs where an operand
#   is zero, subnormal, huge, inf or NaN: on the zeroed staging buffers of the graph-replay
#   benchmark (gpu_suite.device_ms), every division and root of the Adam step.
# "chunk": the same bits through the slow-path-free sequences of prelude.py's
#   ``hl_div_fast`` / ``hl_sqrt_fast`` (zero operands included), their operand checks ANDed
#   into ``hl_ok`` and one branch a chunk to an element loop with ``/`` and ``sqrtf``.
# "approx": Triton's ``div.full.f32`` and ``sqrt.approx.ftz.f32`` (other numerics).
# Measured (H200, NOTES "i13-flat-sass"): alone on real Adam data, L2 flushed, [1536,1536]
# 21.70 / 22.27 / 22.24 µs (ieee / chunk / approx), [1536,768] 14.34 / 13.79 / 13.50,
# (6144,) 5.66 / 4.96 / 4.74 (ncu: 70% of stalls wait for memory either way); adam_step's
# graph replay on zeros 0.240 / 0.456 / 0.196 ms, Triton 0.219 ("chunk" as measured then
# failed its checks on zeros; now zeros take its fast paths: unmeasured). No mode wins on
# real data, so the default keeps the kernels' numerics and source.
DIVSQRT_ENV = "HLOTK_CUDA_C_FLAT_DIVSQRT"
DIVSQRT_MODES = ("ieee", "chunk", "approx")
CHUNK_BYTES = 16
# 32-bit indices while every index the kernel forms fits: a chunk index plus one grid
# stride (at most the chunk count again) times CHUNK stays under 2 * n + 2^20.
INDEX32_MAX = 1 << 30
# Widest full-size type over the narrowest: more would make one chunk a long run of words
# per operand (f64 beside u8: 16 doubles a chunk); such fusions keep the strided form.
MAX_WIDTH_RATIO = 4
# The launch (the source reads blockDim and gridDim, so none of this is compiled in).
# Measured on the H200 (NOTES, i13-cudac-flat call 1), adam_step's kernel sum per step:
# 256 threads 199.0 µs, 128 threads 199.7, the grid capped at one wave 202.6 (Triton 210.4).
THREADS = 256        # threads per block
MIN_THREADS = 64     # a small n halves the block down to this while blocks < SMs
WAVES = 0            # 0: one chunk a thread (grid covers n); k: at most k waves of blocks


def flat_enabled() -> bool:
    return os.environ.get(FLAT_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def chunk_bytes() -> int:
    text = os.environ.get(CHUNK_ENV, "").strip()
    if not text:
        return CHUNK_BYTES
    if text not in ("16", "32", "64"):
        raise CudaCodegenError(f"{CHUNK_ENV}={text!r}: expected 16, 32 or 64")
    return int(text)


def divsqrt_mode() -> str:
    """``HLOTK_CUDA_C_FLAT_DIVSQRT``: ieee (default), chunk or approx (``DIVSQRT_ENV``)."""
    text = os.environ.get(DIVSQRT_ENV, "").strip().lower() or DIVSQRT_MODES[0]
    if text not in DIVSQRT_MODES:
        raise CudaCodegenError(f"{DIVSQRT_ENV}={text!r}: expected one of "
                               f"{', '.join(DIVSQRT_MODES)}")
    return text


def restrict_inputs() -> bool:
    return os.environ.get(RESTRICT_ENV, "0").strip().lower() in ("1", "on", "true", "yes")


def launch_shape() -> tuple[int, int, bool]:
    """(threads per block, waves cap, fixed) from ``HLOTK_CUDA_C_FLAT_LAUNCH`` ("256" or
    "256/4"; "," also separates; fixed: as given), else the defaults (not fixed: a small
    kernel's block is made smaller, ``fitted_threads``)."""
    text = os.environ.get(LAUNCH_ENV, "").strip()
    if not text:
        return THREADS, WAVES, False
    parts = text.replace("/", ",").split(",")
    try:
        threads = int(parts[0])
        waves = int(parts[1]) if len(parts) > 1 else WAVES
    except ValueError:
        threads = waves = -1
    if not (threads in (32, 64, 128, 256, 512, 1024) and 0 <= waves <= 64 and len(parts) <= 2):
        raise CudaCodegenError(f"{LAUNCH_ENV}={text!r}: expected THREADS[/WAVES], THREADS a "
                               "power of two from 32 to 1024, WAVES 0 to 64")
    return threads, waves, True


def fitted_threads(n: int, chunk: int, threads: int, sms: int) -> int:
    """Threads per block for ``n`` elements: ``threads`` halved (down to ``MIN_THREADS``)
    while the grid has fewer blocks than the GPU has multiprocessors. A small kernel is one
    memory round trip; more blocks spread it over more SMs. Measured on the H200 (call 1,
    Adam on f32[6144], 1536 chunks): 6 blocks of 256 took 2.24 µs, 12 of 128 2.11, and the
    strided kernel's 24 blocks of 256 (one element a thread) 1.70."""
    while threads > MIN_THREADS and -(-n // (chunk * threads)) < sms:
        threads //= 2
    return threads


def _numel(inst: Instruction) -> int:
    return math.prod(inst.shape.dims)


def _outputs(comp: Computation) -> list[Instruction]:
    root = comp.root
    return list(root.operands) if root.opcode == "tuple" else [root]


def flat_reason(fusion: Instruction) -> str:
    """"" where ``emit_flat_kernel`` takes this loop fusion (the caller checked
    ``emitter.decline_reason``), else why not."""
    from codegen.triton.flat_loop import flat_reason as triton_flat_reason
    if not flat_enabled():
        return f"{FLAT_ENV}=0"
    comp: Computation = fusion.attrs["calls"]
    outs = _outputs(comp)
    why = triton_flat_reason(comp, outs)
    if why:
        return why
    if _numel(outs[0]) <= 1:
        return "one output element (the strided form: no chunks)"
    sizes = [C_STORED_SIZE[p.shape.dtype.name] for p in comp.parameters if _numel(p) > 1]
    sizes += [C_STORED_SIZE[o.shape.dtype.name] for o in outs]
    if max(sizes) > MAX_WIDTH_RATIO * min(sizes):
        return (f"element sizes {min(sizes)} and {max(sizes)} bytes (more than "
                f"{MAX_WIDTH_RATIO}x apart)")
    return ""


# Bytes of each stored C type (C_STORED's spelling of every element type).
C_STORED_SIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                 "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


class FlatEmitter(CEmitter):
    """``CEmitter`` over flat element slots: a value is either one element for the whole
    kernel (a one-element instruction: index ``()``, computed once before the loop) or the
    chunk's element ``slot`` (index ``(str(slot),)``); loads of full-size parameters come
    from the chunk's registers."""

    def __init__(self, fusion_name: str, round_narrow_each_op: bool = True,
                 divsqrt: str = "ieee"):
        super().__init__(fusion_name, round_narrow_each_op)
        self.slot = "0"
        self.divsqrt = divsqrt      # DIVSQRT_ENV's modes, for full-size f32 values
        self.checks = 0             # hl_ok checks emitted ("chunk")

    def elementwise_expr(self, inst: Instruction, args: list[str]) -> str:
        op, out = inst.opcode, inst.shape.dtype
        if (self.divsqrt == "ieee" or op not in ("divide", "sqrt") or not out.is_float
                or out.name == "f64" or _numel(inst) == 1):
            return super().elementwise_expr(inst, args)
        if self.divsqrt == "approx":
            form = "hl_div_full({0}, {1})" if op == "divide" else "hl_sqrt_approx({0})"
            return self.narrow(form.format(*args), out)
        # "chunk": the fast path's result; its operands' check ANDed into the chunk's flag
        # (where one fails, emit_flat_kernel's element loop takes the chunk, IEEE ops)
        self.checks += 1
        if op == "divide":
            self.line(f"hl_ok &= hl_div_ok({args[0]}, {args[1]});")
            return self.narrow(f"hl_div_fast({args[0]}, {args[1]})", out)
        self.line(f"hl_ok &= hl_sqrt_ok({args[0]});")
        return self.narrow(f"hl_sqrt_fast({args[0]})", out)

    def value(self, inst: Instruction, idx) -> str:
        if inst.shape.is_array and _numel(inst) == 1:
            idx, scope = (), self.scopes[0]
        else:
            idx, scope = (self.slot,), self.scopes[-1]
        key = (id(inst), idx)
        for s in reversed(self.scopes):
            if key in s:
                return s[key]
        v = self._generate(inst, idx)
        scope[key] = v
        return v

    def _generate(self, inst: Instruction, idx) -> str:
        op = inst.opcode
        if op in ("reshape", "bitcast", "broadcast"):   # flat_reason: no element moves
            return self.value(inst.operands[0], idx)
        return super()._generate(inst, idx)

    def _load(self, inst: Instruction, idx, comment: str) -> str:
        n = inst.parameter_number
        if not idx:
            addr = f"p{n}[0]"
        elif idx[0].isdigit():
            addr = f"in{n}.x[{idx[0]}]"
        else:                   # the element loop's (emit_flat_kernel): loaded at its top
            addr = f"ld{n}"
        return self.assign(self.held(inst.shape.dtype), f"param{n}",
                           self.from_stored(addr, inst.shape.dtype), comment)


def _fast_ops(comp: Computation, mode: str) -> bool:
    """Whether ``mode`` ("chunk") gives the kernel fast paths to check: a full-size f32
    (or bf16/f16, held as float) division or square root (``FlatEmitter``)."""
    return mode == "chunk" and any(
        i.opcode in ("divide", "sqrt") and i.shape.is_array and i.shape.dtype.is_float
        and i.shape.dtype.name != "f64" and _numel(i) > 1 for i in comp.instructions)


def flat_fields(fusion: Instruction) -> dict:
    """What a flat ``KernelSource`` holds of the fusion's own sizes (its source names none):
    the parameters' and outputs' shapes and the element count."""
    comp: Computation = fusion.attrs["calls"]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    outs = _outputs(comp)
    return {"input_shapes": [p.shape for p in params],
            "output_shapes": [o.shape for o in outs], "elements": _numel(outs[0])}


# Attributes that name dims: a flat kernel reads none (a broadcast in a flat fusion is of
# one element, read once: flat_reason), so fusions differing only there share a source.
_DIM_ATTRS = {"broadcast": frozenset({"metadata", "dimensions"})}
_SKIP = frozenset({"metadata"})


def flat_key(fusion: Instruction, round_narrow_each_op: bool = True) -> Optional[tuple]:
    """A hashable value equal for two loop fusions whose flat kernels have the same source
    up to comments (the HLO names and text in them), whatever their sizes; None where the
    fusion has no flat form (``decline_reason`` or ``flat_reason``) or an attribute with no
    hashable form. Issue 13: an Adam step's 24 parameter updates of a dozen shapes are
    2-3 distinct flat kernels, emitted once each (``kernel.compile_loop_fusion``'s memo).

    What ``emit_flat_kernel`` reads, and so what the key holds: per instruction in order,
    its opcode, element type (a tuple's, per element), whether it is one element, its
    operands and control predecessors by position, parameter number, a constant's value
    (one element where uniform: all the emitter reads of it), attributes but metadata and
    a broadcast's dimensions; the root's position; the computation name's ``.finish``
    (``kernel_name``); ``round_narrow_each_op``, ``HLOTK_CUDA_C_RESTRICT``; and whether
    the element count needs 64-bit indices (``INDEX32_MAX``). Not the dims, layouts or
    element count themselves: the source takes ``n`` as an argument (``flat_fields``)."""
    from hlo.same import attrs_key
    from .emitter import decline_reason
    if decline_reason(fusion) or flat_reason(fusion):
        return None
    comp: Computation = fusion.attrs["calls"]
    pos = {id(i): k for k, i in enumerate(comp.instructions)}

    def ref(i: Instruction) -> tuple:
        return ("at", pos[id(i)]) if id(i) in pos else ("outside", i.name)

    rows = []
    try:
        for inst in comp.instructions:
            shape = inst.shape
            if shape.is_array:
                sk: tuple = (shape.dtype.name, _numel(inst) == 1)
            else:
                sk = ("tuple",) + tuple((e.dtype.name, math.prod(e.dims) == 1)
                                        if e.is_array else ("nested",) for e in shape.elements)
            lit = _literal_key(inst) if inst.opcode == "constant" else None
            attrs = inst.attrs
            # most fused instructions carry metadata only: attrs_key's () without its walk
            akey = () if not attrs or (len(attrs) == 1 and "metadata" in attrs) else \
                attrs_key(attrs, _DIM_ATTRS.get(inst.opcode, _SKIP), ref)
            rows.append((inst.opcode, sk, tuple(pos[id(o)] for o in inst.operands),
                         tuple(pos.get(id(c), -1) for c in inst.control_predecessors),
                         inst.parameter_number, lit, akey))
        key = ("flat", tuple(rows), pos[id(comp.root)], comp.name.endswith(".finish"),
               bool(round_narrow_each_op), restrict_inputs(), chunk_bytes(), divsqrt_mode(),
               _numel(_outputs(comp)[0]) > INDEX32_MAX)
        hash(key)
    except TypeError:           # an attribute value with no hashable form: emit
        return None
    return key


def _literal_key(inst: Instruction) -> tuple:
    """A constant as ``CEmitter._constant`` reads it in a flat kernel: a uniform one (what
    ``flat_reason`` lets through) by its first element, bit for bit; any other by all."""
    lit = inst.literal
    if lit is None:
        return ("elided",)
    arr = np.asarray(lit)
    flat = arr.reshape(-1)
    if arr.size == 1 or (arr.size and np.all(flat == flat[0])):
        return ("uniform", arr.dtype.str, flat[:1].tobytes())
    return ("array", arr.dtype.str, arr.shape, arr.tobytes())


def emit_flat_kernel(fusion: Instruction, round_narrow_each_op: bool = True) -> KernelSource:
    """The flat CUDA C kernel of a fusion ``flat_reason`` accepts (raises CudaCodegenError
    otherwise). Its arguments: input pointers, output pointers, then ``long long n``."""
    why = flat_reason(fusion)
    if why:
        raise CudaCodegenError(f"fusion %{fusion.name}: no flat form: {why}")
    comp: Computation = fusion.attrs["calls"]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    outs = _outputs(comp)
    n = _numel(outs[0])
    full = [p for p in params if _numel(p) > 1]
    narrowest = min(C_STORED_SIZE[x.shape.dtype.name] for x in full + outs)
    chunk = chunk_bytes() // narrowest
    em = FlatEmitter(fusion.name, round_narrow_each_op, divsqrt_mode())

    # One-element values (a step's bias correction: powf of a scalar) once a thread.
    for inst in comp.instructions:
        if inst.shape.is_array and _numel(inst) == 1 and inst.opcode != "tuple":
            em.value(inst, ())
    ptrs = [f"(unsigned long long)p{p.parameter_number}" for p in full]
    ptrs += [f"(unsigned long long)out{k}" for k in range(len(outs))]
    em.line(f"const bool vec = (({' | '.join(ptrs)}) & {VECTOR_BYTES - 1}ull) == 0ull;",
            "every full-size buffer 16-byte aligned: whole chunks move as uint4 words")
    em.line(f"const hl_index chunks = (n + {chunk - 1}) / {chunk};")
    em.line("for (hl_index c = (hl_index)blockIdx.x * (hl_index)blockDim.x + "
            "(hl_index)threadIdx.x; c < chunks; c += (hl_index)gridDim.x * "
            "(hl_index)blockDim.x) {")
    em.indent += 1
    em.line(f"const hl_index i = c * {chunk};", f"this chunk's first element of {chunk}")

    def words(dtype_name: str) -> int:
        return chunk * C_STORED_SIZE[dtype_name] // VECTOR_BYTES

    def vector_loads() -> None:
        for p in full:
            k = p.parameter_number
            for w in range(words(p.shape.dtype.name)):
                em.line(f"  in{k}.v[{w}] = ((const uint4*)(p{k} + i))[{w}];")

    def chunk_values() -> None:
        for k, o in enumerate(outs):
            em.line(f"union {{ uint4 v[{words(o.shape.dtype.name)}]; "
                    f"{C_STORED[o.shape.dtype.name]} x[{chunk}]; }} r{k};")
        for j in range(chunk):
            em.slot = str(j)
            em.scopes.append({})
            for k, o in enumerate(outs):
                v = em.value(o, (em.slot,))
                em.line(f"r{k}.x[{j}] = {em.to_stored(v, o.shape.dtype)};",
                        f"output {k}: %{o.name}")
            em.scopes.pop()

    def vector_stores() -> None:
        for k, o in enumerate(outs):
            for w in range(words(o.shape.dtype.name)):
                em.line(f"  ((uint4*)(out{k} + i))[{w}] = r{k}.v[{w}];")

    fast = _fast_ops(comp, em.divsqrt)
    if not fast:        # the kernel as before "chunk" (the same source, the same cubin)
        em.line(f"const bool whole = vec && i + {chunk} <= n;")
    for p in full:
        k, st = p.parameter_number, C_STORED[p.shape.dtype.name]
        em.line(f"union {{ uint4 v[{words(p.shape.dtype.name)}]; {st} x[{chunk}]; }} in{k};")
    if not fast:
        em.line("if (whole) {")
        vector_loads()
        em.line("} else {", "a misaligned view or the last chunk: element by element, "
                "past the end reading element n - 1")
        for p in full:
            k = p.parameter_number
            for j in range(chunk):
                at = "i" if j == 0 else f"(i + {j} < n ? i + {j} : n - 1)"
                em.line(f"  in{k}.x[{j}] = p{k}[{at}];")
        em.line("}")
        chunk_values()
        em.line("if (whole) {", "every load above came first: an output may share an input's "
                "buffer")
        vector_stores()
        em.line("} else {")
        for k, o in enumerate(outs):
            for j in range(chunk):
                em.line(f"  {'' if j == 0 else f'if (i + {j} < n) '}out{k}[i + {j}] = "
                        f"r{k}.x[{j}];")
        em.line("}")
    else:
        # "chunk": an aligned whole chunk through the fast paths; its stores stand where
        # every operand passed the checks (the same bits as "/" and sqrtf). Anything else
        # (a misaligned view, the last chunk, a failed check: a zero, subnormal, huge, inf
        # or NaN operand) takes the element loop below, with "/" and sqrtf. The other
        # chunks compute on zeros and store nothing: a branch around the loads alone keeps
        # them in one block, issued together (around the values too, ptxas sank the last
        # operand's load below the first values: two round trips to memory a chunk).
        em.line(f"bool hl_ok = vec && i + {chunk} <= n;",
                "aligned and whole, then every fast division and square root exact")
        em.line("if (hl_ok) {")
        vector_loads()
        em.line("} else {")
        em.line("  " + " = ".join(f"in{p.parameter_number}.v[{w}]" for p in full
                                   for w in range(words(p.shape.dtype.name)))
                + " = uint4{0u, 0u, 0u, 0u};")
        em.line("}")
        chunk_values()
        em.line("if (hl_ok) {", "every load above came first: an output may share an input's "
                "buffer")
        vector_stores()
        em.line("  continue;")
        em.line("}")
        # One element a trip of a loop kept rolled: one copy of the element's code and of
        # each op's slow path (NVRTC time). An element's loads before its stores, element i
        # of an output written after element i of every input was read (sharing is element
        # for element).
        em.line("#pragma unroll 1")
        em.line(f"for (int hl_j = 0; hl_j < {chunk} && i + hl_j < n; ++hl_j) {{",
                "rare: element by element, IEEE division and square root")
        em.indent += 1
        em.divsqrt, em.slot = "ieee", "hl_j"
        for p in full:
            k = p.parameter_number
            em.line(f"const {C_STORED[p.shape.dtype.name]} ld{k} = p{k}[i + hl_j];")
        em.scopes.append({})
        vals = [em.value(o, (em.slot,)) for o in outs]
        for k, (o, v) in enumerate(zip(outs, vals)):
            em.line(f"out{k}[i + hl_j] = {em.to_stored(v, o.shape.dtype)};",
                    f"output {k}: %{o.name}")
        em.scopes.pop()
        em.indent -= 1
        em.line("}")
    em.indent -= 1
    em.line("}")

    name = kernel_name(comp)
    restrict = " __restrict__" if restrict_inputs() else ""
    args: list[tuple[str, str]] = []
    sig: list[str] = []
    for p in params:
        t = f"const {C_STORED[p.shape.dtype.name]}*"
        args.append((t, f"p{p.parameter_number}"))
        sig.append(f"{t}{restrict} p{p.parameter_number}")
    for k, o in enumerate(outs):
        t = f"{C_STORED[o.shape.dtype.name]}*"
        args.append((t, f"out{k}"))
        sig.append(f"{t} out{k}")
    args.append(("long long", "n_elements"))
    sig.append("long long n_elements")
    wide = n > INDEX32_MAX
    index = ("typedef long long hl_index;  /* n > 2^30: 64-bit indices */" if wide else
             "typedef int hl_index;  /* n <= 2^30: 32-bit indices (no index overflows) */")
    body = "\n".join(em.lines)
    header = _header(fusion, comp, name, f"flat: chunks of {chunk} consecutive elements, the "
                     "element count n an argument (no shape in the code),")
    parts = [header, "", prelude_for(body + "\n".join(em.constants)), index]
    parts += em.constants
    parts += ["", f'extern "C" __global__ void {name}(\n    ' + ",\n    ".join(sig) + ") {",
              "  const hl_index n = (hl_index)n_elements;", body, "}"]
    source = "\n".join(p for p in parts if p) + "\n"
    return KernelSource(name=name, source=source, params=args, n_inputs=len(params),
                        n_outputs=len(outs), threads=THREADS, per_thread=chunk, flat=True,
                        **flat_fields(fusion))


def flat_blocks(n: int, chunk: int, threads: int, waves: int, sms: Optional[int]) -> int:
    """Blocks of a flat launch: one chunk a thread, or at most ``waves`` full waves of
    ``sms`` multiprocessors (2048 resident threads each) with the grid-stride loop."""
    blocks = max(1, -(-(-(-n // chunk)) // threads))
    if waves and sms:
        blocks = min(blocks, waves * sms * max(1, 2048 // threads))
    return blocks

