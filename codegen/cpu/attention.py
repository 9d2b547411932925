"""The CPU kernel of a flash-attention fusion: blocked online softmax in numpy.

The fusion body is matched again (``passes.fusion.attention.match_attention``); then the
keys are walked in blocks of ``BLOCK_K``. For each block the score function (scale, bias,
masks: whatever instructions lie between the first dot and the softmax) is evaluated on
that slice of the key axis only, by ``_Slicer``: every instruction of the body knows how
to produce its value restricted to a range of one dimension (a dot with a slice of k, an
iota with a slice of its range, a broadcast of a sliced operand, ...). The running row
maximum, row sum and output accumulator are rescaled as the maximum grows, so the
``[batch, rows, keys]`` scores exist one block at a time, as in the GPU kernel.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from hlo.errors import InvalidArgumentError
from hlo.evaluator.core import EvalContext, Evaluator
from hlo.evaluator.linalg import accumulation_dtype, dot_general, to_result
from hlo.ir import Instruction

BLOCK_K = 128


class _Slicer:
    """Values of body instructions, whole (``dim=None``) or restricted to ``ks`` along one
    dimension of the scores' shape (the keys), and optionally to ``qs`` along a second
    (``qdim``: the query position, for row blocks that skip the key blocks outside a
    causal band)."""

    def __init__(self, params: dict[int, np.ndarray], qk: Instruction, ctx: EvalContext):
        self.params, self.qk, self.ctx = params, qk, ctx
        self.whole: dict[int, np.ndarray] = {}
        self.block: dict[tuple, np.ndarray] = {}
        self.ks = slice(0, 0)
        self.qs = slice(None)

    def full(self, inst: Instruction) -> np.ndarray:
        v = self.whole.get(id(inst))
        if v is None:
            if inst.opcode == "parameter":
                v = self.params[id(inst)]
            elif inst.opcode == "constant":
                v = np.asarray(inst.literal)
            else:
                v = inst.op.evaluate(inst, [self.full(o) for o in inst.operands], self.ctx)
            self.whole[id(inst)] = v
        return v

    def at(self, inst: Instruction, dim: Optional[int],
           qdim: Optional[int] = None) -> np.ndarray:
        """``inst``'s value with dimension ``dim`` restricted to the current key block (and
        ``qdim`` to the current query rows ``qs``)."""
        if dim is None and qdim is None:
            return self.full(inst)
        key = (id(inst), dim, qdim)
        v = self.block.get(key)
        if v is None:
            v = self._at(inst, dim, qdim)
            self.block[key] = v
        return v

    def _cuts(self, dim: Optional[int], qdim: Optional[int]) -> list[tuple[int, slice]]:
        return [(d, c) for d, c in ((dim, self.ks), (qdim, self.qs)) if d is not None]

    def _shape(self, inst: Instruction, dim: Optional[int], qdim: Optional[int]
               ) -> tuple[int, ...]:
        dims = list(inst.shape.dims)
        for d, c in self._cuts(dim, qdim):
            dims[d] = len(range(*c.indices(dims[d])))
        return tuple(dims)

    def _at(self, inst: Instruction, dim: Optional[int], qdim: Optional[int]) -> np.ndarray:
        op = inst.opcode
        cuts = self._cuts(dim, qdim)
        if op == "dot":
            a = inst.attrs
            lb, lc = list(a.get("lhs_batch_dims", ())), list(a.get("lhs_contracting_dims", ()))
            rb, rc = list(a.get("rhs_batch_dims", ())), list(a.get("rhs_contracting_dims", ()))
            lhs, rhs = self.full(inst.operands[0]), self.full(inst.operands[1])
            lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
            rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
            cut = lambda x, d, c: x[(slice(None),) * d + (c,)]  # noqa: E731
            if all(d >= len(lb) for d, _ in cuts):   # free dims: slice their operands
                for d, c in cuts:
                    if d < len(lb) + len(lf):
                        lhs = cut(lhs, lf[d - len(lb)], c)
                    else:
                        rhs = cut(rhs, rf[d - len(lb) - len(lf)], c)
                res = inst.shape.dtype
                out = dot_general(lhs, rhs, a.get("lhs_batch_dims", ()), rb,
                                  a.get("lhs_contracting_dims", ()), rc,
                                  accumulation_dtype(res, lhs, rhs))
                return to_result(out, res)
        elif op in ("parameter", "constant") or (
                inst.op.category != "elementwise" and op not in (
                    "broadcast", "iota", "transpose", "select") and not _permutes(inst)):
            pass
        elif op == "iota":
            d = inst.attrs.get("iota_dimension", 0)
            n = inst.shape.dims[d]
            r = np.arange(n)
            for cd, c in cuts:
                if cd == d:
                    r = r[c]
            shape = self._shape(inst, dim, qdim)
            r = r.reshape([-1 if i == d else 1 for i in range(len(shape))])
            return np.broadcast_to(r, shape).astype(inst.shape.dtype.np_dtype)
        elif op == "broadcast":
            dims = list(inst.attrs.get("dimensions", ()))
            src = inst.operands[0]
            j = dims.index(dim) if dim in dims else None
            jq = dims.index(qdim) if qdim in dims else None
            v = self.at(src, j, jq)
            order = sorted(range(len(dims)), key=lambda i: dims[i])
            v = np.transpose(v, order)
            shape = self._shape(inst, dim, qdim)
            expand = [1] * len(shape)
            for i in order:
                expand[dims[i]] = v.shape[order.index(i)]
            return np.broadcast_to(v.reshape(expand), shape)
        elif op == "transpose" or (op in ("bitcast", "copy") and _permutes(inst)):
            # a bitcast to another layout that permutes the dims is a transpose
            perm = list(inst.attrs["dimensions"]) if op == "transpose" else _permutes(inst)
            return np.transpose(self.at(inst.operands[0], None if dim is None else perm[dim],
                                        None if qdim is None else perm[qdim]), perm)
        else:   # elementwise (select, compare, convert, arithmetic)
            same = [o.shape.rank == inst.shape.rank for o in inst.operands]
            ops = [self.at(o, dim if s else None, qdim if s else None)
                   for o, s in zip(inst.operands, same)]
            return inst.op.evaluate(inst, ops, self.ctx)
        v = self.full(inst)
        for d, c in cuts:
            v = np.take(v, np.arange(inst.shape.dims[d])[c], axis=d)
        return v


def _permutes(inst: Instruction) -> Optional[list]:
    """``where`` of a bitcast/copy that only permutes its operand's dims, else None."""
    if inst.opcode not in ("bitcast", "copy"):
        return None
    from passes.fusion.attention import _permutation
    step = _permutation(inst)
    return list(step) if step is not None else None


def run_attention(comp, operands: list[np.ndarray], block_k: Optional[int] = None,
                  ctx: Optional[EvalContext] = None) -> np.ndarray:
    """Evaluate a flash-attention fused computation on ``operands``."""
    from passes.fusion.attention import (NoMatch, attention_root, canonical, match_attention,
                                         row_stats)
    outs = list(comp.root.operands) if comp.root.opcode == "tuple" else [comp.root]
    o_out = next((o for o in outs if attention_root(o)[0].opcode == "dot"), comp.root)
    pv, out_where = attention_root(o_out)
    try:
        m = match_attention(pv, stats_out=len(outs) > 1)
    except NoMatch as e:
        raise InvalidArgumentError(f"{comp.name}: not a flash-attention body: {e}") from None
    if m is None:
        raise InvalidArgumentError(f"{comp.name}: not a flash-attention body (its root "
                                   f"%{comp.root.name} is not softmax·v)")
    ctx = ctx or EvalContext(Evaluator())
    params = {id(p): operands[p.attrs.get("parameter_number", k)]
              for k, p in enumerate(comp.parameters)}
    sl = _Slicer(params, m.qk, ctx)
    scores = m.logits.shape.dims        # [batch..., rows..., keys] (rows maybe transposed)
    last = len(scores) - 1
    n_keys = scores[last]
    nb = m.n_batch
    pv = m.pv
    # The probabilities' path: sub = x - max, its operand x (the score function's result).
    div = _strip(pv.operands[0 if m.p_is_lhs else 1])
    ex = _strip(div.operands[0])
    sub = _strip(ex.operands[0])
    x_inst = sub.operands[0]
    acc_t = np.float64 if "f64" in (pv.shape.dtype.name, sub.shape.dtype.name) else np.float32
    p_dtype = pv.operands[0 if m.p_is_lhs else 1].shape.dtype.np_dtype
    a = pv.attrs
    vside = "rhs" if m.p_is_lhs else "lhs"
    v = sl.full(m.v)
    vb = list(a.get(f"{vside}_batch_dims", ()))
    vc = list(a.get(f"{vside}_contracting_dims", ()))
    vf = [d for d in range(v.ndim) if d not in vb and d not in vc]
    vc_t = np.transpose(v, vb + vc + vf)                   # [batch..., keys, dv]
    # the kernel's order [batch..., rows..., keys] (the scores may interleave them)
    canon = canonical(m.logits, m.qk)
    rows = tuple(scores[d] for d in canon[nb:last])
    bshape = tuple(scores[d] for d in canon[:nb])
    flat_rows = math.prod(rows)
    m_run = np.full(bshape + (flat_rows,), -np.inf, acc_t)
    l_run = np.zeros(bshape + (flat_rows,), acc_t)
    acc = np.zeros(bshape + (flat_rows, vc_t.shape[-1]), acc_t)
    step = block_k or BLOCK_K
    q_dim, blocks = _band_blocks(m, canon, scores, step)
    for qs, rs, k_lo, k_hi in blocks:
        sl.qs = qs
        for start in range(k_lo, k_hi, step):
            sl.ks = slice(start, min(start + step, n_keys))
            sl.block.clear()
            x = np.transpose(sl.at(x_inst, last, q_dim), canon).astype(acc_t).reshape(
                bshape + (len(range(*rs.indices(flat_rows))), -1))
            m_old = m_run[..., rs]
            m_new = np.maximum(m_old, x.max(axis=-1))
            # A row with nothing unmasked so far keeps 0 as its shift (exp(-inf) = 0, not
            # NaN).
            shift = np.where(np.isneginf(m_new), 0, m_new)
            with np.errstate(invalid="ignore", over="ignore"):
                e = np.exp(x - shift[..., None])
                alpha = np.exp(m_old - shift)
            p = e.astype(p_dtype).astype(acc_t)
            vblk = vc_t[..., sl.ks, :].astype(acc_t)
            acc[..., rs, :] = acc[..., rs, :] * alpha[..., None] + np.matmul(p, vblk)
            l_run[..., rs] = l_run[..., rs] * alpha + e.sum(axis=-1)
            m_run[..., rs] = m_new
    with np.errstate(invalid="ignore", divide="ignore"):
        out = acc / l_run[..., None]
    out = out.reshape(bshape + tuple(rows) + (out.shape[-1],))
    if not m.p_is_lhs:      # dot(v, p): [batch..., dv, rows...]
        out = np.moveaxis(out, -1, nb)
    # the fused output views (a transpose to the consumer's order): root dim i is pv dim where[i]
    o = np.transpose(out, out_where).astype(pv.shape.dtype.np_dtype)
    if comp.root.opcode != "tuple":
        return o
    # A forward for a backward also outputs its row max and row sum (the logsumexp).
    # (as [batch, rows] in the kernel's order, back to the scores' order without the keys)
    back = [canon[:last].index(d) for d in range(last)]
    stats = {id(i): np.transpose(v.reshape(bshape + rows), back)
             for i, v in zip(row_stats(m), (m_run, l_run))}
    results = []
    for r in outs:
        if r is o_out:
            results.append(o)
        elif id(r) in stats:
            results.append(stats[id(r)].reshape(r.shape.dims).astype(r.shape.dtype.np_dtype))
        else:
            raise InvalidArgumentError(f"{comp.name}: output %{r.name} of a flash-attention "
                                       "fusion is not its result, row max or row sum")
    return tuple(results)


def _band_blocks(m, canon: list, scores: tuple, step: int
                 ) -> tuple[Optional[int], list[tuple[slice, slice, int, int]]]:
    """(query score dim or None, [(query positions, canonical rows, first key, end key)]):
    the row blocks and the key range each must visit. With a causal band that keeps the
    diagonal (k in [q - hi, q - lo], lo <= 0 <= hi) on the outermost row dim, rows go in
    blocks of ``step`` query positions and visit only the key blocks the band reaches,
    as the GPU kernels skip them; otherwise one block of all rows and every key."""
    from passes.fusion.attention import keeps_diagonal
    nb, last = m.n_batch, len(scores) - 1
    n_keys = scores[last]
    everything = (None, [(slice(None), slice(None), 0, n_keys)])
    c = m.causal
    if c is None or not keeps_diagonal(c) or canon[nb] != c.q_dim or \
            sum(s.kind == "causal" for s in m.steps) != 1:
        return everything
    q_len = scores[c.q_dim]
    q_div = math.prod(scores[d] for d in canon[nb + 1:last])
    if q_len > n_keys:      # rows past the keys keep nothing: leave them to the general path
        return everything
    lo = c.delta + (1 if c.direction == "GT" else 0)
    blocks = []
    for q0 in range(0, q_len, step):
        q1 = min(q0 + step, q_len)
        k_lo = 0 if c.window is None else max(0, q0 - c.window) // step * step
        k_hi = min(n_keys, q1 - lo)
        blocks.append((slice(q0, q1), slice(q0 * q_div, q1 * q_div), k_lo, k_hi))
    return c.q_dim, blocks


def _strip(inst: Instruction) -> Instruction:
    from passes.fusion.views import trace_view
    return trace_view(inst, converts=True)[0]


class AttentionKernel:
    """``kernel(*operands)`` for a flash-attention fusion (the CPU backend's kernel)."""
    name = "flash_attention_reference"

    def __init__(self, fusion_inst: Instruction):
        self.fusion = fusion_inst
        self.comp = fusion_inst.attrs["calls"]
        self.block_k: Optional[int] = None

    def __call__(self, *operands: np.ndarray) -> np.ndarray:
        return run_attention(self.comp, list(operands), self.block_k)
