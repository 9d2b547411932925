"""The CUDA kernels of a flash-attention backward fusion (FlashAttention-2 style, Triton).

``flash_attention_backward(inst, operands, out=None)`` runs a ``__flash_attention_backward``
fusion (passes/fusion/attention_grad.py) on torch tensors. Its operands are q, k, v, the
cotangent dO, the forward's row max m and row sum l (the forward fusion outputs them) and
the bias/mask tensors; it writes dQ, dK and dV. P is never stored: every kernel recomputes
it block by block as exp(score(q·kᵀ) − m) / l. Three launches, each with its own tiles
(autotuned apart: they are separate launches, so the fastest total is each one's fastest):

1. ``_bwd_dq`` GRAD=False, one program per query block: delta = rowsum(P ∘ dP) over the
   visible key blocks (dP = dO·Vᵀ). (The usual preprocess delta = rowsum(dO ∘ O) needs O,
   which the fusion does not read: the gradient jax.grad writes uses P·dP. This pass is
   two block products per block pair, about a fifth of the backward at D128.)
2. ``_bwd_dq`` GRAD=True: dS = scale · keep · P ∘ (dP − delta), dQ += dS·K.
3. ``_bwd_dkdv``, one program per key block: over the query blocks that see it,
   dV += Pᵀ·dO and dK += dSᵀ·Q, computed in the transposed orientation (kᵀ rows) so no
   tile is transposed in registers.

A causal mask that keeps k <= q + c (c <= 0) skips the blocks above the diagonal and
applies no mask to blocks wholly below it; the blocks that see the most keys (rows) start
first. Without a bias or boolean mask (``_fold``) P is exp2 of one multiply-subtract with
log2(e) folded into the scale and the row max, and dropped scores are -inf (no selects).
Grouped query heads written as extra row dims ([kv head, group, q]) are rows of one
[z, h] slice: dK and dV sum over the group inside kernel 3. Rows and keys need not be
multiples of the blocks. The tile choices are measured in benchmarks/attention_bwd_sweep.py.
"""
from __future__ import annotations

from typing import Any, Optional

import triton
import triton.language as tl

from passes.fusion.attention_grad import forward_output_perm

from . import direct_launch

from .attention import (NO_WINDOW, ScorePlan, Unsupported, _pick, _pow2, _zh, band_keep,
                        cached_plan, key_range, zh_out)


@triton.jit
def _probs(s, qi, ki, m2, r2, Bias, Mask, bbase, mbase, sbm, sbn, smm, smn, M, N, Q_LEN,
           Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
           HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
           CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
           FOLD: tl.constexpr, KEYS: tl.constexpr):
    """(P, keep) for raw scores ``s`` = q·kᵀ of query rows ``qi`` and keys ``ki`` (2-D
    index tensors in either orientation), from the forward's row max and 1/row sum (``m2``,
    ``r2``, broadcast like ``s``).

    FOLD (no bias, no boolean mask, every row keeps a key): one multiply by
    scale·log2(e) and exp2 against the row max pre-multiplied by log2(e) (``m2``); a
    dropped score is -inf, so P needs no select (``keep`` is a placeholder). Otherwise the score
    function as the forward applied it, in its own units (a finite mask fill then gives
    the forward's P), and ``keep`` says which scores dS passes. EDGE: the block may cross
    the causal diagonal; KEYS: it may hold keys >= N."""
    if FOLD:
        t = s * (SCALE1 * SCALE2 * 1.4426950408889634)
        if CAUSAL and EDGE:
            t = tl.where(band_keep((qi // Q_DIV) % Q_LEN, ki, DELTA, WHI, DIR), t,
                         float("-inf"))
        if KEYS:
            t = tl.where(ki < N, t, float("-inf"))
        p = tl.exp2(t - m2) * r2
        keep = t == t       # unused (dS needs no select): a placeholder of the same shape
    else:
        s = s * SCALE1
        inside = (qi < M) & (ki < N)
        if HAS_BIAS:
            b = tl.load(Bias + bbase + qi * sbm + ki * sbn, mask=inside, other=0.0)
            s = s + BIAS_SIGN * b.to(tl.float32)
        s = s * SCALE2
        keep = inside
        if CAUSAL and EDGE:
            ck = band_keep((qi // Q_DIV) % Q_LEN, ki, DELTA, WHI, DIR)
            s = tl.where(ck, s, FILL_C)
            keep = keep & ck
        if HAS_MASK:
            mk = tl.load(Mask + mbase + qi * smm + ki * smn, mask=inside, other=0)
            mkeep = (mk != 0) == MASK_KEEP
            s = tl.where(mkeep, s, FILL_M)
            keep = keep & mkeep
        p = tl.exp(s - m2) * r2
        p = tl.where(ki < N, p, 0.0)
    return p, keep


@triton.jit
def _row_stats(RMax, RSum, rbase, sbase, offs, srm, ssm, rows, FOLD: tl.constexpr):
    """The forward's row max (times log2(e) when FOLD; a row that kept nothing shifts by
    0, as the forward's did) and 1 / row sum for rows ``offs``."""
    m = tl.load(RMax + rbase + offs * srm, mask=rows, other=0.0).to(tl.float32)
    m = tl.where(m == float("-inf"), 0.0, m)
    if FOLD:
        m = m * 1.4426950408889634
    r = 1.0 / tl.load(RSum + sbase + offs * ssm, mask=rows, other=1.0).to(tl.float32)
    return m, r


@triton.jit
def _dq_block(q, do, m2, r2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias, Mask,
              kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm, smn,
              M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
              DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
              IEEE: tl.constexpr, FOLD: tl.constexpr, GRAD: tl.constexpr, BN: tl.constexpr):
    """One key block for a query block: GRAD=False adds rowsum(P ∘ dP) to ``delta``,
    GRAD=True adds dS·K to ``dq``. EDGE=False blocks hold only keys < N that every row
    of the block sees."""
    offs_n = start + tl.arange(0, BN)
    if EDGE:
        kt = tl.load(K + kbase + offs_n[None, :] * skn + offs_d[:, None] * skd,
                     mask=(offs_n[None, :] < N) & (offs_d[:, None] < D), other=0.0)
        vt = tl.load(V + vbase + offs_n[None, :] * svn + offs_dv[:, None] * svd,
                     mask=(offs_n[None, :] < N) & (offs_dv[:, None] < DV), other=0.0)
    else:
        kt = tl.load(K + kbase + offs_n[None, :] * skn + offs_d[:, None] * skd,
                     mask=offs_d[:, None] < D, other=0.0)
        vt = tl.load(V + vbase + offs_n[None, :] * svn + offs_dv[:, None] * svd,
                     mask=offs_dv[:, None] < DV, other=0.0)
    kt = kt.to(q.dtype)
    vt = vt.to(q.dtype)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
        dp = tl.dot(do, vt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
        dp = tl.dot(do, vt)
    p, keep = _probs(s, qi, offs_n[None, :], m2, r2, Bias, Mask, bbase, mbase, sbm, sbn,
                     smm, smn, M, N, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C,
                     FILL_M,
                     HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, EDGE, FOLD, EDGE)
    if GRAD:
        ds = p * (dp - delta[:, None])
        if not FOLD:
            ds = tl.where(keep, ds, 0.0)
        # scaled before its rounding to the input type, as the unfused gradient rounds it
        ds = ds * DS_SCALE
        if IEEE:
            dq += tl.dot(ds.to(q.dtype), tl.trans(kt), input_precision="ieee")
        else:
            dq += tl.dot(ds.to(q.dtype), tl.trans(kt))
    else:
        delta += tl.sum(p * dp, 1)
    return delta, dq


@triton.jit
def _dq_sweep(q, do, m2, r2, delta, dq, lo, wfull, full, hi, qi, offs_d, offs_dv, K, V, Bias, Mask,
              kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm, smn,
              M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
              DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, IEEE: tl.constexpr, FOLD: tl.constexpr,
              GRAD: tl.constexpr, BN: tl.constexpr):
    """Every visible key block for a query block: [lo, wfull) masked (a window's lower
    edge), [wfull, full) unmasked, [full, hi) masked (key_range)."""
    for start in range(lo, wfull, BN):
        delta, dq = _dq_block(q, do, m2, r2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias,
                              Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn,
                              smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                              DELTA, WHI,
                              FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                              DIR, True, IEEE, FOLD, GRAD, BN)
    for start in range(wfull, full, BN):
        delta, dq = _dq_block(q, do, m2, r2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias,
                              Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn,
                              smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                              DELTA, WHI,
                              FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                              DIR, False, IEEE, FOLD, GRAD, BN)
    for start in range(full, hi, BN):
        delta, dq = _dq_block(q, do, m2, r2, delta, dq, start, qi, offs_d, offs_dv, K, V, Bias,
                              Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn,
                              smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                              DELTA, WHI,
                              FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                              DIR, True, IEEE, FOLD, GRAD, BN)
    return delta, dq


@triton.jit
def _bwd_dq(Q, K, V, DO, RMax, RSum, Delta, DQ, Bias, Mask,
            sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd,
            sdz, sdh, sdm, sdd, srz, srh, srm, ssz, ssh, ssm, sez, seh, sem,
            sgz, sgh, sgm, sgd, sbz, sbh, sbm, sbn, smz, smh, smm, smn,
            H, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
            DS_SCALE,
            HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
            CAUSAL: tl.constexpr, DIR: tl.constexpr, SKIP: tl.constexpr, IEEE: tl.constexpr,
            FOLD: tl.constexpr, GRAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            BD: tl.constexpr, BDV: tl.constexpr):
    """One program per (z·h, query block). GRAD=False: delta = rowsum(P ∘ dP), stored;
    GRAD=True: dQ from the stored delta. The grid's second axis walks the query blocks
    from the last: under a causal mask those see the most keys, so they start first."""
    zh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
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
    m, r = _row_stats(RMax, RSum, z * srz + h * srh, z * ssz + h * ssh, offs_m, srm, ssm,
                      rows, FOLD)
    m2 = m[:, None]
    r2 = r[:, None]
    qi = offs_m[:, None]
    kbase = z * skz + h * skh
    vbase = z * svz + h * svh
    bbase = z * sbz + h * sbh
    mbase = z * smz + h * smh
    lo, wfull, full, hi = key_range(pid_m, M, N, DELTA, WHI, Q_LEN, Q_DIV, CAUSAL, DIR, SKIP,
                                    BM, BN)
    dq = tl.zeros([BM, BD], tl.float32)
    if GRAD:
        delta = tl.load(Delta + z * sez + h * seh + offs_m * sem, mask=rows, other=0.0)
    else:
        delta = tl.zeros([BM], tl.float32)
    delta, dq = _dq_sweep(q, do, m2, r2, delta, dq, lo, wfull, full, hi, qi, offs_d, offs_dv, K, V,
                          Bias, Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm,
                          sbn, smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                          DELTA, WHI, FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP,
                          CAUSAL, DIR, IEEE, FOLD, GRAD, BN)
    if GRAD:
        tl.store(DQ + z * sgz + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
                 dq.to(DQ.dtype.element_ty), mask=rows[:, None] & (offs_d[None, :] < D))
    else:
        tl.store(Delta + z * sez + h * seh + offs_m * sem, delta, mask=rows)


@triton.jit
def _bwd_delta_o(DO, O, Delta, sdz, sdh, sdm, sdd, soz, soh, som, sod, sez, seh, sem, H, M, DV,
                 BR: tl.constexpr, BDV: tl.constexpr):
    """delta = rowsum(dO ∘ O) for BR rows of one (z, h): FlashAttention's preprocess, when
    the fusion reads the forward's output O (equal to rowsum(P ∘ dP) as O = P·V)."""
    zh = tl.program_id(0)
    z = zh // H
    h = zh % H
    offs_m = tl.program_id(1) * BR + tl.arange(0, BR)
    offs_dv = tl.arange(0, BDV)
    inside = (offs_m[:, None] < M) & (offs_dv[None, :] < DV)
    do = tl.load(DO + z * sdz + h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 mask=inside, other=0.0).to(tl.float32)
    o = tl.load(O + z * soz + h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
                mask=inside, other=0.0).to(tl.float32)
    tl.store(Delta + z * sez + h * seh + offs_m * sem, tl.sum(do * o, 1), mask=offs_m < M)


@triton.jit
def _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta, Bias, Mask,
                qbase, dobase, rbase, sbase, ebase, bbase, mbase, sqm, sqd, sdm,
                sdd, srm, ssm, sem, sbm, sbn, smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1,
                SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M, DS_SCALE,
                HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
                CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
                IEEE: tl.constexpr, FOLD: tl.constexpr, KEYS: tl.constexpr, BM: tl.constexpr):
    """One query block for a key block, transposed: tiles are [keys, rows] (P and dS are
    the matrix units' register operand of dV += Pᵀ·dO and dK += dSᵀ·Q as they are)."""
    offs_m = start + tl.arange(0, BM)
    rows = offs_m < M
    qt = tl.load(Q + qbase + offs_m[None, :] * sqm + offs_d[:, None] * sqd,
                 mask=rows[None, :] & (offs_d[:, None] < D), other=0.0).to(k.dtype)
    do = tl.load(DO + dobase + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 mask=rows[:, None] & (offs_dv[None, :] < DV), other=0.0).to(k.dtype)
    m, r = _row_stats(RMax, RSum, rbase, sbase, offs_m, srm, ssm, rows, FOLD)
    delta = tl.load(Delta + ebase + offs_m * sem, mask=rows, other=0.0)
    if IEEE:
        st = tl.dot(k, qt, input_precision="ieee")
        dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
    else:
        st = tl.dot(k, qt)
        dpt = tl.dot(v, tl.trans(do))
    pt, keep = _probs(st, offs_m[None, :], ki, m[None, :], r[None, :], Bias, Mask, bbase,
                      mbase, sbm, sbn, smm, smn, M, N, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                      DELTA, WHI,
                      FILL_C, FILL_M, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, EDGE, FOLD,
                      KEYS)
    dst = pt * (dpt - delta[None, :])
    if not FOLD:
        dst = tl.where(keep, dst, 0.0)
    dst = dst * DS_SCALE
    if IEEE:
        dv += tl.dot(pt.to(k.dtype), do, input_precision="ieee")
        dk += tl.dot(dst.to(k.dtype), tl.trans(qt), input_precision="ieee")
    else:
        dv += tl.dot(pt.to(k.dtype), do)
        dk += tl.dot(dst.to(k.dtype), tl.trans(qt))
    return dk, dv


@triton.jit
def _dkdv_rows(k, v, dk, dv, lo, full, wfull, whi, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
               Bias, Mask, qbase, dobase, rbase, sbase, ebase, bbase, mbase, sqm, sqd, sdm,
               sdd, srm, ssm, sem, sbm, sbn, smm, smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1,
               SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M, DS_SCALE,
               HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
               CAUSAL: tl.constexpr, DIR: tl.constexpr, IEEE: tl.constexpr,
               FOLD: tl.constexpr, KEYS: tl.constexpr, BM: tl.constexpr):
    """The query blocks of rows [lo, whi) for one key block: [lo, full) across the causal
    diagonal (masked), [full, wfull) wholly inside it, [wfull, whi) across a window's
    upper edge (masked; empty without a window)."""
    for start in range(wfull, whi, BM):
        dk, dv = _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
                             Bias, Mask, qbase, dobase, rbase, sbase, ebase, bbase, mbase, sqm,
                             sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm, smn,
                             M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI,
                             FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                             DIR, True, IEEE, FOLD, KEYS, BM)
    for start in range(lo, full, BM):
        dk, dv = _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
                             Bias, Mask, qbase, dobase, rbase, sbase, ebase, bbase, mbase, sqm,
                             sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm, smn,
                             M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C,
                             FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, True,
                             IEEE, FOLD, KEYS, BM)
    for start in range(full, wfull, BM):
        dk, dv = _dkdv_block(k, v, dk, dv, start, ki, offs_d, offs_dv, Q, DO, RMax, RSum, Delta,
                             Bias, Mask, qbase, dobase, rbase, sbase, ebase, bbase, mbase, sqm,
                             sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm, smn,
                             M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C,
                             FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL, DIR, False,
                             IEEE, FOLD, KEYS, BM)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, RMax, RSum, Delta, DK, DV_, Bias, Mask,
              sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd,
              sdz, sdh, sdm, sdd, srz, srh, srm, ssz, ssh, ssm, sez, seh, sem,
              skgz, skgh, skgn, skgd, svgz, svgh, svgn, svgd,
              sbz, sbh, sbm, sbn, smz, smh, smm, smn,
              H, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
              DS_SCALE,
              HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
              CAUSAL: tl.constexpr, DIR: tl.constexpr, SKIP: tl.constexpr, IEEE: tl.constexpr,
              FOLD: tl.constexpr, EVEN_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BD: tl.constexpr, BDV: tl.constexpr):
    """One program per (z·h, key block); the first key blocks see the most query rows
    under a causal mask and are started first."""
    zh = tl.program_id(0)
    pid_n = tl.program_id(1)
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
    if SKIP:       # keep iff q >= k + DELTA (GE) or q > k + DELTA (GT)
        # rows come in segments of SEG = Q_LEN * Q_DIV rows, q = (row // Q_DIV) % Q_LEN
        # within one (one segment when q is the outermost row dim; Q_LEN rows each when it
        # is the innermost, [g, q], the host making sure BM divides Q_LEN)
        first = pid_n * BN + DELTA
        last = pid_n * BN + BN - 1 + DELTA
        if DIR == 1:
            first += 1
            last += 1
        seg = Q_LEN * Q_DIV
        lo = tl.minimum(tl.maximum(first, 0) * Q_DIV, seg) // BM * BM
        full = tl.maximum(tl.minimum((tl.maximum(last, 0) * Q_DIV + BM - 1) // BM * BM, seg),
                          lo)
        # a window keeps q <= k + WHI: rows past the first key's bound cross its upper
        # edge, rows past the last key's see none of this block (WHI = NO_WINDOW: none;
        # positions are clamped to Q_LEN before scaling by Q_DIV, no overflow)
        wfull = tl.maximum(tl.minimum(tl.minimum(pid_n * BN + WHI + 1, Q_LEN) * Q_DIV // BM * BM,
                                      seg), full)
        whi = tl.maximum(tl.minimum((tl.minimum(pid_n * BN + BN + WHI, Q_LEN) * Q_DIV + BM - 1)
                                    // BM * BM, seg), wfull)
        for base in range(0, M, seg):
            dk, dv = _dkdv_rows(k, v, dk, dv, base + lo, base + full,
                                tl.minimum(base + wfull, M), tl.minimum(base + whi, M), ki, offs_d, offs_dv, Q, DO, RMax,
                                RSum, Delta, Bias, Mask, qbase, dobase, rbase, sbase, ebase,
                                bbase, mbase, sqm, sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm,
                                smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                                DELTA, WHI, FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP,
                                CAUSAL, DIR, IEEE, FOLD, not EVEN_N, BM)
    else:          # query blocks [full, M) see every key of this block: no causal mask
        full = M if CAUSAL else 0
        dk, dv = _dkdv_rows(k, v, dk, dv, 0, full, M, M, ki, offs_d, offs_dv, Q, DO, RMax,
                            RSum, Delta, Bias, Mask, qbase, dobase, rbase, sbase, ebase,
                            bbase, mbase, sqm, sqd, sdm, sdd, srm, ssm, sem, sbm, sbn, smm,
                            smn, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN,
                            DELTA, WHI, FILL_C, FILL_M, DS_SCALE, HAS_BIAS, HAS_MASK, MASK_KEEP,
                            CAUSAL, DIR, IEEE, FOLD, not EVEN_N, BM)
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
        self.perms = {n: gradient_order(d, g_sides[n], v, to) for n, d, v, to in
                      (("dq", b.dq, b.g_root, b.g_perm), ("dk", b.dk, b.g_root, b.g_perm),
                       ("dv", b.dv, b.div, None))}
        outs = list(comp.root.operands) if comp.root.opcode == "tuple" else [comp.root]
        names = {id(b.dq): "dq", id(b.dk): "dk", id(b.dv): "dv"}
        self.outputs = [names.get(id(o), "") for o in outs]
        if sorted(self.outputs) != ["dk", "dq", "dv"]:
            raise Unsupported("a flash-attention backward fusion outputs dQ, dK and dV only")


class Launches:
    """The three kernels of one backward call on [z, h, rows, d] tensors, each launched
    with its own (BM, BN, warps, stages): ``run_delta`` (rowsum(P ∘ dP) per row, into a
    scratch vector), ``run_dq`` (dQ, reading it), ``run_dkdv`` (dK and dV, reading it)."""

    def __init__(self, q, k, v, do, rmax, rsum, dq, dk, dv, bias, bstr: tuple, mask,
                 mstr: tuple, common: tuple, flags: dict, o=None, skip_for=None):
        import torch
        Z, H, M, _ = q.shape
        self.zh, self.m, self.n = Z * H, M, k.shape[2]
        self.delta = torch.empty((Z, H, M), dtype=torch.float32, device=q.device)
        self.dq, self.dk, self.dv = dq, dk, dv
        self.ins = (q, k, v, do, rmax, rsum, self.delta)
        self.strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *rmax.stride(),
                        *rsum.stride(), *self.delta.stride())
        self.score = (bias, mask)
        self.score_strides = (*bstr, *mstr)
        self.common = common
        self.flags = flags
        self.do, self.o = do, o
        # SKIP for a row block size (grouped rows [g, q] skip only when BM divides Q_LEN)
        self.skip_for = skip_for or (lambda bm: flags["SKIP"])

    def run_delta_o(self) -> Any:
        """delta from the forward's output O (``o`` given): one pass over dO and O."""
        assert self.o is not None
        dv = self.do.shape[3]
        br = max(16, min(128, 8192 // _pow2(dv)))
        return direct_launch.launch(
            _bwd_delta_o, (self.zh, triton.cdiv(self.m, br)),
            (self.do, self.o, self.delta, *self.do.stride(), *self.o.stride(),
             *self.delta.stride(), self.common[0], self.m, dv),
            dict(BR=br, BDV=_pow2(dv), num_warps=4))

    # each returns what the launch returned (Triton's compiled kernel: registers, spills)
    def run_delta(self, cfg: tuple) -> Any:
        return self._dq(cfg, False)

    def run_dq(self, cfg: tuple) -> Any:
        return self._dq(cfg, True)

    def _dq(self, cfg: tuple, grad: bool) -> Any:
        bm, bn, warps, stages = cfg
        return direct_launch.launch(
            _bwd_dq, (self.zh, triton.cdiv(self.m, bm)),
            (*self.ins, self.dq, *self.score, *self.strides, *self.dq.stride(),
             *self.score_strides, *self.common),
            dict(GRAD=grad, BM=bm, BN=bn, num_warps=warps, num_stages=stages,
                 **{**self.flags, "SKIP": self.skip_for(bm)}))

    def run_dkdv(self, cfg: tuple) -> Any:
        bm, bn, warps, stages = cfg
        return direct_launch.launch(
            _bwd_dkdv, (self.zh, triton.cdiv(self.n, bn)),
            (*self.ins, self.dk, self.dv, *self.score, *self.strides, *self.dk.stride(),
             *self.dv.stride(), *self.score_strides, *self.common),
            dict(EVEN_N=self.n % bn == 0, BM=bm, BN=bn, num_warps=warps, num_stages=stages,
                 **{**self.flags, "SKIP": self.skip_for(bm)}))


def _candidates(dtype_bytes: int, d: int) -> dict[str, list[tuple[int, int, int, int]]]:
    """Per kernel ("delta", "dq", "dkdv"), the (BM, BN, warps, stages) configs that fit an
    H100/H200 SM's shared memory and registers, the untuned default first: the fastest
    of benchmarks/attention_bwd_sweep.py on an H200 (benchmarks/NOTES.md, i14-bwd) for
    bf16 causal D128 and D64, then the runners-up (at D64 the 64×128 dK/dV tile spills
    70 registers and ties with 32×128 at 24). "delta" serves fusions that do not read
    the forward's output O. Each kernel is timed on its own."""
    if dtype_bytes >= 4:
        small = (32, 32, 4, 1) if d > 64 else (64, 32, 4, 2)
        return {"delta": [small], "dq": [small],
                "dkdv": [(32, 32, 4, 1) if d > 64 else (32, 64, 4, 2)]}
    if d <= 64:
        return {"delta": [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3)],
                "dq": [(64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 3)],
                "dkdv": [(32, 128, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4)]}
    if d <= 128:
        return {"delta": [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2)],
                "dq": [(128, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2)],
                "dkdv": [(64, 128, 8, 4), (64, 128, 8, 3), (32, 64, 4, 3)]}
    return {"delta": [(64, 32, 8, 1), (32, 32, 4, 1)], "dq": [(64, 32, 8, 1), (32, 32, 4, 1)],
            "dkdv": [(32, 64, 8, 1), (32, 32, 4, 1)]}


_CANDIDATES = _candidates      # tests swap in one variant


def plan_for(inst) -> BackwardPlan:
    return cached_plan(BackwardPlan, inst)


_USE_O = True       # tests turn it off to run the rowsum(P∘dP) delta kernel


def _fold(p: BackwardPlan) -> bool:
    """Whether every score the kernels see is q·k times a constant and every row keeps a
    key (no bias, no boolean mask, a causal mask that keeps the diagonal side): then P is
    exp2 of one multiply-subtract (``_probs`` FOLD)."""
    from passes.fusion.attention import keeps_diagonal
    return p.bias is None and p.mask is None and (p.causal is None or
                                                   keeps_diagonal(p.causal))


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
    # the forward's row statistics, scores' order without the keys -> [batch, rows]
    rmax = operands[p.m_stat].permute(p.canon[:-1]).reshape(Z, H, M)
    rsum = operands[p.l_stat].permute(p.canon[:-1]).reshape(Z, H, M)
    if out is None:
        out = tuple(torch.empty(tuple(s.dims), device=q.device, dtype=(q, k, v)[
            ("dq", "dk", "dv").index(n)].dtype) for s, n in zip(inst.shape.elements, p.outputs))
    by_name = dict(zip(p.outputs, out))
    shapes = {"dq": (Z, H, M, D), "dk": (Z, H, N, D), "dv": (Z, H, N, DV)}
    grads = {n: zh_out(by_name[n].permute(p.perms[n]), shapes[n], nb) for n in shapes}
    dq, dk, dv = (grads[n][0] for n in ("dq", "dk", "dv"))
    bias, bstr, mask, mstr, keep, fill_m = p.score_args(operands)
    dlt, whi, fill_c, causal = p.causal_args()
    common = (H, M, N, D, DV, p.q_len, p.q_div, p.scale1, p.scale2, p.sign, dlt, whi, fill_c,
              fill_m,
              p.ds_scale)
    flags = dict(HAS_BIAS=p.bias is not None, HAS_MASK=p.mask is not None, MASK_KEEP=keep,
                 IEEE=q.element_size() >= 4, FOLD=_fold(p), BD=_pow2(D), BDV=_pow2(DV),
                 **causal)
    o = None
    o_perm = forward_output_perm(inst)
    if o_perm is not None and _USE_O:
        o = _zh(operands[-1].permute(o_perm), nb)
        if tuple(o.shape) != (Z, H, M, DV):
            raise Unsupported(f"the forward's output O is {tuple(o.shape)} as [z, h, rows, "
                              f"dv], dO {(Z, H, M, DV)}")
    run = Launches(q, k, v, do, rmax, rsum, dq, dk, dv, bias, bstr, mask, mstr, common, flags,
                   o, skip_for=p.skip_for)
    cands = _CANDIDATES(q.element_size(), max(D, DV))
    key = (str(q.device), q.dtype, D, DV, Z * H, M, N, p.causal is not None,
           p.bias is not None, p.mask is not None, "backward") + \
        ((whi,) if whi != NO_WINDOW else ())
    # delta first (the other two read it); each kernel's candidates are timed on their own
    if o is not None:
        run.run_delta_o()
    else:
        run.run_delta(_pick(key + ("delta",), cands["delta"], run.run_delta, q))
    for name, launch in (("dq", run.run_dq), ("dkdv", run.run_dkdv)):
        launch(_pick(key + (name,), cands[name], launch, q))
    for t, dst in grads.values():
        if dst is not None:
            dst.copy_(t.reshape(dst.shape))
    return out
