"""Scaled dot-product attention's score function, as ``attention.py`` matches it: the steps
between q·k and the softmax (``ScoreStep``: scale, additive bias, boolean masks, causal and
sliding-window bands of positions), the analysis of a mask's generated cone (iota compares,
constant masks, bands of q - k), and the small view helpers both the forward and the
backward matchers use. Split from attention.py so each reads in one sitting.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hlo.ir import Instruction

from .views import trace_view, view_step

# Ops the mask's generated cone (iota compares, constant masks) may hold.
_GENERATED = frozenset({"iota", "constant", "broadcast", "reshape", "transpose", "bitcast",
                        "copy", "compare", "select", "and", "or", "not", "convert", "add",
                        "subtract", "negate"})
_VIEWS = frozenset({"broadcast", "reshape", "transpose", "bitcast", "copy"})


def recomputable(inst: Instruction, memo: Optional[dict[int, bool]] = None) -> bool:
    """Whether a fusion may compute its own copy of ``inst`` at no cost in bytes: a mask
    cone op (``_GENERATED``) whose inputs are, recursively, such ops, constants and iotas,
    or values smaller than what reads them (a padding mask's [B, S] before its broadcast
    to [B, H, S, S]). A causal mask, its -inf fill, a padding mask's broadcast: every layer
    of a model reads the same one after CSE, and each attention fusion takes a copy
    (``attention_pass.privatize_recomputable``) instead of reading a B·H·S·S operand."""
    memo = {} if memo is None else memo
    known = memo.get(id(inst))
    if known is None:
        if inst.opcode in ("constant", "iota"):
            known = True
        elif inst.opcode not in _GENERATED or not inst.operands or inst.shape.is_tuple:
            known = False
        else:
            size = _elements(inst)
            known = all(recomputable(o, memo) or
                        (not o.shape.is_tuple and _elements(o) < size)
                        for o in inst.operands)
        memo[id(inst)] = known
    return known


def _elements(inst: Instruction) -> int:
    return int(np.prod(inst.shape.dims)) if inst.shape.dims else 1


@dataclass
class ScoreStep:
    """One step of the score function, applied in order from the dot outwards.

    kind: scale (value), bias (tensor, sign), mask (tensor, fill, keep_if_true),
    causal (fill, q_side_lhs, direction, delta: keep iff (q + a) DIR (k + b), delta = b - a,
    q_dim: the score dim q counts along, -1 for the last but one; window: a band's other
    bound, keep also iff q - k <= window, None for none), convert (dtype name)."""
    kind: str
    inst: Instruction
    value: float = 1.0
    tensor: Optional[Instruction] = None     # the bias / mask source (outside the views)
    where: tuple = ()                        # score dim -> tensor dim (None: broadcast)
    fill: float = 0.0
    keep_if_true: bool = True
    direction: str = ""
    delta: int = 0
    dtype: str = ""
    q_dim: int = -1                          # causal: the score dim of the query position
    window: Optional[int] = None             # causal GE/GT: also keep iff q - k <= window


class NoMatch(Exception):
    """An attention-shaped subgraph that cannot be one flash-attention kernel (the reason)."""


# --- small helpers ----------------------------------------------------------------------------
def _reducer(inst: Instruction) -> str:
    body = inst.attrs.get("to_apply")
    return body.root.opcode if body is not None and body.root is not None else ""


def _scalar_constant(inst: Instruction) -> Optional[float]:
    """The value of a constant (or broadcast/reshape of one) whose elements are all equal."""
    src, _ = trace_view(inst, converts=True)
    if src.opcode != "constant" or src.literal is None:
        return None
    try:    # bf16/f8 literals are numpy "V" kinds: compare them as f64
        arr = np.asarray(src.literal).astype(np.float64)
    except (TypeError, ValueError):
        return None
    if arr.size == 0 or not np.all((arr == arr.flat[0]) | np.isnan(arr)):
        return None
    return float(arr.flat[0])


def _is_identity(where: tuple, dims: tuple) -> bool:
    return len(where) == len(dims) and all(w == d or (w is None and dims[d] == 1)
                                           for d, w in enumerate(where))


def _is_row_broadcast(where: tuple, dims: tuple) -> bool:
    """``where`` maps every dim but the last to itself and the last to nothing: a per-row
    value broadcast back along the softmax axis."""
    n = len(dims)
    return n >= 1 and where[-1] is None and all(
        w == d or (w is None and dims[d] == 1) for d, w in enumerate(where[:-1]))


def _row_reduce(inst: Instruction, reducer: str, over: Instruction) -> bool:
    """``inst`` reduces ``over`` (through float converts) along its last dim with ``reducer``."""
    if inst.opcode != "reduce" or len(inst.operands) != 2 or _reducer(inst) != reducer:
        return False
    src, where = trace_view(inst.operands[0], converts=True)
    rank = over.shape.rank
    same = (src is over and _is_identity(where, over.shape.dims)) or \
        _same_elements(inst.operands[0])[0] is over
    return same and list(inst.attrs.get("dimensions", ())) == [rank - 1]


def _through(inst: Instruction, converts: bool = True) -> tuple[Instruction, tuple, list]:
    passed: list[Instruction] = []
    src, where = trace_view(inst, converts=converts, through=passed)
    return src, where, passed


def _same_elements(inst: Instruction) -> tuple[Instruction, list[Instruction]]:
    """(source, views passed): down the views and float converts from ``inst`` for as long
    as they keep every element at its index (layout copies, size-1 reshapes), stopping at
    one that permutes: an unscaled softmax of grouped scores reads a transposing bitcast
    of q·k, and that bitcast, not q·k, is the softmax's input."""
    cur, passed = inst, []
    while cur.opcode in _VIEWS or cur.opcode == "convert":
        step = view_step(cur, converts=True)
        src = cur.operands[0] if cur.operands else None
        if step is None or src is None or src.shape.dims != cur.shape.dims or \
                not _is_identity(step, cur.shape.dims):
            break
        passed.append(cur)
        cur = src
    return cur, passed


# --- masks and bands -------------------------------------------------------------------------
def _iota_side(inst: Instruction) -> Optional[tuple[int, int, tuple]]:
    """(iota dim in the compared value's coords, additive offset, where) when ``inst`` is
    an iota (through views), maybe plus a constant."""
    offset = 0
    cur = inst
    if cur.opcode in ("add", "subtract"):
        c = _scalar_constant(cur.operands[1])
        if c is None:
            return None
        offset = int(c) if cur.opcode == "add" else -int(c)
        cur = cur.operands[0]
    src, where = trace_view(cur)
    if src.opcode != "iota":
        return None
    dim = src.attrs.get("iota_dimension", 0)
    at = [j for j, w in enumerate(where) if w == dim]
    return (at[0], offset, where) if len(at) == 1 else None


_FLIP = {"GE": "LE", "LE": "GE", "GT": "LT", "LT": "GT", "EQ": "EQ", "NE": "NE"}


def _mask_step(sel: Instruction, path: Instruction, fill_inst: Instruction,
               rank: int) -> tuple[ScoreStep, list[Instruction]]:
    fill = _scalar_constant(fill_inst)
    if fill is None:
        raise NoMatch(f"%{sel.name} selects between the scores and %{fill_inst.name}, "
                      "which is not a constant fill value")
    keep_if_true = sel.operands[1] is path
    pred, where, views = _through(sel.operands[0], converts=False)
    insts = [fill_inst] + _through(fill_inst)[2] + views
    q_dim, k_dim = rank - 2, rank - 1
    # select(c, true, false) is c (the simplifier leaves it when jnp.tril builds the mask).
    if pred.opcode == "select":
        t, f = _scalar_constant(pred.operands[1]), _scalar_constant(pred.operands[2])
        if t is not None and f is not None and t != f:
            insts += [pred] + _through(pred.operands[1])[2] + _through(pred.operands[2])[2]
            if t == 0:
                keep_if_true = not keep_if_true
            inner, w2, v2 = _through(pred.operands[0], converts=False)
            where = tuple(None if w is None else w2[w] for w in where)
            pred, insts = inner, insts + v2
    if pred.opcode == "compare":
        a, b = (_iota_side(o) for o in pred.operands)
        if a is not None and b is not None:
            score_of = {w: d for d, w in enumerate(where) if w is not None}
            da, db = score_of.get(a[0]), score_of.get(b[0])
            # the query position may be any row dim (jax.nn's grouped form writes rows
            # [t, g]: the position is the row dim before the group)
            row = da if db == k_dim else db
            if k_dim in (da, db) and row is not None and row != k_dim and row < k_dim:
                direction = pred.attrs.get("direction", "EQ")
                direction = str(getattr(direction, "value", direction)).split(".")[-1]
                if not keep_if_true:
                    direction = {"GE": "LT", "LT": "GE", "GT": "LE", "LE": "GT",
                                 "EQ": "NE", "NE": "EQ"}[direction]
                if da == k_dim:       # written k DIR q: flip to q DIR' k
                    a, b, direction = b, a, _FLIP[direction]
                cone = _cone(pred)
                return (ScoreStep("causal", sel, fill=fill, direction=direction,
                                  delta=b[1] - a[1], q_dim=row), insts + cone)
    if pred.opcode == "constant" and pred.literal is not None:
        arr = np.asarray(pred.literal)
        sq = [d for d, w in enumerate(where) if w is not None]
        if arr.ndim == 2 and sq == [q_dim, k_dim] and where[q_dim] == 0:
            tril = np.tril(np.ones(arr.shape, bool))
            if np.array_equal(arr, tril if keep_if_true else ~tril):
                return (ScoreStep("causal", sel, fill=fill, direction="GE", delta=0),
                        insts + [pred])
    band = _band(pred, where, k_dim) if keep_if_true else None
    if band is not None:
        row, lo, hi = band
        cone = _cone(pred)
        if cone:
            step = ScoreStep("causal", sel, fill=fill, direction="GE", delta=lo, q_dim=row,
                             window=hi) if lo is not None else \
                ScoreStep("causal", sel, fill=fill, direction="LE", delta=hi, q_dim=row)
            return step, insts + cone
    # Any other mask (one that is not a band of q - k, e.g. a random boolean mask) stays
    # outside: the fusion reads it as an operand, [q, k]
    # before its broadcasts, as it reads a mask argument. Inside, only the kernels' own
    # causal test is computed; a generated mask there would leave the GPU kernel unable to
    # run the fusion (the host would).
    return (ScoreStep("mask", sel, tensor=pred, where=where, fill=fill,
                      keep_if_true=keep_if_true), insts)


def merged_band(steps: list) -> Optional[ScoreStep]:
    """One causal step keeping what every one of ``steps`` (causal steps, each a bound on
    q - k, maybe with a window's other bound) keeps: two selects with position compares
    (jnp.where(tril), then jnp.where(q - k < w)) are one band, their intersection. None
    when they are not one band (a NE compare, compares on different row dims)."""
    if len(steps) == 1:
        return steps[0]
    lo: Optional[int] = None
    hi: Optional[int] = None
    for c in steps:
        if c.direction == "NE" or c.q_dim != steps[0].q_dim:
            return None
        b_lo = {"GE": c.delta, "GT": c.delta + 1, "EQ": c.delta}.get(c.direction)
        b_hi = {"LE": c.delta, "LT": c.delta - 1, "EQ": c.delta}.get(c.direction)
        if c.window is not None:
            b_hi = c.window if b_hi is None else min(b_hi, c.window)
        lo = b_lo if lo is None else (lo if b_lo is None else max(lo, b_lo))
        hi = b_hi if hi is None else (hi if b_hi is None else min(hi, b_hi))
    if lo is None:
        return dataclasses.replace(steps[0], direction="LE", delta=hi, window=None)
    return dataclasses.replace(steps[0], direction="GE", delta=lo, window=hi)


def keeps_diagonal(c: Optional[ScoreStep]) -> bool:
    """Whether a causal step keeps the diagonal side, k <= q + c with c <= 0 (and a band's
    other bound q - k <= w has w >= 0): every row keeps its own position's key, and the
    blocks above the diagonal (and, with a window, below it) can be skipped."""
    return c is not None and (
        (c.direction == "GE" and c.delta <= 0) or (c.direction == "GT" and c.delta < 0)) and \
        (c.window is None or c.window >= 0)


def band_text(c: ScoreStep) -> str:
    """How explain-fusion names a causal step: "causal", "causal, window 256" (keys
    q-255..q), or the band's bounds when it is not the usual sliding window."""
    if c.window is None:
        return "causal"
    lo = c.delta + (1 if c.direction == "GT" else 0)
    if lo == 0:
        return f"causal, window {c.window + 1} (keys q-{c.window}..q)"
    def key(off: int) -> str:
        return "q" if off == 0 else f"q{-off:+d}"
    return f"band of {c.window - lo + 1} keys ({key(c.window)}..{key(lo)})"


def _linear(inst: Instruction, where: tuple) -> Optional[tuple[dict, int]]:
    """``inst`` (an integer tensor of the mask's cone) as sum(coeff * position along a
    score dim) + constant: ({score dim: coeff}, constant), or None. ``where``: score dim
    -> ``inst`` dim. Positions are iotas, or constants that count 0, 1, 2, ... (the
    simplifier folds jnp.arange into one), plus scalar constants, adds and subtracts."""
    src, w2, _ = _through(inst, converts=False)
    where = tuple(None if w is None else w2[w] for w in where)
    op = src.opcode
    if op in ("add", "subtract") and len(src.operands) == 2:
        a, b = (_linear(o, where) for o in src.operands)
        if a is None or b is None:
            return None
        sign = 1 if op == "add" else -1
        coeffs = dict(a[0])
        for d, c in b[0].items():
            coeffs[d] = coeffs.get(d, 0) + sign * c
        return {d: c for d, c in coeffs.items() if c}, a[1] + sign * b[1]
    if op == "negate":
        a = _linear(src.operands[0], where)
        return None if a is None else ({d: -c for d, c in a[0].items()}, -a[1])
    if not src.shape.dtype.is_integer:
        return None
    if op == "iota":
        dim, offset = src.attrs.get("iota_dimension", 0), 0
    elif op == "constant" and src.literal is not None:
        c = _scalar_constant(src)
        if c is not None:
            return ({}, int(c)) if c == int(c) else None
        arr = np.asarray(src.literal)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or \
                not np.array_equal(arr, arr[0] + np.arange(arr.size)):
            return None
        dim, offset = 0, int(arr[0])
    else:
        return None
    at = [s for s, w in enumerate(where) if w == dim]
    return ({at[0]: 1}, offset) if len(at) == 1 else None


def _band(pred: Instruction, where: tuple, k_dim: int
          ) -> Optional[tuple[int, Optional[int], Optional[int]]]:
    """(query dim, lo, hi) when the mask ``pred`` (``where``: score dim -> pred dim) keeps
    exactly lo <= q - k <= hi (either bound may be None), q counted along one row dim and
    k along the keys: an ``and`` of compares of iota positions (a sliding window written
    as two compares, jax.nn's local_window_size, ``|q - k| <= w``), through views,
    select(c, true, false) and all-true constants. The kernels test it themselves and
    skip the key blocks outside it on both sides."""
    lo: Optional[int] = None
    hi: Optional[int] = None
    rows: set[int] = set()
    stack = [(pred, where)]
    while stack:
        inst, w = stack.pop()
        src, w2, _ = _through(inst, converts=False)
        w = tuple(None if x is None else w2[x] for x in w)
        op = src.opcode
        if op == "and":
            stack.extend((o, w) for o in src.operands)
            continue
        if op == "select":
            t, f = _scalar_constant(src.operands[1]), _scalar_constant(src.operands[2])
            if t is None or f is None or not t or f:
                return None
            stack.append((src.operands[0], w))
            continue
        if op == "constant":
            if _scalar_constant(src) != 1:
                return None
            continue
        if op != "compare":
            return None
        a, b = (_linear(o, w) for o in src.operands)
        if a is None or b is None:
            return None
        coeffs = dict(a[0])
        for d, c in b[0].items():
            coeffs[d] = coeffs.get(d, 0) - c
        coeffs = {d: c for d, c in coeffs.items() if c}
        const = a[1] - b[1]
        # coeffs·pos + const DIR 0 with coeffs = {q: s, k: -s}, s = ±1: s(q - k) DIR -const
        direction = src.attrs.get("direction", "EQ")
        direction = str(getattr(direction, "value", direction)).split(".")[-1]
        row = [d for d in coeffs if d != k_dim]
        if len(coeffs) != 2 or len(row) != 1 or row[0] > k_dim or \
                coeffs.get(k_dim) != -coeffs[row[0]] or abs(coeffs[row[0]]) != 1:
            return None
        v = -const
        if coeffs[row[0]] < 0:      # -(q - k) DIR v  <=>  (q - k) DIR' -v
            direction, v = _FLIP[direction], const
        rows.add(row[0])
        if direction in ("GE", "GT", "EQ"):
            b_lo = v + (1 if direction == "GT" else 0)
            lo = b_lo if lo is None else max(lo, b_lo)
        if direction in ("LE", "LT", "EQ"):
            b_hi = v - (1 if direction == "LT" else 0)
            hi = b_hi if hi is None else min(hi, b_hi)
        if direction == "NE":
            return None
    if len(rows) != 1 or (lo is None and hi is None):
        return None
    return rows.pop(), lo, hi


def _cone(inst: Instruction) -> list[Instruction]:
    """``inst`` and everything under it, when all of it is generated (iota/constant/...)."""
    out, stack, seen = [], [inst], set()
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i.opcode not in _GENERATED:
            return []
        out.append(i)
        stack.extend(i.operands)
    return out
