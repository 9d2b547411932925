"""Shape-generic loop kernels: flat indexing over a runtime element count.

The loop template indexes every value by its logical coordinates, worked out from the flat
program offset with the output's dims baked into the source (``lin // 1536``,
``offs < 3072``, ``tl.minimum(offs, 3071)``). So two fusions that compute the same thing
over arrays of different shapes generate different sources, and each is its own Triton
compile: adam_step's Adam update of an f32[3072] and of an f32[6144] parameter, or the
4-parameter updates over [768,1536], [1536,768] and [1536,1536], were five pool jobs for two
programs (issue 13: the cold first call waits for its slowest pool job).

Where a fusion is purely elementwise, the coordinates are not needed: every parameter is
either one element or has the outputs' dims in the outputs' memory order, all outputs have
the same dims and order, and no instruction reads another element than its own (no iota,
broadcast of more than one element, slice, transpose, reshape that moves elements, reduce,
dot, gather, concatenate, pad, reverse, dynamic slices, non-uniform array constants). Then
element ``i`` in memory of every full-size buffer is the same logical element, and the
kernel reads and writes ``ptr + offs`` for ``offs < n``, ``n`` the element count passed at
launch. The source no longer names a shape, so those fusions share one canonical text
(``canonical.py``), one file, one Triton compile per config and one tuning entry.

Correct only for buffers dense in their layout: the CUDA runtime's buffers are (arena and
parameter views carry the layout's strides, ``runtime/cuda/arena.py``), and
``TritonKernel.launch`` copies any other view into a dense one first
(``hlo.layout_util.dense_strides``).
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional, Sequence

from hlo.ir import Computation, Instruction
from hlo.layout_util import major_to_minor
from hlo.ops import OPS
from hlo.shape import Shape

# Where the element count (and so ``offs``) needs 64 bits: ``offs`` runs to a block past
# ``n``, and the largest block any candidate config uses is this.
MAX_BLOCK = 4096
# The one config of a flat kernel of more than one element: every size then compiles the same
# (source, config). A kernel of at most 1024 elements is one program either way; its
# time is the launch and one round trip to memory, which 8 elements a thread instead of 1
# does not change measurably, while a config per size class would be a compile each.
FLAT_CONFIG = {"BLOCK": 1024, "num_warps": 4, "num_stages": 1}
SCALAR_CONFIG = {"BLOCK": 16, "num_warps": 2, "num_stages": 1}


def flat_enabled() -> bool:
    """``HLOTK_FLAT_LOOPS`` (default on): "0" keeps every loop kernel in coordinates, as
    before (to compare the two forms in one tree)."""
    return os.environ.get("HLOTK_FLAT_LOOPS", "1").strip().lower() not in ("0", "off", "false",
                                                                            "no")


def _order(shape: Shape) -> Optional[tuple[int, ...]]:
    """The dims of more than one element in memory order (a size-1 dim's place in the layout
    moves no element); None for a tiled layout (its elements are not in that order)."""
    layout = shape.layout
    if layout is not None and "T(" in layout.extra:
        return None
    return tuple(d for d in major_to_minor(layout, shape.rank) if shape.dims[d] != 1)


def _numel(shape: Shape) -> int:
    return math.prod(shape.dims)


def _uniform(inst: Instruction) -> bool:
    """A constant the emitter writes as one literal (``Emitter._constant``)."""
    import numpy as np
    if inst.literal is None:
        return False
    arr = np.asarray(inst.literal)
    return arr.size == 1 or bool(arr.size and np.all(arr.reshape(-1) == arr.reshape(-1)[0]))


def flat_reason(comp: Computation, outs: list[Instruction]) -> str:
    """"" where ``comp`` (with outputs ``outs``) may be a flat kernel, else why not."""
    first = outs[0].shape
    if not first.is_array:
        return "a tuple-shaped output"
    order = _order(first)
    if order is None:
        return f"output %{outs[0].name} has a tiled layout"
    for o in outs:
        if not o.shape.is_array or o.shape.dims != first.dims:
            return f"outputs of different dims (%{o.name}: {o.shape})"
        if _order(o.shape) != order:
            return f"outputs in different layouts (%{o.name}: {o.shape})"
    for p in comp.parameters:
        if not p.shape.is_array:
            return f"parameter %{p.name} is a tuple"
        if _numel(p.shape) == 1:
            continue                     # read once, at its only element
        if p.shape.dims != first.dims:
            return f"parameter %{p.name} is {p.shape}, the outputs {first}"
        if _order(p.shape) != order:
            return f"parameter %{p.name} is laid out otherwise than the outputs ({p.shape})"
    for inst in comp.instructions:
        op = inst.opcode
        if op in ("parameter", "tuple"):
            continue
        if op == "get-tuple-element" and inst.operands[0].opcode == "tuple":
            continue
        if op == "constant" and _uniform(inst):
            continue
        if op == "broadcast" and _numel(inst.operands[0].shape) == 1:
            continue
        if op in ("reshape", "bitcast"):
            src = inst.operands[0].shape
            if _numel(src) == 1 or (src.dims == inst.shape.dims and
                                    (op == "reshape" or _order(src) == _order(inst.shape))):
                continue
        elif OPS.get(op) is not None and OPS[op].elementwise:
            continue
        return f"%{inst.name} ({op}) reads elements by their coordinates"
    return ""


def int_specialization(n: int) -> str:
    """How Triton specializes an integer kernel argument (3.6 to 3.9): 1 becomes the
    constant 1; otherwise its type (i32 / i64 / u64 by range) and whether 16 divides it
    (``D``). A flat kernel's ``n`` is such an argument, so one source still compiles once
    per class of ``n`` (every n of a few kilo-elements and up that 16 divides is one class);
    that is fine: the divisible class is the one that gets vector loads."""
    if n == 1:
        return "1"
    ty = "i32" if -2 ** 31 <= n < 2 ** 31 else "i64" if -2 ** 63 <= n < 2 ** 63 else "u64"
    return ty + ("D" if n % 16 == 0 else "")




def is_dense(dims: tuple[int, ...], strides: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether a view of ``dims`` with ``strides`` is laid out as ``want`` (the strides of a
    size-1 dim do not matter: no element steps over it)."""
    return strides == want or all(s == w for n, s, w in zip(dims, strides, want) if n != 1)


def dense_views(outputs: Sequence[Any], inputs: Sequence[Any], want: list
                ) -> tuple[list, list, list]:
    """(outputs, inputs, pending copies) for a flat kernel, which reads and writes memory
    order: every torch view not dense in its HLO layout (``want``: the dense strides of
    each input, then each output; the runtime hands none such, a caller may) is replaced by
    a dense copy (an output: a scratch, copied back after the launch through ``pending``'s
    ``(view, scratch)`` pairs)."""
    ins, outs, pending = list(inputs), list(outputs), []
    for k, t in enumerate(ins + outs):
        w = want[k]
        if is_dense(tuple(t.shape), tuple(t.stride()), w):
            continue
        dense = t.new_empty_strided(tuple(t.shape), w)
        if k < len(ins):
            ins[k] = dense.copy_(t)
        else:
            outs[k - len(ins)] = dense
            pending.append((t, dense))
    return outs, ins, pending
