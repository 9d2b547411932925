"""Device thunks built from torch ops for what no Triton template takes: gather, scatter,
sort and reduce-window (alone, or inside a fusion the fusion pass made around them).

Without these the executable runs such instructions as ``HostThunk``s: a device -> host ->
device round trip through the reference interpreter, which also splits CUDA graphs. Here
each op is a handful of torch calls on arena views, with XLA's semantics as the interpreter
(hlo/evaluator) implements them:

- gather: start indices clamped so the slice stays inside the operand; the source index of
  every result element computed with integer tensor ops, then one ``torch.take``;
- scatter (one operand; add / multiply / maximum / minimum / replace): an update window that
  would leave the operand is skipped whole; replace with repeated indices keeps the last
  update in row-major update order (what the interpreter does);
- sort: comparators the interpreter classifies as one LT/GT compare on one operand's key
  (jnp.sort's NaN/-0 canonicalising total order included), as a stable ``torch.sort`` on
  integer keys, the other operands gathered with the permutation;
- reduce-window (one operand; add / multiply / maximum / minimum): pad with the reducer's
  identity, ``unfold`` every dimension (views, nothing copied), reduce, fold the init value
  in once (XLA's answer: padding is never reduced in, as in the interpreter's default
  numerics).

A fusion holding one of these ops is evaluated instruction by instruction with torch when
every other instruction of it is in ``_FUSED`` (data movement and the plain elementwise ops
whose torch meaning is XLA's); otherwise it stays on the host. Anything this module cannot
do exactly returns None from ``device_op_thunk`` and the caller keeps its host fallback.

Every thunk here is capturable: nothing reads device values on the host, no shape depends
on data (skipped scatter windows are masked, not filtered).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from hlo.evaluator.reductions import _sort_comparator, simple_binary_reducer
from hlo.ir import Instruction
from hlo.layout_util import major_to_minor
from runtime.thunks import Slot

from .arena import Memory, torch_dtype
from .thunks import RunContext, SlotThunk, overlaps

Fn = Callable[..., Any]          # torch tensors in, a tensor (or a tuple of them) out
Leaves = Callable[[Instruction], dict]

_INDEX_TYPES = {"s8", "s16", "s32", "s64", "u8", "u16", "u32"}
_FLOATS = {"f16", "bf16", "f32", "f64"}
_INTS = {"s8", "s16", "s32", "s64", "u8"}
# Element types torch computes with XLA's meaning (wrapping ints, IEEE floats).
_PLAIN = _FLOATS | _INTS | {"pred"}


def _dt(shape: Any) -> str:
    return shape.dtype.name


def _row_major_strides(dims: Sequence[int]) -> list[int]:
    out, step = [0] * len(dims), 1
    for d in reversed(range(len(dims))):
        out[d] = step
        step *= dims[d]
    return out


def _ints(inst: Instruction, name: str) -> tuple[int, ...]:
    return tuple(int(i) for i in inst.attrs.get(name, ()) or ())


def _along(size: int, dim: int, rank: int, device: Any) -> Any:
    """arange(size) shaped to broadcast along ``dim`` of a rank-``rank`` tensor."""
    import torch
    shape = [1] * rank
    shape[dim] = size
    return torch.arange(size, dtype=torch.int64, device=device).reshape(shape)


def _index_vectors(indices: Any, ivd: int) -> Any:
    """Start indices as int64 with the index vector as the last dim."""
    import torch
    iv = indices.to(torch.int64)
    return iv.unsqueeze(-1) if ivd == indices.dim() else iv.movedim(ivd, -1)


class _PerDevice:
    """A value computed once per device on first use (a run that is never captured: graph
    segments run eagerly the first time they see their addresses)."""

    def __init__(self, make: Callable[[Any], Any]):
        self.make, self.cache = make, {}

    def __call__(self, device: Any) -> Any:
        v = self.cache.get(device)
        if v is None:
            v = self.cache[device] = self.make(device)
        return v


# --- gather --------------------------------------------------------------------------------
def gather_fn(inst: Instruction) -> Optional[Fn]:
    """``f(operand, start_indices)`` with XLA's gather, or None."""
    op_shape, idx_shape = inst.operands[0].shape, inst.operands[1].shape
    if _dt(idx_shape) not in _INDEX_TYPES:
        return None
    offset_dims = sorted(_ints(inst, "offset_dims"))
    collapsed = _ints(inst, "collapsed_slice_dims")
    start_map = _ints(inst, "start_index_map")
    op_batching = _ints(inst, "operand_batching_dims")
    idx_batching = _ints(inst, "start_indices_batching_dims")
    sizes = _ints(inst, "slice_sizes")
    ivd = int(inst.attrs.get("index_vector_dim", idx_shape.rank))
    dims, out_dims = tuple(op_shape.dims), tuple(inst.shape.dims)
    out_rank = len(out_dims)
    batch_out = [d for d in range(out_rank) if d not in offset_dims]
    window_dims = [d for d in range(len(dims)) if d not in collapsed and d not in op_batching]
    idx_batch_dims = [s for d, s in enumerate(idx_shape.dims) if d != ivd]
    n_components = idx_shape.dims[ivd] if ivd < idx_shape.rank else 1
    if (len(window_dims) != len(offset_dims) or len(sizes) != len(dims)
            or n_components != len(start_map) or len(op_batching) != len(idx_batching)
            or idx_batch_dims != [out_dims[d] for d in batch_out]
            or any(dims[d] - sizes[d] < 0 for d in start_map)):
        return None
    strides = _row_major_strides(dims)
    batch_shape = [out_dims[d] if d in batch_out else 1 for d in range(out_rank)]

    def static_part(device: Any) -> Any:
        """The index contribution that does not depend on the indices' values."""
        import torch
        flat = torch.zeros([1] * out_rank, dtype=torch.int64, device=device)
        for d_op, d_idx in zip(op_batching, idx_batching):
            d_out = batch_out[d_idx if d_idx < ivd else d_idx - 1]
            flat = flat + _along(out_dims[d_out], d_out, out_rank, device) * strides[d_op]
        for d_out, d_op in zip(offset_dims, window_dims):
            flat = flat + _along(out_dims[d_out], d_out, out_rank, device) * strides[d_op]
        return flat
    static = _PerDevice(static_part)

    def run(operand: Any, indices: Any) -> Any:
        iv = _index_vectors(indices, ivd)
        flat = static(operand.device)
        for k, d in enumerate(start_map):
            start = iv[..., k].clamp(0, dims[d] - sizes[d])      # XLA: the slice fits
            flat = flat + start.reshape(batch_shape) * strides[d]
        return operand.take(flat.expand(out_dims))
    return run


# --- scatter -------------------------------------------------------------------------------
def _scatter_combiner(inst: Instruction) -> Optional[str]:
    """'replace', 'add', 'multiply', 'maximum' or 'minimum', or None."""
    comp = inst.attrs.get("to_apply")
    if comp is None or len(comp.parameters) != 2:
        return None
    root = comp.root
    if root.opcode == "parameter" and root.parameter_number == 1:
        return "replace"                  # the combiner returns the update
    op = simple_binary_reducer(comp)
    return op if op in ("add", "multiply", "maximum", "minimum") else None


def _identity(op: str, dtype: Any) -> Any:
    """A value that leaves every element unchanged under ``op`` (-0.0 for a float add:
    x + -0.0 == x for x = -0.0 too)."""
    import torch
    if op == "add":
        return -0.0 if dtype.is_floating_point else 0
    if op == "multiply":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if op == "maximum" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if op == "maximum" else info.max


def scatter_into_fn(inst: Instruction) -> Optional[Fn]:
    """``f(work, indices, updates)``: scatters into ``work`` (a contiguous tensor holding
    the operand's values) in place, or None."""
    if len(inst.operands) != 3:
        return None                        # variadic scatter
    op_shape, idx_shape, upd_shape = (o.shape for o in inst.operands)
    op = _scatter_combiner(inst)
    dtype = _dt(op_shape)
    if op is None or _dt(idx_shape) not in _INDEX_TYPES or dtype not in _PLAIN \
            or (dtype == "pred" and op != "replace"):
        return None
    window_upd = sorted(_ints(inst, "update_window_dims"))
    inserted = _ints(inst, "inserted_window_dims")
    to_operand = _ints(inst, "scatter_dims_to_operand_dims")
    in_batching = _ints(inst, "input_batching_dims")
    idx_batching = _ints(inst, "scatter_indices_batching_dims")
    ivd = int(inst.attrs.get("index_vector_dim", idx_shape.rank))
    dims, upd_dims = tuple(op_shape.dims), tuple(upd_shape.dims)
    upd_rank = len(upd_dims)
    scatter_upd = [d for d in range(upd_rank) if d not in window_upd]
    window_in = [d for d in range(len(dims)) if d not in inserted and d not in in_batching]
    idx_batch_dims = [s for d, s in enumerate(idx_shape.dims) if d != ivd]
    n_components = idx_shape.dims[ivd] if ivd < idx_shape.rank else 1
    if (len(window_in) != len(window_upd) or n_components != len(to_operand)
            or idx_batch_dims != [upd_dims[d] for d in scatter_upd]
            or len(in_batching) != len(idx_batching)):
        return None
    window_size = [1] * len(dims)
    for d_upd, d_in in zip(window_upd, window_in):
        window_size[d_in] = upd_dims[d_upd]
    strides = _row_major_strides(dims)
    batch_shape = [upd_dims[d] if d in scatter_upd else 1 for d in range(upd_rank)]

    def static_part(device: Any) -> Any:
        import torch
        flat = torch.zeros([1] * upd_rank, dtype=torch.int64, device=device)
        for d_upd, d_in in zip(window_upd, window_in):
            flat = flat + _along(upd_dims[d_upd], d_upd, upd_rank, device) * strides[d_in]
        return flat
    static = _PerDevice(static_part)

    def targets(indices: Any, device: Any) -> tuple[Any, Any]:
        """Flat operand index of every update element, and whether its window fits."""
        import torch
        iv = _index_vectors(indices, ivd)
        start: dict[int, Any] = {}
        for k, d in enumerate(to_operand):
            start[d] = start.get(d, 0) + iv[..., k].reshape(batch_shape)
        for d_in, d_idx in zip(in_batching, idx_batching):
            d_upd = scatter_upd[d_idx if d_idx < ivd else d_idx - 1]
            start[d_in] = start.get(d_in, 0) + _along(upd_dims[d_upd], d_upd, upd_rank, device)
        flat = static(device)
        valid = torch.ones([1] * upd_rank, dtype=torch.bool, device=device)
        for d, s in start.items():
            valid = valid & (s >= 0) & (s + window_size[d] <= dims[d])
            flat = flat + s * strides[d]
        return flat.expand(upd_dims), valid.expand(upd_dims)

    def run(work: Any, indices: Any, updates: Any) -> None:
        import torch
        flat, valid = targets(indices, work.device)
        out = work.view(-1)
        upd = updates.reshape(-1)
        flat, valid = flat.reshape(-1), valid.reshape(-1)
        if op == "replace":
            # The last valid update of each element wins: the winner's ordinal per element
            # by a max-scatter into a table one longer (skipped updates land in the extra).
            n = out.numel()
            ordinal = torch.arange(upd.numel(), dtype=torch.int64, device=work.device)
            win = torch.full((n + 1,), -1, dtype=torch.int64, device=work.device)
            win.scatter_reduce_(0, torch.where(valid, flat, n), ordinal, "amax")
            win = win[:n]
            out.copy_(torch.where(win >= 0, upd[win.clamp(min=0)], out))
            return
        # Skipped updates become the combiner's identity at element 0: no data-dependent
        # shapes, so the thunk stays capturable.
        vals = torch.where(valid, upd, torch.full_like(upd, _identity(op, upd.dtype)))
        where = torch.where(valid, flat, 0)
        if op == "add":
            # Atomic adds, as XLA's GPU scatter does (the order of equal-index sums is not
            # fixed). index_put_(accumulate=True) sorted the indices first: 1.5 ms of the
            # held-out GPT step's 4.4 went to its embedding gradient (3.1 M updates).
            out.scatter_add_(0, where, vals)
        else:
            out.scatter_reduce_(0, where, vals, {"multiply": "prod", "maximum": "amax",
                                                 "minimum": "amin"}[op])
    return run


def scatter_fn(inst: Instruction) -> Optional[Fn]:
    """``f(operand, indices, updates)`` returning a new tensor, or None."""
    into = scatter_into_fn(inst)
    if into is None:
        return None

    def run(operand: Any, indices: Any, updates: Any) -> Any:
        work = operand.contiguous().clone()
        into(work, indices, updates)
        return work
    return run


# --- sort ----------------------------------------------------------------------------------
_KEY_INT = {"f16": "int16", "bf16": "int16", "f32": "int32", "f64": "int64"}


def _order_keys(x: Any, dtype: str, canonical: bool) -> Any:
    """Integer keys sorting as the interpreter's ``_keys_for``: floats by XLA's total order
    (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN), after mapping -0 to +0 and every NaN
    to +NaN when the comparator canonicalises (or is a plain FLOAT compare)."""
    import torch
    if dtype == "pred":
        return x.to(torch.int8)
    if dtype in ("u16", "u32"):
        return x.to(torch.int64)
    if dtype not in _FLOATS:
        return x
    if canonical:
        x = torch.where(x == 0, torch.zeros_like(x), x)
        x = torch.where(torch.isnan(x), torch.full_like(x, float("nan")).abs(), x)
    bits = x.view(getattr(torch, _KEY_INT[dtype]))
    mag = (1 << (bits.element_size() * 8 - 1)) - 1
    return torch.where(bits < 0, bits ^ mag, bits)


def sort_fn(inst: Instruction) -> Optional[Fn]:
    """``f(*operands)`` returning the sorted operands (a tuple), or None."""
    recog = _sort_comparator(inst.attrs["to_apply"])
    if recog is None or not inst.operands:
        return None
    direction, which, ctype, canonical = recog
    if which >= len(inst.operands):
        return None
    key_type = _dt(inst.operands[which].shape)
    if key_type not in _PLAIN | {"u16", "u32"} or any(
            torch_dtype(o.shape.dtype) is None for o in inst.operands):
        return None
    # A FLOAT (not TOTALORDER) compare is canonicalised too, as the interpreter does.
    canonical = canonical or ctype != "TOTALORDER"
    dims = inst.attrs.get("dimensions", (0,))
    d = int(dims[0]) if dims else 0

    def run(*xs: Any) -> tuple:
        import torch
        keys = _order_keys(xs[which], key_type, canonical)
        _, perm = torch.sort(keys, dim=d, stable=True, descending=direction == "GT")
        return tuple(x.gather(d, perm) for x in xs)
    return run


# --- reduce-window -------------------------------------------------------------------------
_REDUCERS = ("add", "multiply", "maximum", "minimum")


def _reduce_dims(x: Any, op: str, dims: Sequence[int]) -> Any:
    import torch
    if not dims:
        return x
    if op == "add":
        return x.sum(dim=tuple(dims))
    if op == "maximum":
        return x.amax(dim=tuple(dims))
    if op == "minimum":
        return x.amin(dim=tuple(dims))
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d)
    return x


def _combine(op: str, a: Any, b: Any) -> Any:
    import torch
    return {"add": torch.add, "multiply": torch.mul, "maximum": torch.maximum,
            "minimum": torch.minimum}[op](a, b)


def _compute_dtype(dtype: str) -> Any:
    """f32 for narrow floats (the interpreter accumulates them in f32 too)."""
    from hlo import dtypes
    return torch_dtype(dtypes.F32 if dtype in ("f16", "bf16") else dtypes.by_name(dtype))


def reduce_window_fn(inst: Instruction) -> Optional[Fn]:
    """``f(operand, init)`` with XLA's reduce-window, or None."""
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        return None
    op = simple_binary_reducer(inst.attrs["to_apply"])
    dtype = _dt(inst.shape)
    window = inst.attrs.get("window")
    x_shape = inst.operands[0].shape
    if op not in _REDUCERS or dtype not in _FLOATS | _INTS or window is None \
            or len(window.dims) != x_shape.rank:
        return None
    wdims = window.dims
    if any(w.size < 1 or w.stride < 1 or w.window_dilation < 1 or w.base_dilation < 1
           for w in wdims):
        return None
    padded_dims, keep = [], []
    for s, w in zip(x_shape.dims, wdims):
        dil = (s - 1) * w.base_dilation + 1 if s else 0
        full = dil + max(w.padding_low, 0) + max(w.padding_high, 0)
        padded_dims.append(full)
        keep.append(slice(-min(w.padding_low, 0), full + min(w.padding_high, 0)))
    out_dims = []
    for k, w in zip(keep, wdims):
        n = k.stop - k.start
        span = (w.size - 1) * w.window_dilation + 1
        out_dims.append(0 if n < span else (n - span) // w.stride + 1)
    if tuple(out_dims) != tuple(inst.shape.dims) or 0 in out_dims:
        return None
    place = tuple(slice(max(w.padding_low, 0), max(w.padding_low, 0) + ((s - 1) * w.base_dilation
                                                                        + 1 if s else 0),
                        w.base_dilation) for s, w in zip(x_shape.dims, wdims))
    rank = x_shape.rank
    cdt = _compute_dtype(dtype)

    def run(x: Any, init: Any) -> Any:
        import torch
        xc, ic = x.to(cdt), init.to(cdt)
        # Padding and base-dilation holes hold the reducer's identity, and the init value is
        # folded in once: what jax.jit (XLA) returns. The reference interpreter fills them
        # with the init value instead; the two differ only for a non-identity init.
        padded = torch.full(padded_dims, _identity(op, cdt), dtype=cdt, device=x.device)
        padded[place] = xc
        w = padded[tuple(keep)]
        for d, wd in enumerate(wdims):
            w = w.unfold(d, (wd.size - 1) * wd.window_dilation + 1, wd.stride)
            if wd.window_dilation > 1:
                w = w[..., ::wd.window_dilation]
        acc = _reduce_dims(w, op, range(rank, 2 * rank))
        return _combine(op, acc, ic).to(x.dtype)    # the init value folded in once
    return run


# --- fusions around these ops --------------------------------------------------------------
def _elementwise(fn: Callable[..., Any], types: set[str]) -> Callable[[Instruction], Optional[Fn]]:
    def build(inst: Instruction) -> Optional[Fn]:
        if any(_dt(o.shape) not in types for o in inst.operands):
            return None
        return fn
    return build


def _torch(name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        import torch
        return getattr(torch, name)(*args)
    call.__name__ = name
    return call


_CMP = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}


def _compare(inst: Instruction) -> Optional[Fn]:
    name = _CMP.get(str(inst.attrs.get("direction", "")))
    if name is None or inst.attrs.get("type") == "TOTALORDER" or any(
            _dt(o.shape) not in _PLAIN for o in inst.operands):
        return None
    return _torch(name)


def _select(inst: Instruction) -> Optional[Fn]:
    if any(_dt(o.shape) not in _PLAIN for o in inst.operands):
        return None
    return _torch("where")


def _convert(inst: Instruction) -> Optional[Fn]:
    src, dst = _dt(inst.operands[0].shape), _dt(inst.shape)
    # float -> int saturates (NaN -> 0) in XLA; torch's cast does not: left to the host.
    if src not in _PLAIN or dst not in _PLAIN or (src in _FLOATS and dst in _INTS):
        return None
    target = torch_dtype(inst.shape.dtype)
    return lambda x: x.to(target)


def _broadcast(inst: Instruction) -> Optional[Fn]:
    bdims = list(_ints(inst, "dimensions"))
    out = list(inst.shape.dims)
    order = sorted(range(len(bdims)), key=lambda i: bdims[i])
    shape = [1] * len(out)
    for i in order:
        shape[bdims[i]] = out[bdims[i]]

    def run(x: Any) -> Any:
        return x.permute(order).reshape(shape).expand(out)
    return run


def _bitcast(inst: Instruction) -> Optional[Fn]:
    """The same bytes read with another shape and layout: logical -> memory order ->
    the new shape's memory order -> its logical dims."""
    src, dst = inst.operands[0].shape, inst.shape
    if src.dtype != dst.dtype:
        return None
    m_src = list(major_to_minor(src.layout, src.rank))
    m_dst = list(major_to_minor(dst.layout, dst.rank))
    phys_dst = [dst.dims[d] for d in m_dst]
    back = [m_dst.index(d) for d in range(dst.rank)]

    def run(x: Any) -> Any:
        return x.permute(m_src).reshape(phys_dst).permute(back)
    return run


def _slice(inst: Instruction) -> Optional[Fn]:
    spec = inst.attrs["slice"].dims
    sl = tuple(slice(d.start, d.limit, d.stride) for d in spec)
    return lambda x: x[sl]


def _concatenate(inst: Instruction) -> Optional[Fn]:
    d = _ints(inst, "dimensions")[0]
    return lambda *xs: _torch("cat")(list(xs), d)


def _iota(inst: Instruction) -> Optional[Fn]:
    d, dims = int(inst.attrs["iota_dimension"]), list(inst.shape.dims)
    td = torch_dtype(inst.shape.dtype)
    if _dt(inst.shape) not in _PLAIN - {"pred"}:
        return None
    static = _PerDevice(lambda dev: _along(dims[d], d, len(dims), dev).to(td).expand(dims))
    return static          # called with the device: it has no operands


def _reduce(inst: Instruction) -> Optional[Fn]:
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        return None
    op = simple_binary_reducer(inst.attrs["to_apply"])
    dtype = _dt(inst.shape)
    if op not in _REDUCERS or dtype not in _FLOATS | _INTS:
        return None
    axes, cdt = _ints(inst, "dimensions"), _compute_dtype(dtype)

    def run(x: Any, init: Any) -> Any:
        ic = init.to(cdt)
        if x.numel() == 0:
            return ic.expand(tuple(inst.shape.dims)).to(x.dtype)
        return _combine(op, _reduce_dims(x.to(cdt), op, axes), ic).to(x.dtype)
    return run


def _reshape(inst: Instruction) -> Optional[Fn]:
    dims = tuple(inst.shape.dims)
    return lambda x: x.reshape(dims)


def _transpose(inst: Instruction) -> Optional[Fn]:
    perm = _ints(inst, "dimensions")
    return lambda x: x.permute(perm)


def _reverse(inst: Instruction) -> Optional[Fn]:
    dims = _ints(inst, "dimensions")
    return lambda x: x.flip(dims) if dims else x


def _copy(inst: Instruction) -> Optional[Fn]:
    return lambda x: x          # a layout change: nothing to do on logical views


_ARITH = _FLOATS | _INTS
# What may sit in a fusion beside the ops above: data movement, and elementwise ops whose
# torch meaning is XLA's on these element types (ints wrap; max/min propagate NaN).
_FUSED: dict[str, Callable[[Instruction], Optional[Fn]]] = {
    "add": _elementwise(_torch("add"), _ARITH),
    "subtract": _elementwise(_torch("sub"), _ARITH),
    "multiply": _elementwise(_torch("mul"), _ARITH),
    "divide": _elementwise(_torch("div"), _FLOATS),       # int division has XLA's own rules
    "negate": _elementwise(_torch("neg"), _ARITH),
    "maximum": _elementwise(_torch("maximum"), _ARITH),
    "minimum": _elementwise(_torch("minimum"), _ARITH),
    "abs": _elementwise(_torch("abs"), _FLOATS),
    "exponential": _elementwise(_torch("exp"), _FLOATS),
    "log": _elementwise(_torch("log"), _FLOATS),
    "sqrt": _elementwise(_torch("sqrt"), _FLOATS),
    "rsqrt": _elementwise(_torch("rsqrt"), _FLOATS),
    "tanh": _elementwise(_torch("tanh"), _FLOATS),
    "sine": _elementwise(_torch("sin"), _FLOATS),
    "cosine": _elementwise(_torch("cos"), _FLOATS),
    "logistic": _elementwise(_torch("sigmoid"), _FLOATS),
    "floor": _elementwise(_torch("floor"), _FLOATS),
    "ceil": _elementwise(_torch("ceil"), _FLOATS),
    "round-nearest-even": _elementwise(_torch("round"), _FLOATS),   # ties to even
    "and": _elementwise(_torch("bitwise_and"), _INTS | {"pred"}),
    "or": _elementwise(_torch("bitwise_or"), _INTS | {"pred"}),
    "xor": _elementwise(_torch("bitwise_xor"), _INTS | {"pred"}),
    "not": _elementwise(_torch("bitwise_not"), _INTS | {"pred"}),
    "compare": _compare, "select": _select, "convert": _convert,
    "broadcast": _broadcast, "bitcast": _bitcast, "reshape": _reshape, "copy": _copy,
    "transpose": _transpose, "slice": _slice, "concatenate": _concatenate, "iota": _iota,
    "reverse": _reverse, "reduce": _reduce,
}

# The ops this module exists for: opcode -> builder of the torch function.
BUILDERS: dict[str, Callable[[Instruction], Optional[Fn]]] = {
    "gather": gather_fn, "scatter": scatter_fn, "sort": sort_fn,
    "reduce-window": reduce_window_fn,
}
# Opcodes device_op_thunk may take (a fusion only when it holds one of BUILDERS' ops).
DEVICE_OPS = frozenset(BUILDERS) | {"fusion"}


def _constant(inst: Instruction) -> Optional[Fn]:
    """A small constant of a fusion body, uploaded once per device."""
    import torch
    td = torch_dtype(inst.shape.dtype)
    if inst.literal is None or inst.shape.is_tuple or td is None:
        return None
    host = np.ascontiguousarray(np.asarray(inst.literal, dtype=inst.shape.dtype.np_dtype)
                                .reshape(-1))
    dims = tuple(inst.shape.dims)
    static = _PerDevice(lambda dev: torch.from_numpy(host.view(np.uint8).copy()).view(td)
                        .reshape(dims).to(dev))
    return static          # called with the device: it has no operands


def fusion_program(fusion: Instruction) -> Optional[list[tuple[Instruction, Fn]]]:
    """The fusion body as (instruction, torch function) in order, parameters excluded; None
    unless it holds one of BUILDERS' ops and every instruction has a torch function."""
    comp = fusion.attrs["calls"]
    if not any(i.opcode in BUILDERS for i in comp.instructions):
        return None
    program = []
    for i in comp.instructions:
        if i.opcode == "parameter" or (i.opcode == "tuple" and i is comp.root):
            continue
        if i.opcode == "constant":
            build = _constant
        else:
            build = BUILDERS.get(i.opcode) or _FUSED.get(i.opcode)
        fn = build(i) if build is not None else None
        if fn is None or (i.shape.is_tuple and i.opcode != "sort"):
            return None
        program.append((i, fn))
    return program


# --- thunks --------------------------------------------------------------------------------
class TorchOpThunk(SlotThunk):
    """One instruction (or a fusion body) computed with torch ops on arena views."""
    kind = "torch-op"

    def __init__(self, inst: Instruction, fn: Fn, inputs: list[Slot], outputs: list[Slot]):
        super().__init__(inst, inputs, outputs)
        self.fn = fn
        self.aliased = any(overlaps(o, i) for o in outputs for i in inputs)

    def run(self, mem: Memory, ctx: RunContext) -> None:
        result = self.fn(*[mem.view(s) for s in self.inputs])
        results = result if isinstance(result, tuple) else (result,)
        if self.aliased:
            # An output over an input: a result may be a view of that input.
            results = tuple(r.clone() for r in results)
        for slot, r in zip(self.outputs, results):
            mem.view(slot).copy_(r)

    def label(self) -> str:
        return f"%{self.inst.name} (torch {self.inst.opcode})"


class ScatterThunk(SlotThunk):
    """Scatter into the output in place: the operand copied there first unless buffer
    assignment gave both the same bytes."""
    kind = "torch-op"

    def __init__(self, inst: Instruction, into: Fn, inputs: list[Slot], outputs: list[Slot]):
        super().__init__(inst, inputs, outputs)
        self.into = into
        src, dst = inputs[0], outputs[0]
        self.in_place = (src.allocation, src.offset) == (dst.allocation, dst.offset) and \
            src.shape.layout == dst.shape.layout
        # The indices or updates share bytes with the output: read them before writing.
        self.clone_inputs = [overlaps(s, dst) for s in inputs[1:]]

    def run(self, mem: Memory, ctx: RunContext) -> None:
        out = mem.view(self.outputs[0])
        idx, upd = (mem.view(s).clone() if c else mem.view(s)
                    for s, c in zip(self.inputs[1:], self.clone_inputs))
        work = out if out.is_contiguous() else out.contiguous()
        if not self.in_place:
            src = mem.view(self.inputs[0])
            work.copy_(src.clone() if overlaps(self.inputs[0], self.outputs[0]) else src)
        self.into(work, idx, upd)
        if work is not out:
            out.copy_(work)

    def label(self) -> str:
        return f"%{self.inst.name} (torch scatter{', in place' if self.in_place else ''})"


def _fusion_fn(fusion: Instruction, program: list[tuple[Instruction, Fn]]) -> Fn:
    comp = fusion.attrs["calls"]
    params = {id(p): p.parameter_number for p in comp.parameters}
    root = comp.root
    outs = list(root.operands) if root.opcode == "tuple" else [root]

    def run(*args: Any) -> tuple:
        device = args[0].device
        env: dict[int, Any] = {}

        def value(i: Instruction) -> Any:
            return args[params[id(i)]] if id(i) in params else env[id(i)]
        for inst, fn in program:
            env[id(inst)] = fn(*[value(o) for o in inst.operands]) if inst.operands \
                else fn(device)
        vals = [value(o) for o in outs]
        if root.opcode != "tuple" and isinstance(vals[0], tuple):
            return vals[0]
        return tuple(vals)
    return run


def device_op_thunk(inst: Instruction, leaves: Leaves) -> Optional[SlotThunk]:
    """A torch thunk for ``inst`` (gather, scatter, sort, reduce-window, or a fusion around
    them), or None: the caller keeps its host fallback."""
    def slot(i: Instruction, ix: tuple = ()) -> Optional[Slot]:
        s = leaves(i).get(ix)
        return s if s is not None and torch_dtype(s.shape.dtype) is not None else None
    if inst.shape.is_tuple:
        outputs = [slot(inst, (k,)) for k in range(len(inst.shape.elements))]
        if any(not e.is_array for e in inst.shape.elements):
            return None
    else:
        outputs = [slot(inst)]
    inputs = [slot(o) for o in inst.operands]
    if any(o.shape.is_tuple for o in inst.operands) or None in inputs or None in outputs:
        return None
    if inst.opcode == "fusion":
        program = fusion_program(inst)
        if program is None or len(inputs) == 0:
            return None
        return TorchOpThunk(inst, _fusion_fn(inst, program), inputs, outputs)
    if inst.opcode == "scatter":
        into = scatter_into_fn(inst)
        return ScatterThunk(inst, into, inputs, outputs) if into is not None else None
    build = BUILDERS.get(inst.opcode)
    fn = build(inst) if build is not None else None
    return TorchOpThunk(inst, fn, inputs, outputs) if fn is not None else None
