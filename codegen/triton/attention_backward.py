"""The CUDA kernels of a flash-attention backward fusion (FlashAttention-2 style, Triton).

``flash_attention_backward(inst, operands, out=None)`` runs a ``__flash_attention_backward``
fusion (passes/fusion/attention_grad.py) on torch tensors. Its operands are q, k, v, the
cotangent dO, the forward's row max m and row sum l (the forward fusion outputs them) and
the bias/mask tensors; it writes dQ, dK and dV. P is never stored: both kernels recompute
it block by block as exp(score(q·kᵀ) − m) / l. Two launches:

1. ``_bwd_dq``, one program per query block: delta = rowsum(P ∘ dP) over all key blocks
   (dP = dO·Vᵀ), stored for kernel 2; then dS = scale · keep · P ∘ (dP − delta) and
   dQ += dS·K over the key blocks again. (The usual preprocess delta = rowsum(dO ∘ O) needs
   O, which the fusion does not read: the gradient jax.grad writes uses P·dP. Computing it
   here costs two extra block products per key block in this kernel.)
2. ``_bwd_dkdv``, one program per key block: over the query blocks that see it,
   dV += Pᵀ·dO and dK += dSᵀ·Q, computed in the transposed orientation (kᵀ rows) so no
   tile is transposed in registers.

A causal mask that keeps k <= q + c (c <= 0) skips the blocks above the diagonal in both
kernels and applies no mask to blocks wholly below it. Grouped query heads written as
extra row dims ([kv head, group, q]) are rows of one [z, h] slice: dK and dV sum over the
group inside kernel 2. Rows and keys need not be multiples of the blocks.
"""
from __future__ import annotations

from typing import Any, Optional

import triton
import triton.language as tl

from .attention import (ScorePlan, Unsupported, _pick, _pow2, _zh, cached_plan, key_range,
                        zh_out)


@triton.jit
def _causal_keep(qq, kq, DIR: tl.constexpr):
    if DIR == 0:
        keep = qq >= kq
    elif DIR == 1:
        keep = qq > kq
    elif DIR == 2:
        keep = qq <= kq
    elif DIR == 3:
        keep = qq < kq
    elif DIR == 4:
        keep = qq == kq
    else:
        keep = qq != kq
    return keep


@triton.jit
def _probs(s, qi, ki, m2, l2, Bias, Mask, bbase, mbase, sbm, sbn, smm, smn, M, N, Q_LEN,
           SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M,
           HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
           CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr):
    """(P, keep) for raw scores ``s`` = q·kᵀ of query rows ``qi`` and keys ``ki`` (2-D
    index tensors in either orientation): the score function as the forward applied it,
    then exp(x − m) / l with the forward's row statistics ``m2``, ``l2``."""
    s = s * SCALE1
    inside = (qi < M) & (ki < N)
    if HAS_BIAS:
        b = tl.load(Bias + bbase + qi * sbm + ki * sbn, mask=inside, other=0.0)
        s = s + BIAS_SIGN * b.to(tl.float32)
    s = s * SCALE2
    keep = inside
    if CAUSAL and EDGE:
        ck = _causal_keep(qi % Q_LEN, ki + DELTA, DIR)
        s = tl.where(ck, s, FILL_C)
        keep = keep & ck
    if HAS_MASK:
        mk = tl.load(Mask + mbase + qi * smm + ki * smn, mask=inside, other=0)
        mkeep = (mk != 0) == MASK_KEEP
        s = tl.where(mkeep, s, FILL_M)
        keep = keep & mkeep
    p = tl.exp(s - m2) / l2
    p = tl.where(ki < N, p, 0.0)
    return p, keep


@triton.jit
def _dq_block(q, do, m2, l2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias, Mask,
              kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm, smn,
              M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M, DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
              IEEE: tl.constexpr, GRAD: tl.constexpr, BN: tl.constexpr):
    """One key block for a query block: GRAD=False adds rowsum(P ∘ dP) to ``delta``,
    GRAD=True adds dS·K to ``dq``."""
    offs_n = start + tl.arange(0, BN)
    kt = tl.load(K + kbase + offs_n[None, :] * skn + offs_d[:, None] * skd,
                 mask=(offs_n[None, :] < N) & (offs_d[:, None] < D), other=0.0).to(q.dtype)
    vt = tl.load(V + vbase + offs_n[None, :] * svn + offs_dv[:, None] * svd,
                 mask=(offs_n[None, :] < N) & (offs_dv[:, None] < DV), other=0.0).to(q.dtype)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
        dp = tl.dot(do, vt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
        dp = tl.dot(do, vt)
    p, keep = _probs(s, qi, offs_n[None, :], m2, l2, Bias, Mask, bbase, mbase, sbm, sbn,
                     smm, smn, M, N, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M,
                     HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, EDGE)
    if GRAD:
        ds = tl.where(keep, p * (dp - delta[:, None]), 0.0) * DS_SCALE
        if IEEE:
            dq += tl.dot(ds.to(q.dtype), tl.trans(kt), input_precision="ieee")
        else:
            dq += tl.dot(ds.to(q.dtype), tl.trans(kt))
    else:
        delta += tl.sum(p * dp, 1)
    return delta, dq


@triton.jit
def _dq_sweep(q, do, m2, l2, delta, dq, full, hi, qi, offs_d, offs_dv, K, V, Bias, Mask,
              kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm, smn,
              M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M, DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, IEEE: tl.constexpr, GRAD: tl.constexpr,
              BN: tl.constexpr):
    """Every visible key block for a query block: [0, full) unmasked, [full, hi) masked."""
    for start in range(0, full, BN):
        delta, dq = _dq_block(q, do, m2, l2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias,
                              Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn,
                              smm, smn, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA,
                              FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                              DIR, False, IEEE, GRAD, BN)
    for start in range(full, hi, BN):
        delta, dq = _dq_block(q, do, m2, l2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias,
                              Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn,
                              smm, smn, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA,
                              FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                              DIR, True, IEEE, GRAD, BN)
    return delta, dq


@triton.jit
def _bwd_dq(Q, K, V, DO, RMax, RSum, Delta, DQ, Bias, Mask,
            sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd,
            sdz, sdh, sdm, sdd, srz, srh, srm, ssz, ssh, ssm, sez, seh, sem,
            sgz, sgh, sgm, sgd, sbz, sbh, sbm, sbn, smz, smh, smm, smn,
            H, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M, DS_SCALE,
            HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
            CAUSAL: tl.constexpr, DIR: tl.constexpr, SKIP: tl.constexpr, IEEE: tl.constexpr,
            DQ_PASS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
            BDV: tl.constexpr):
    pid_m = tl.program_id(0)
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    rows = offs_m < M
    q = tl.load(Q + z * sqz + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=rows[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + z * sdz + h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 mask=rows[:, None] & (offs_dv[None, :] < DV), other=0.0).to(q.dtype)
    m = tl.load(RMax + z * srz + h * srh + offs_m * srm, mask=rows, other=0.0).to(tl.float32)
    m = tl.where(m == float("-inf"), 0.0, m)
    l_ = tl.load(RSum + z * ssz + h * ssh + offs_m * ssm, mask=rows, other=1.0).to(tl.float32)
    m2 = m[:, None]
    l2 = l_[:, None]
    qi = offs_m[:, None]
    kbase = z * skz + h * skh
    vbase = z * svz + h * svh
    bbase = z * sbz + h * sbh
    mbase = z * smz + h * smh
    full, hi = key_range(pid_m, M, N, DELTA, CAUSAL, DIR, SKIP, BM, BN)
    delta = tl.zeros([BM], tl.float32)
    dq = tl.zeros([BM, BD], tl.float32)
    delta, dq = _dq_sweep(q, do, m2, l2, delta, dq, full, hi, qi, offs_d, offs_dv, K, V, Bias,
                          Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm,
                          smn, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C,
                          FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, IEEE,
                          False, BN)
    tl.store(Delta + z * sez + h * seh + offs_m * sem, delta, mask=rows)
    if not DQ_PASS:     # dQ accumulates in _bwd_dkdv (atomics)
        return
    delta, dq = _dq_sweep(q, do, m2, l2, delta, dq, full, hi, qi, offs_d, offs_dv, K, V, Bias,
                          Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm,
                          smn, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C,
                          FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, IEEE,
                          True, BN)
    tl.store(DQ + z * sgz + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
             dq.to(DQ.dtype.element_ty), mask=rows[:, None] & (offs_d[None, :] < D))


@triton.jit
def _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta, Bias, Mask,
                DQAcc, qbase, dobase, rbase, sbase, ebase, bbase, mbase, abase, sqm, sqd, sdm,
                sdd, srm, ssm, sem, sbm, sbn, smm, smn, sam, sad, M, N, D, DV, Q_LEN, SCALE1,
                SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M, DS_SCALE,
                HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
                CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
                IEEE: tl.constexpr, ATOMIC_DQ: tl.constexpr, BM: tl.constexpr):
    """One query block for a key block, transposed: tiles are [keys, rows]. ATOMIC_DQ:
    also adds this block's dS·K to the f32 dQ accumulator."""
    offs_m = start + tl.arange(0, BM)
    rows = offs_m < M
    qt = tl.load(Q + qbase + offs_m[None, :] * sqm + offs_d[:, None] * sqd,
                 mask=rows[None, :] & (offs_d[:, None] < D), other=0.0)
    do = tl.load(DO + dobase + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 mask=rows[:, None] & (offs_dv[None, :] < DV), other=0.0).to(k.dtype)
    m = tl.load(RMax + rbase + offs_m * srm, mask=rows, other=0.0).to(tl.float32)
    m = tl.where(m == float("-inf"), 0.0, m)
    l_ = tl.load(RSum + sbase + offs_m * ssm, mask=rows, other=1.0).to(tl.float32)
    delta = tl.load(Delta + ebase + offs_m * sem, mask=rows, other=0.0)
    if IEEE:
        st = tl.dot(k, qt.to(k.dtype), input_precision="ieee")
        dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
    else:
        st = tl.dot(k, qt.to(k.dtype))
        dpt = tl.dot(v, tl.trans(do))
    pt, keep = _probs(st, offs_m[None, :], ki, m[None, :], l_[None, :], Bias, Mask, bbase,
                      mbase, sbm, sbn, smm, smn, M, N, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA,
                      FILL_C, FILL_M, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, EDGE)
    dst = tl.where(keep, pt * (dpt - delta[None, :]), 0.0) * DS_SCALE
    if IEEE:
        dv += tl.dot(pt.to(k.dtype), do, input_precision="ieee")
        dk += tl.dot(dst.to(k.dtype), tl.trans(qt.to(k.dtype)), input_precision="ieee")
    else:
        dv += tl.dot(pt.to(k.dtype), do)
        dk += tl.dot(dst.to(k.dtype), tl.trans(qt.to(k.dtype)))
    if ATOMIC_DQ:
        if IEEE:
            dq = tl.dot(tl.trans(dst), k.to(tl.float32), input_precision="ieee")
        else:
            dq = tl.dot(tl.trans(dst.to(k.dtype)), k)
        tl.atomic_add(DQAcc + abase + offs_m[:, None] * sam + offs_d[None, :] * sad, dq,
                      mask=rows[:, None] & (offs_d[None, :] < D), sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, RMax, RSum, Delta, DK, DV_, DQAcc, Bias, Mask,
              sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd,
              sdz, sdh, sdm, sdd, srz, srh, srm, ssz, ssh, ssm, sez, seh, sem,
              skgz, skgh, skgn, skgd, svgz, svgh, svgn, svgd, saz, sah, sam, sad,
              sbz, sbh, sbm, sbn, smz, smh, smm, smn,
              H, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C, FILL_M, DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, SKIP: tl.constexpr, IEEE: tl.constexpr,
              ATOMIC_DQ: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              BDV: tl.constexpr):
    pid_n = tl.program_id(0)
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    keys = offs_n < N
    k = tl.load(K + z * skz + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                mask=keys[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + z * svz + h * svh + offs_n[:, None] * svn + offs_dv[None, :] * svd,
                mask=keys[:, None] & (offs_dv[None, :] < DV), other=0.0).to(k.dtype)
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BDV], tl.float32)
    ki = offs_n[:, None]
    qbase = z * sqz + h * sqh
    dobase = z * sdz + h * sdh
    rbase = z * srz + h * srh
    sbase = z * ssz + h * ssh
    ebase = z * sez + h * seh
    bbase = z * sbz + h * sbh
    mbase = z * smz + h * smh
    abase = z * saz + h * sah
    lo = 0
    full = 0       # query blocks [full, M) see every key of this block: no causal mask
    if SKIP:       # keep iff q >= k + DELTA (GE) or q > k + DELTA (GT)
        first = pid_n * BN + DELTA
        last = pid_n * BN + BN - 1 + DELTA
        if DIR == 1:
            first += 1
            last += 1
        lo = tl.minimum(tl.maximum(first, 0), M) // BM * BM
        full = tl.maximum(tl.minimum((tl.maximum(last, 0) + BM - 1) // BM * BM, M), lo)
    elif CAUSAL:
        full = M
    for start in range(lo, full, BM):
        dk, dv = _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
                             Bias, Mask, DQAcc, qbase, dobase, rbase, sbase, ebase, bbase, mbase,
                             abase, sqm, sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm, smn, sam,
                             sad, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C,
                             FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, True,
                             IEEE, ATOMIC_DQ, BM)
    for start in range(full, M, BM):
        dk, dv = _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
                             Bias, Mask, DQAcc, qbase, dobase, rbase, sbase, ebase, bbase, mbase,
                             abase, sqm, sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm, smn, sam,
                             sad, M, N, D, DV, Q_LEN, SCALE1, SCALE2, BIAS_SIGN, DELTA, FILL_C,
                             FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, False,
                             IEEE, ATOMIC_DQ, BM)
    tl.store(DK + z * skgz + h * skgh + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
             dk.to(DK.dtype.element_ty), mask=keys[:, None] & (offs_d[None, :] < D))
    tl.store(DV_ + z * svgz + h * svgh + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
             dv.to(DV_.dtype.element_ty), mask=keys[:, None] & (offs_dv[None, :] < DV))


# --- the launch --------------------------------------------------------------------------------
class BackwardPlan(ScorePlan):
    """What the launch needs from a backward fusion body: the operands' permutations into
    [batch..., seq..., d], the score function (ScorePlan), each output's order."""

    def __init__(self, comp):
        from passes.fusion.attention import NoMatch, _is_identity, _through
        from passes.fusion.attention_grad import (_dims, _side, gradient_order,
                                                   match_backward, other_dims)
        b, why = None, "no softmax divide"
        for inst in comp.instructions:
            if inst.opcode == "divide":
                try:
                    b = match_backward(inst, stats_given=True)
                    break
                except NoMatch as e:
                    why = str(e)
        if b is None:
            raise Unsupported(f"not a flash-attention backward body: {why}")
        nb = len(b.qk.attrs.get("lhs_batch_dims", ()))
        super().__init__(comp, b.qk, b.k_is_lhs, b.x, b.steps, nb)
        self.b = b
        self.ds_scale = self.scale1 * self.scale2
        self.m_stat, self.l_stat = self.param(b.m_src), self.param(b.l_src)

        def plain(inst):
            """The parameter ``inst`` reads through identity views and converts."""
            src, where, _ = _through(inst)
            if not _is_identity(where, src.shape.dims):
                raise Unsupported(f"%{inst.name} reads %{src.name} through a relayout")
            return src, self.param(src)
        vb, vc, vf = _dims(b.dp, 1)
        self.v = plain(b.dp.operands[1])[1]
        self.v_perm = vb + vf + vc
        p_side = _side(b.dv, b.div)
        # dO's rows in the order of the P rows they contract with (the scores' order)
        dob, doc, dof = other_dims(b.dv, p_side, b.div)
        self.do = plain(b.dv.operands[1 - p_side])[1]
        self.do_perm = dob + doc + dof
        g_sides = {"dq": _side(b.dq, b.g_root), "dk": _side(b.dk, b.g_root), "dv": p_side}
        for name, dot, want in (("dq", b.dq, self.k), ("dk", b.dk, self.q)):
            if plain(dot.operands[1 - g_sides[name]])[1] != want:
                raise Unsupported(f"%{dot.name} ({name}) does not read the forward's "
                                  f"{'k' if name == 'dq' else 'q'}")
        # each gradient's result dims as [batch, rows-or-keys in the scores' order..., d]
        self.perms = {n: gradient_order(d, g_sides[n], v) for n, d, v in
                      (("dq", b.dq, b.g_root), ("dk", b.dk, b.g_root), ("dv", b.dv, b.div))}
        outs = list(comp.root.operands) if comp.root.opcode == "tuple" else [comp.root]
        names = {id(b.dq): "dq", id(b.dk): "dk", id(b.dv): "dv"}
        self.outputs = [names.get(id(o), "") for o in outs]
        if sorted(self.outputs) != ["dk", "dq", "dv"]:
            raise Unsupported("a flash-attention backward fusion outputs dQ, dK and dV only")


def _candidates(dtype_bytes: int, d: int) -> list[tuple[bool, tuple, tuple]]:
    """(atomic dQ?, (BM, BN, warps, stages) of _bwd_dq, the same of _bwd_dkdv) configs
    that fit an H100/H200 SM's shared memory and registers, the untuned default first.
    atomic: _bwd_dq only computes delta and _bwd_dkdv adds dS·K into an f32 dQ with
    atomics (7 block products per block pair instead of 9); measured against the two-pass
    dQ kernel per shape by the autotuner."""
    if dtype_bytes >= 4:
        pairs = [((32, 32, 4, 1), (32, 32, 4, 1))] if d > 64 else \
            [((64, 32, 4, 2), (32, 64, 4, 2))]
    elif d <= 64:
        pairs = [((128, 64, 8, 2), (32, 128, 4, 3)), ((64, 64, 4, 3), (64, 64, 4, 3)),
                 ((128, 32, 4, 3), (64, 128, 8, 2))]
    elif d <= 128:
        pairs = [((128, 32, 8, 2), (32, 128, 4, 2)), ((64, 64, 4, 2), (64, 64, 4, 2)),
                 ((128, 64, 8, 2), (64, 128, 8, 2)), ((64, 32, 4, 3), (32, 64, 4, 3))]
    else:
        pairs = [((64, 32, 8, 1), (32, 64, 8, 1)), ((32, 32, 4, 1), (32, 32, 4, 1))]
    return [(False, *pair) for pair in pairs] + [(True, *pair) for pair in pairs]


_CANDIDATES = _candidates      # tests swap in one variant


def plan_for(inst) -> BackwardPlan:
    return cached_plan(BackwardPlan, inst)


def flash_attention_backward(inst, operands: list, out: Optional[Any] = None) -> tuple:
    """Run the backward fusion ``inst`` on torch tensors: (dQ, dK, dV) in the fusion's
    output order, written into ``out`` (a tuple of tensors) if given."""
    import torch
    p = plan_for(inst)
    nb = p.nb
    q = _zh(operands[p.q].permute(p.q_perm), nb)
    k = _zh(operands[p.k].permute(p.k_perm), nb)
    v = _zh(operands[p.v].permute(p.v_perm), nb)
    do = _zh(operands[p.do].permute(p.do_perm), nb)
    Z, H, M, D = q.shape
    N, DV = k.shape[2], v.shape[3]
    if tuple(k.shape[:2]) != (Z, H) or tuple(do.shape) != (Z, H, M, DV):
        raise Unsupported("q, k, v and dO batch/head/row counts differ")
    rmax = operands[p.m_stat].reshape(Z, H, M)
    rsum = operands[p.l_stat].reshape(Z, H, M)
    if out is None:
        out = tuple(torch.empty(tuple(s.dims), device=q.device, dtype=(q, k, v)[
            ("dq", "dk", "dv").index(n)].dtype) for s, n in zip(inst.shape.elements, p.outputs))
    by_name = dict(zip(p.outputs, out))
    shapes = {"dq": (Z, H, M, D), "dk": (Z, H, N, D), "dv": (Z, H, N, DV)}
    grads = {n: zh_out(by_name[n].permute(p.perms[n]), shapes[n], nb) for n in shapes}
    dq, dk, dv = (grads[n][0] for n in ("dq", "dk", "dv"))
    delta = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
    bias, bstr, mask, mstr, keep, fill_m = p.score_args(operands)
    dlt, fill_c, causal = p.causal_args()
    common = (H, M, N, D, DV, p.q_len, p.scale1, p.scale2, p.sign, dlt, fill_c, fill_m,
              p.ds_scale)
    flags = dict(HAS_BIAS=p.bias is not None, HAS_MASK=p.mask is not None, MASK_KEEP=keep,
                 IEEE=q.element_size() >= 4, BD=_pow2(D), BDV=_pow2(DV), **causal)
    ins = (q, k, v, do, rmax, rsum, delta)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *rmax.stride(),
               *rsum.stride(), *delta.stride())

    def launch(cfg: tuple) -> None:
        atomic, (bm, bn, warps, stages), (bm2, bn2, warps2, stages2) = cfg
        acc = torch.zeros((Z, H, M, D), dtype=torch.float32, device=q.device) if atomic \
            else delta
        _bwd_dq[(triton.cdiv(M, bm), Z * H)](
            *ins, dq, bias, mask, *strides, *dq.stride(), *bstr, *mstr, *common,
            DQ_PASS=not atomic, BM=bm, BN=bn, num_warps=warps, num_stages=stages, **flags)
        _bwd_dkdv[(triton.cdiv(N, bn2), Z * H)](
            *ins, dk, dv, acc, bias, mask, *strides, *dk.stride(), *dv.stride(),
            *(acc.stride() if atomic else (0, 0, 0, 0)), *bstr, *mstr, *common,
            ATOMIC_DQ=atomic, BM=bm2, BN=bn2, num_warps=warps2, num_stages=stages2, **flags)
        if atomic:
            dq.copy_(acc)

    key = (str(q.device), q.dtype, D, DV, Z * H, M, N, p.causal is not None,
           p.bias is not None, p.mask is not None, "backward")
    launch(_pick(key, _CANDIDATES(q.element_size(), max(D, DV)), launch, q))
    for t, dst in grads.values():
        if dst is not None:
            dst.copy_(t.reshape(dst.shape))
    return out
