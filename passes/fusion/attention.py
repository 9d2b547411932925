"""Flash-attention fusion: scaled dot-product attention recognized in plain HLO.

JAX writes attention as two dots around a softmax::

    s = dot(q, k)                      # [batch..., rows..., k]   (any head layout)
    x = score(s)                       # scale, additive bias, mask: select(pred, s, fill)
    m = reduce-max(x)  e = exp(x - broadcast(m))  l = reduce-add(e)
    p = e / broadcast(l)               # with or without an f32 upcast around it
    o = dot(p, v)  (or dot(v, p))

``match_attention(pv)`` starts from the second dot and walks that graph down to the first;
the instructions between them (and the mask's iota/constant cone) become one ``kCustom``
fusion whose ``backend_config`` names ``__flash_attention``. Its kernel never writes the
``[batch, rows, k]`` scores: it streams key blocks with an online softmax (running maximum
and sum), so no B·H·S·S buffer exists. When a dot looks like the end of an attention but
the match fails, the reason (which instruction, why) goes into the fusion report.

The match is recomputed from the fusion body by the kernels (the body is the source of
truth: its parameters are q, k, v and the bias/mask tensors), so the text round-trips.
jax.grad's backward is matched in attention_grad.py; attention_pass.py pairs the two and
runs both matchers in the fusion pass.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hlo.ir import Instruction

from .rewrite import _unique
from .views import compose, trace_view, view_step

FLASH_ATTENTION = "__flash_attention"

# Ops the mask's generated cone (iota compares, constant masks) may hold.
_GENERATED = frozenset({"iota", "constant", "broadcast", "reshape", "transpose", "bitcast",
                        "copy", "compare", "select", "and", "or", "not", "convert", "add",
                        "subtract", "negate"})
_VIEWS = frozenset({"broadcast", "reshape", "transpose", "bitcast", "copy"})


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


class QKOperands:
    """q and k of a match's ``qk = dot(q, k)`` (``k_is_lhs``: k is the dot's lhs), shared
    by the forward and backward matches."""
    qk: Instruction
    k_is_lhs: bool

    @property
    def q(self) -> Instruction:
        return self.qk.operands[1 if self.k_is_lhs else 0]

    @property
    def k(self) -> Instruction:
        return self.qk.operands[0 if self.k_is_lhs else 1]


@dataclass
class AttentionMatch(QKOperands):
    qk: Instruction                 # dot(q, k): scores [batch..., rows..., k]
    pv: Instruction                 # dot(p, v) or dot(v, p)
    p_is_lhs: bool
    logits: Instruction             # the softmax input x
    k_is_lhs: bool
    steps: list[ScoreStep]
    members: list[Instruction] = field(default_factory=list)
    # Transposes/copies after pv that only permute its dims, absorbed so the kernel writes
    # the layout its consumer reads (output_views); out_where[i] = pv dim of output dim i.
    out_views: list[Instruction] = field(default_factory=list)
    out_where: tuple = ()

    @property
    def v(self) -> Instruction:
        return self.pv.operands[1 if self.p_is_lhs else 0]

    @property
    def n_batch(self) -> int:
        return len(self.qk.attrs.get("lhs_batch_dims", ()))

    @property
    def causal(self) -> Optional[ScoreStep]:
        """The causal band: the steps' intersection when several selects compare positions
        (a causal one, then a window one), else the first such step."""
        causal = [s for s in self.steps if s.kind == "causal"]
        return (merged_band(causal) or causal[0]) if causal else None

    @property
    def scale(self) -> float:
        return float(np.prod([s.value for s in self.steps if s.kind == "scale"]))

    def summary(self) -> dict:
        """What the backend config says about the match (for people; kernels re-match)."""
        c = self.causal
        return {"causal": c is not None, "scale": round(self.scale, 8),
                **({"window": band_text(c)} if c is not None and c.window is not None else {}),
                "bias": any(s.kind == "bias" for s in self.steps),
                "mask": any(s.kind == "mask" for s in self.steps),
                "q": str(self.q.shape), "k": str(self.k.shape), "v": str(self.v.shape)}


def backend_config(m: AttentionMatch) -> str:
    return json.dumps({"fusion_backend_config": {"kind": FLASH_ATTENTION,
                                                 "flash_attention": m.summary()}},
                      separators=(",", ":"))


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


# --- the match ---------------------------------------------------------------------------------
def _softmax(p_operand: Instruction, stats_given: bool = False
             ) -> tuple[Instruction, Instruction, list[Instruction]]:
    """(exp, logits, softmax instructions) for p = exp(x - max) / sum(exp(x - max)).
    ``stats_given``: the row max and sum may be parameters (a backward fusion's body reads
    them from the forward fusion)."""
    div, where, views = _through(p_operand)
    if div.opcode != "divide":
        raise NoMatch(f"%{div.name} ({div.opcode}) feeding %{p_operand.name} is not a softmax's "
                      "divide")
    if not _is_identity(where, div.shape.dims):
        raise NoMatch(f"the probabilities %{div.name} reach the second dot through a "
                      "relayout")
    e_view, bl = div.operands
    ex, w_e, e_views = _through(e_view)
    if ex.opcode != "exponential" or not _is_identity(w_e, div.shape.dims):
        raise NoMatch(f"the softmax numerator %{ex.name} is a {ex.opcode}, not exp(x - max)")
    l_red, w_l, l_views = _through(bl)
    given = stats_given and l_red.opcode == "parameter"
    if not (given or _row_reduce(l_red, "add", ex)) or not _is_row_broadcast(w_l, div.shape.dims):
        raise NoMatch(f"the softmax denominator %{l_red.name} is not a sum of %{ex.name} "
                      "over the last dimension, broadcast back")
    sub, w_s, s_views = _through(ex.operands[0])
    if sub.opcode != "subtract" or not _is_identity(w_s, div.shape.dims):
        raise NoMatch(f"%{ex.name} exponentiates %{sub.name} ({sub.opcode}), not x - max(x): "
                      "the online softmax needs the max subtracted")
    x, w_x, x_views = _through(sub.operands[0])
    if not _is_identity(w_x, div.shape.dims):
        x, x_views = _same_elements(sub.operands[0])      # x is a transpose of q·k
        w_x = tuple(range(x.shape.rank))
    m_red, w_m, m_views = _through(sub.operands[1])
    given = stats_given and m_red.opcode == "parameter"
    if not _is_identity(w_x, div.shape.dims) or not (given or _row_reduce(m_red, "maximum", x)) \
            or not _is_row_broadcast(w_m, div.shape.dims):
        raise NoMatch(f"%{sub.name} does not subtract the row maximum of its input")
    m_in = _through(m_red.operands[0])[2] if m_red.operands else []
    l_in = _through(l_red.operands[0])[2] if l_red.operands else []
    insts = [div, ex, l_red, sub, m_red] + views + e_views + l_views + s_views + x_views + \
        m_views + m_in + l_in
    return ex, x, insts


def _reaches(inst: Instruction, target: Instruction, depth: int = 24) -> bool:
    if inst is target:
        return True
    if depth == 0:
        return False
    return any(_reaches(o, target, depth - 1) for o in inst.operands)


def _find_qk(x: Instruction) -> Instruction:
    """The first dot under the score function (the only one along the operand chain)."""
    stack, seen = [x], set()
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i.opcode == "dot" and sorted(i.shape.dims) == sorted(x.shape.dims):
            return i
        if i.op.category == "elementwise" or i.opcode in ("convert", "select") or \
                _row_transpose(i):
            stack.extend(i.operands)
    raise NoMatch(f"no dot q·k of shape {list(x.shape.dims)} under the softmax input "
                  f"%{x.name}")


def _row_transpose(inst: Instruction) -> bool:
    """A transpose between q·k and the score function (a grouped-query einsum may write
    [b,h,k,q,g] and transpose it to [b,h,g,q,k]; after layout assignment that transpose
    can be a bitcast to another layout); ``_check_dots`` checks where dims go."""
    if inst.opcode == "transpose":
        return True
    if inst.opcode not in ("bitcast", "copy"):
        return False
    step = _permutation(inst)
    return step is not None and step != tuple(range(len(step)))


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


def _score_steps(x: Instruction, qk: Instruction) -> tuple[list[ScoreStep], list[Instruction]]:
    """The score function from qk up to x, as steps from the dot outwards."""
    steps: list[ScoreStep] = []
    insts: list[Instruction] = []
    rank = qk.shape.rank
    cur = x
    while cur is not qk:
        op = cur.opcode
        insts.append(cur)
        if _row_transpose(cur):
            cur = cur.operands[0]
            continue
        # one view step, not the whole chain: a layout copy of the grouped einsum's
        # transpose (the CUDA layout assignment's) is an identity here, the transpose below
        # it a row transpose
        step = view_step(cur) if op in _VIEWS else None
        if op == "convert" or (step is not None and _is_identity(step, cur.shape.dims)
                               and cur.operands[0].shape.dims == cur.shape.dims):
            if op == "convert":
                steps.append(ScoreStep("convert", cur, dtype=cur.shape.dtype.name))
            cur = cur.operands[0]
            continue
        on_path = [o for o in cur.operands if _reaches(o, qk)]
        if len(on_path) != 1 or (op == "select" and cur.operands[0] is on_path[0]):
            raise NoMatch(f"%{cur.name} ({op}) combines the scores with themselves")
        path = on_path[0]
        others = [o for o in cur.operands if o is not path]
        if op in ("multiply", "divide") and len(others) == 1:
            c = _scalar_constant(others[0])
            if c is None or c == 0 or (op == "divide" and cur.operands[0] is not path):
                raise NoMatch(f"%{cur.name} ({op}) scales the scores by %{others[0].name}, "
                              "which is not one constant")
            steps.append(ScoreStep("scale", cur, value=c if op == "multiply" else 1.0 / c))
            insts += _through(others[0])[2]
        elif op in ("add", "subtract") and len(others) == 1:
            if op == "subtract" and cur.operands[0] is not path:
                raise NoMatch(f"%{cur.name} subtracts the scores from a tensor")
            src, where, views = _bias_source(others[0])
            if len(where) != rank:
                raise NoMatch(f"the bias %{others[0].name} does not index the scores")
            steps.append(ScoreStep("bias", cur, tensor=src, where=where,
                                   value=1.0 if op == "add" else -1.0))
            insts += views
        elif op == "select":
            fill_inst = cur.operands[2] if cur.operands[1] is path else cur.operands[1]
            step, more = _mask_step(cur, path, fill_inst, rank)
            steps.append(step)
            insts += more
        else:
            raise NoMatch(f"%{cur.name} ({op}) in the score function is not a scale, bias, "
                          "mask or convert the flash-attention kernel applies")
        cur = path
    steps.reverse()
    return steps, insts


def _bias_source(inst: Instruction) -> tuple[Instruction, tuple, list[Instruction]]:
    """(source, where, views) of a bias through views and widening float converts (jax.nn
    casts a bf16 bias to f32 scores): the kernels read the narrow tensor and widen it as
    they load it, instead of a separate kernel writing the wide copy. A narrowing convert
    rounds, so it stays outside (the fusion reads its result)."""
    where: tuple = tuple(range(inst.shape.rank))
    passed: list[Instruction] = []
    cur = inst
    while True:
        src, w, views = _through(cur, converts=False)
        where, passed = compose(where, w), passed + views
        if src.opcode == "convert" and src.shape.dtype.is_float and \
                src.operands[0].shape.dtype.is_float and \
                src.operands[0].shape.dtype.bits < src.shape.dtype.bits:
            passed.append(src)
            cur = src.operands[0]
            continue
        return src, where, passed


def score_dims(x: Instruction, qk: Instruction, to: Optional[Instruction] = None) -> tuple:
    """Score dim -> q·k output dim, through the transposes between them (-> the dim of
    ``to``, an instruction of the score function, when given)."""
    where = tuple(range(x.shape.rank))
    cur = x
    stop = qk if to is None else to
    while cur is not stop:
        if _row_transpose(cur):
            step = _permutation(cur)
            assert step is not None
            where = tuple(step[w] for w in where)
            cur = cur.operands[0]
            continue
        cur = next(o for o in cur.operands if _reaches(o, qk))
    return where


def score_layout(x: Instruction, qk: Instruction) -> tuple[list[int], list[int]]:
    """(batch, rows): the score dims that are q·k's batch dims (in q·k's order) and the
    row dims (the rest but the keys, in the scores' order). Batch dims need not come
    first: grouped-query attention written group-major has scores [b, g, kv, q, k] with
    batch dims (b, kv). The kernels see the scores as ``canonical(x, qk)``."""
    where = score_dims(x, qk)
    nb = len(qk.attrs.get("lhs_batch_dims", ()))
    batch = [s for s in range(x.shape.rank) if where[s] < nb]
    return batch, [s for s in range(x.shape.rank - 1) if where[s] >= nb]


def canonical(x: Instruction, qk: Instruction) -> list[int]:
    """The scores' dims in the kernels' order [batch..., rows..., keys] (canonical dim i
    is score dim ``canonical[i]``); the identity when the batch dims come first."""
    batch, rows = score_layout(x, qk)
    return batch + rows + [x.shape.rank - 1]


def check_qk(qk: Instruction, x: Instruction) -> bool:
    """Checks q·k under the softmax input ``x``; returns whether k is its lhs."""
    a = qk.attrs
    nb = len(a.get("lhs_batch_dims", ()))
    if len(a.get("lhs_contracting_dims", ())) != 1 or len(a.get("rhs_contracting_dims", ())) != 1:
        raise NoMatch(f"%{qk.name} contracts {len(a.get('lhs_contracting_dims', ()))} dims; "
                      "q·k must contract one head dimension")
    where = score_dims(x, qk)
    batch, _ = score_layout(x, qk)
    # (the batch dims may sit between row dims, [b, g, kv, q, k], but in q·k's order)
    if [where[s] for s in batch] != list(range(nb)) or where[-1] < nb:
        raise NoMatch(f"the scores' batch dims are not %{qk.name}'s batch dims in order")
    lhs_free = qk.operands[0].shape.rank - nb - 1
    k_is_lhs = where[-1] < nb + lhs_free
    kop = qk.operands[0 if k_is_lhs else 1]
    if kop.shape.rank - nb - 1 != 1:
        raise NoMatch(f"%{qk.name}'s key operand %{kop.name} has {kop.shape.rank - nb - 1} free "
                      "dims; the softmax axis must be its one sequence dim")
    return k_is_lhs


def _check_dots(qk: Instruction, pv: Instruction, p_is_lhs: bool, x: Instruction) -> bool:
    """Checks the two dots; returns whether k is q·k's lhs."""
    k_is_lhs = check_qk(qk, x)
    nb = len(qk.attrs.get("lhs_batch_dims", ()))
    b = pv.attrs
    side, other = ("lhs", "rhs") if p_is_lhs else ("rhs", "lhs")
    rank = x.shape.rank
    batch, rows = score_layout(x, qk)
    if list(b.get(f"{side}_batch_dims", ())) != batch or \
            list(b.get(f"{side}_contracting_dims", ())) != [rank - 1]:
        _no_forward_output(pv, p_is_lhs, rows)
        raise NoMatch(f"%{pv.name} does not contract the probabilities over the key axis "
                      "with the scores' batch dims as its batch dims")
    v = pv.operands[1 if p_is_lhs else 0]
    if len(b.get(f"{other}_contracting_dims", ())) != 1 or v.shape.rank - nb - 1 != 1:
        raise NoMatch(f"the value operand %{v.name} of %{pv.name} must have one sequence and "
                      "one head dim besides the batch dims")
    return k_is_lhs


def _no_forward_output(dot: Instruction, p_is_lhs: bool, rows: list[int]) -> None:
    """Raises the precise reason when ``dot`` contracts the probabilities over their rows
    (jax.grad's dV = P^T.dO) and no dot contracts them over the keys: the program has no
    forward P·V (its output unused, e.g. a bare jax.grad of sum(o * dO), a linear loss),
    and the fused backward needs a forward fusion for the softmax's row statistics."""
    p_side = 0 if p_is_lhs else 1
    div, where, _ = _through(dot.operands[p_side])
    side = "lhs" if p_is_lhs else "rhs"
    contracted = {where[d] for d in dot.attrs.get(f"{side}_contracting_dims", ())}
    if contracted != set(rows):
        return
    key = div.shape.rank - 1
    for u in div.users:
        for o_side in (0, 1):
            src, w, _ = _through(u.operands[o_side]) if u.opcode == "dot" else (None, (), [])
            s = "lhs" if o_side == 0 else "rhs"
            if src is div and [w[d] for d in u.attrs.get(f"{s}_contracting_dims", ())] == [key]:
                return
    raise NoMatch(f"%{dot.name} is jax.grad's dV = P^T.dO, but no dot computes the forward "
                  f"P·V from %{div.name} (the attention's output is not used: a loss linear "
                  "in it, e.g. jax.grad of sum(o * dO)); the fused backward reads the row "
                  "max and sum a forward fusion outputs, so neither is fused (a program "
                  "that also returns the output, as jax.value_and_grad's loss does, fuses)")


def _match_forward(pv: Instruction) -> Optional[tuple[AttentionMatch, list[Instruction]]]:
    """(match, every instruction from q·k to p·v incl. mask cones) with members not yet
    checked for readers outside."""
    if pv.opcode != "dot" or pv.shape.is_tuple:
        return None
    for p_side in (0, 1):
        src = _through(pv.operands[p_side])[0]
        if src.opcode == "divide":
            break
    else:
        return None
    p_op = pv.operands[p_side]
    ex, x, soft = _softmax(p_op)
    qk = _find_qk(x)
    k_is_lhs = _check_dots(qk, pv, p_side == 0, x)
    steps, score = _score_steps(x, qk)
    core = _unique([qk] + score + soft + _through(p_op)[2] + [pv])
    members = core
    # Constants are cloned into the body (or read as operands); a generated mask piece that
    # other code also reads stays outside and becomes an operand.
    members = [i for i in members if i.opcode != "constant"]
    ids = {id(i) for i in members}
    while True:
        shared = [i for i in members if i.opcode in _GENERATED and i not in (qk, pv)
                  and any(id(u) not in ids for u in i.users)]
        if not shared:
            break
        members = [i for i in members if i not in shared]
        ids = {id(i) for i in members}
    return AttentionMatch(qk, pv, p_side == 0, x, k_is_lhs, steps, members), core


def row_stats(m: AttentionMatch) -> tuple[Instruction, Instruction]:
    """(row max, row sum) instructions of a matched softmax."""
    div = _through(m.pv.operands[0 if m.p_is_lhs else 1])[0]
    sub = _through(_through(div.operands[0])[0].operands[0])[0]
    return _through(sub.operands[1])[0], _through(div.operands[1])[0]


def match_attention(pv: Instruction, stats_out: bool = False) -> Optional[AttentionMatch]:
    """The attention ending at ``pv``, None when ``pv`` is not the end of a softmax·V, or
    raises NoMatch (with the reason) for a near miss. ``stats_out``: the row max and row
    sum may be read outside (the fusion then also outputs them, for a backward)."""
    found = _match_forward(pv)
    if found is None:
        return None
    m = found[0]
    members = m.members
    ids = {id(i) for i in members}
    allowed = {id(i) for i in row_stats(m)} if stats_out else set()
    read_outside = [(i, u) for i in members if i is not pv and id(i) not in allowed
                    for u in i.users if id(u) not in ids]
    if read_outside:
        raise NoMatch(_outside_reason(read_outside, ids))
    m.out_views, m.out_where = output_views(pv)
    m.members = members + m.out_views
    return m


def _dots_reached(inst: Instruction, depth: int = 6) -> list[Instruction]:
    """Dots that read ``inst`` through at most ``depth`` views/elementwise ops/reductions."""
    found, frontier, seen = [], [inst], {id(inst)}
    for _ in range(depth):
        nxt = []
        for x in frontier:
            for u in x.users:
                if id(u) in seen:
                    continue
                seen.add(id(u))
                if u.opcode == "dot":
                    found.append(u)
                elif u.op.elementwise or u.opcode in _VIEWS or u.opcode == "reduce":
                    nxt.append(u)
        frontier = nxt
    return found


def _outside_reason(read_outside: list[tuple[Instruction, Instruction]], ids: set[int]) -> str:
    """Why a softmax·V whose pieces are read elsewhere is not fused. When those readers feed
    dots, it is jax.grad's backward: say which forward values it reads and what is missing."""
    i, u = read_outside[0]
    dots = _unique([d for _, r in read_outside for d in ([r] if r.opcode == "dot" else
                                                         _dots_reached(r))
                    if id(d) not in ids])
    if not dots:
        return (f"%{i.name} ({i.opcode}, inside the attention) is also read by %{u.name} "
                f"outside it: fusing would still write the {list(i.shape.dims)} intermediate "
                "(returned attention weights need it)")
    read = ", ".join(f"%{x.name} ({x.opcode} {list(x.shape.dims)})"
                     for x in _unique([x for x, _ in read_outside]))
    return (f"the backward is not matched: the gradient reads the forward's {read} and feeds "
            f"them to {', '.join('%' + d.name for d in dots)} (dV = P^T.dO, dS = "
            "P*(dP - rowsum(dP*P)), dQ = dS.K, dK = dS^T.Q), but not in a form the fused "
            "backward (passes/fusion/attention_grad.py) takes, so the probabilities stay in "
            "memory and neither the forward nor the backward is fused")


_OUT_VIEWS = frozenset({"transpose", "copy", "bitcast", "reshape"})


def _permutation(inst: Instruction) -> Optional[tuple]:
    """``where`` of a view that permutes all of its operand's dims. Size-1 dims, which a
    bitcast leaves unpaired, are paired with the operand's left-over size-1 dims in order
    (which one goes where moves no element)."""
    step = view_step(inst)
    src = inst.operands[0].shape
    if step is None or src.rank != len(step):
        return None
    spare = iter(d for d in range(src.rank) if d not in step)
    step = tuple(next(spare, None) if d is None else d for d in step)
    if sorted(d for d in step if d is not None) != list(range(len(step))) or any(
            src.dims[d] != inst.shape.dims[i] for i, d in enumerate(step)):
        return None
    return step


def output_views(pv: Instruction) -> tuple[list[Instruction], tuple]:
    """The chain of transposes/copies that are ``pv``'s only readers and only permute its
    dims (e.g. einsum's [b,h,d,q] -> [b,q,h,d]): fused, the kernel stores each row
    straight into the consumer's layout instead of a separate copy kernel re-reading it."""
    chain: list[Instruction] = []
    where = tuple(range(pv.shape.rank)) if pv.shape.is_array else ()
    cur = pv
    while len(cur.users) == 1 and not cur.is_root:
        u = cur.users[0]
        step = _permutation(u) if u.opcode in _OUT_VIEWS and u.operands[0] is cur else None
        if step is None:
            break
        where = compose(step, where)
        chain.append(u)
        cur = u
    return chain, where


def attention_root(root: Instruction) -> tuple[Instruction, tuple]:
    """A fused attention body's root -> (pv, where): pv under the absorbed output views,
    ``where[i]`` the pv dim that the root's dim ``i`` is."""
    where = tuple(range(root.shape.rank)) if root.shape.is_array else ()
    cur = root
    while cur.opcode in _OUT_VIEWS:
        step = _permutation(cur)
        if step is None:
            break
        where = compose(where, step)
        cur = cur.operands[0]
    return cur, where
