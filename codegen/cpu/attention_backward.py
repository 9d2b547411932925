"""The CPU kernel of a flash-attention backward fusion: blocked numpy, no [rows, keys] tensor.

The body (passes/fusion/attention_grad.py) holds the recompute chain (q·k, score function,
exp(x - m) / l with the forward's row max m and row sum l as parameters), dP = dO·Vᵀ, the
softmax gradient and the three gradient dots. It is matched again here; then the keys are
walked in blocks of ``BLOCK_K`` twice, as the GPU kernels do:

1. delta = rowsum(P ∘ dP), P recomputed per block from the scores and (m, l);
2. dS = scale · keep · P ∘ (dP − delta); dQ += dS·K_blk, and the block's rows of
   dK = dSᵀ·Q and dV = Pᵀ·dO are written.

Each gradient is computed by its own dot instruction's contraction (``dot_general`` with
the block in place of dS or P, transposed as that dot reads it), so whatever dimension
order jax.grad chose comes out. Grouped query heads ([kv head, group, q] rows) need nothing
more: dK and dV contract the group with the queries, which sums over it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from hlo.errors import InvalidArgumentError
from hlo.evaluator.core import EvalContext, Evaluator
from hlo.evaluator.linalg import dot_general
from hlo.ir import Instruction

from .attention import _Slicer

BLOCK_K = 128


def match_body(comp):
    from passes.fusion.attention import NoMatch
    from passes.fusion.attention_grad import match_backward
    why = "no softmax divide"
    for inst in comp.instructions:
        if inst.opcode != "divide":
            continue
        try:
            return match_backward(inst, stats_given=True)
        except NoMatch as e:
            why = str(e)
    raise InvalidArgumentError(f"{comp.name}: not a flash-attention backward body: {why}")


def _contract(dot: Instruction, value_side: int, source: Instruction, value: np.ndarray,
              other: np.ndarray, acc) -> np.ndarray:
    """``dot``'s contraction with ``value`` (a block of ``source``, dS or P, in the scores'
    order) as its ``value_side`` operand, which may read ``source`` transposed (rounded to
    that operand's element type first, as the unfused program rounds it)."""
    from passes.fusion.attention_grad import value_perm
    perm = value_perm(dot, value_side, source)
    assert perm is not None
    value = np.transpose(value, perm)
    value = value.astype(dot.operands[value_side].shape.dtype.np_dtype).astype(acc)
    lhs, rhs = (value, other) if value_side == 0 else (other, value)
    a = dot.attrs
    return dot_general(lhs.astype(acc), rhs.astype(acc), a.get("lhs_batch_dims", ()),
                       a.get("rhs_batch_dims", ()), a.get("lhs_contracting_dims", ()),
                       a.get("rhs_contracting_dims", ()), acc)


def _dims(dot: Instruction, side: int) -> tuple[list, list, list]:
    from passes.fusion.attention_grad import _dims as dims
    return dims(dot, side)


def _side_of(dot: Instruction, src: Instruction) -> int:
    from passes.fusion.attention_grad import _side
    side = _side(dot, src)
    assert side is not None
    return side


def _in_score_order(sl: _Slicer, inst: Instruction, to_scores: tuple) -> np.ndarray:
    """The current key block of ``inst`` (a [rows, keys] value whose dim d is score dim
    ``to_scores[d]``), transposed into the scores' order."""
    at = {s: d for d, s in enumerate(to_scores)}
    block = sl.at(inst, at[len(to_scores) - 1])
    return np.transpose(block, [at[s] for s in range(len(to_scores))])


def run_attention_backward(comp, operands: list[np.ndarray], block_k: Optional[int] = None,
                           ctx: Optional[EvalContext] = None) -> tuple:
    b = match_body(comp)
    ctx = ctx or EvalContext(Evaluator())
    params = {id(p): operands[p.attrs.get("parameter_number", k)]
              for k, p in enumerate(comp.parameters)}
    sl = _Slicer(params, b.qk, ctx)
    scores = b.x.shape.dims
    last, n_keys = len(scores) - 1, scores[-1]
    acc = np.dtype(np.float64 if "f64" in (b.x.shape.dtype.name, b.dq.shape.dtype.name)
                   else np.float32)
    m = sl.full(b.m_src).astype(acc).reshape(scores[:-1] + (1,))
    m = np.where(np.isneginf(m), 0, m)
    l_ = sl.full(b.l_src).astype(acc).reshape(scores[:-1] + (1,))
    p_type = b.div.shape.dtype.np_dtype
    step = block_k or BLOCK_K
    blocks = [slice(s, min(s + step, n_keys)) for s in range(0, n_keys, step)]

    def probabilities(ks: slice) -> tuple[np.ndarray, np.ndarray]:
        sl.ks = ks
        sl.block.clear()
        x = sl.at(b.x, last).astype(acc)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            p = (np.exp(x - m) / l_).astype(p_type).astype(acc)
        return p, _in_score_order(sl, b.dp, b.dp_perm).astype(acc)

    delta = np.zeros(scores[:-1] + (1,), acc)
    for ks in blocks:
        p, dp = probabilities(ks)
        delta += (p * dp).sum(axis=-1, keepdims=True)

    dq_side = 1 - _side_of(b.dq, b.g_root)
    dk_side = 1 - _side_of(b.dk, b.g_root)
    dv_side = 1 - _side_of(b.dv, b.div)
    k_full = sl.full(b.dq.operands[dq_side])
    k_seq = _dims(b.dq, dq_side)[1][0]
    q_full = sl.full(b.dk.operands[dk_side])
    do_full = sl.full(b.dv.operands[dv_side])
    dq = np.zeros(b.dq.shape.dims, acc)
    dk = np.zeros(b.dk.shape.dims, acc)
    dv = np.zeros(b.dv.shape.dims, acc)
    nb = len(_dims(b.dq, 0)[0])
    for ks in blocks:
        p, dp = probabilities(ks)
        ds = p * (dp - delta)
        for pred, keep in b.selects:        # read in dS's order (b.g_perm)
            ds = np.where(_in_score_order(sl, pred, b.g_perm) == keep, ds, 0)
        ds = np.transpose(ds * b.scale, b.g_perm)    # the dS block as the dots read dS
        dq += _contract(b.dq, 1 - dq_side, b.g_root, ds,
                        np.take(k_full, np.arange(n_keys)[ks], axis=k_seq), acc)
        for out, dot, side, src, val, other in ((dk, b.dk, 1 - dk_side, b.g_root, ds, q_full),
                                                (dv, b.dv, 1 - dv_side, b.div, p, do_full)):
            # the keys are the one free dim of dS / P: their place among the output dims
            kpos = nb if side == 0 else nb + len(_dims(dot, 0)[2])
            idx = [slice(None)] * out.ndim
            idx[kpos] = ks
            out[tuple(idx)] = _contract(dot, side, src, val, other, acc)
    results = {id(b.dq): dq, id(b.dk): dk, id(b.dv): dv}
    outs = list(comp.root.operands) if comp.root.opcode == "tuple" else [comp.root]
    if any(id(o) not in results for o in outs):
        raise InvalidArgumentError(f"{comp.name}: a flash-attention backward outputs dQ, dK "
                                   "and dV only")
    return tuple(results[id(o)].astype(o.shape.dtype.np_dtype) for o in outs)


class AttentionBackwardKernel:
    """``kernel(*operands)`` for a flash-attention backward fusion (the CPU backend's)."""
    name = "flash_attention_backward_reference"

    def __init__(self, fusion_inst: Instruction):
        self.fusion = fusion_inst
        self.comp = fusion_inst.attrs["calls"]
        self.block_k: Optional[int] = None

    def __call__(self, *operands: np.ndarray):
        out = run_attention_backward(self.comp, list(operands), self.block_k)
        return out if len(out) > 1 else out[0]
