"""The CUDA kernel of a flash-attention fusion: one Triton program per query block.

``flash_attention(inst, operands, out=None)`` launches it for a ``__flash_attention``
fusion whose operands are torch tensors (arena views). The fusion body is matched again
(``passes.fusion.attention``); q, k, v, bias and mask are read in place through their
strides after a permute into ``[z, h, rows, d]`` (a copy only where a layout cannot be
viewed that way, e.g. grouped query heads). The kernel streams key blocks: s = q·kᵀ in
f32, the score steps (scale, bias, causal/boolean masks), an online softmax in log2 units
(exp2, log2(e) folded into the last scale; running max and sum, a row with nothing kept
yet shifts by 0), acc += p·v; with a causal mask that keeps k <= q + c (c <= 0) it stops
at the block row's last visible key, and the longest query blocks are launched first.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import triton
import triton.language as tl

from . import direct_launch

_DIRS = {"GE": 0, "GT": 1, "LE": 2, "LT": 3, "EQ": 4, "NE": 5}


LOG2E = 1.4426950408889634   # exp(x) = exp2(x * log2(e)): the kernel's scores are in log2 units
_F32_MAX = 3.4028234663852886e38


@triton.jit
def causal_keep(qq, kq, DIR: tl.constexpr):
    """q DIR k for the compare directions of ``_DIRS`` (the causal mask's keep test)."""
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
def band_keep(qq, kk, DELTA, WHI, DIR: tl.constexpr):
    """The causal test q DIR k + DELTA and a window's other bound q - k <= WHI (NO_WINDOW,
    2^30, when the mask has none: always true)."""
    return causal_keep(qq, kk + DELTA, DIR) & (qq - kk <= WHI)


@triton.jit
def _attend(q, m_i, l_i, acc, start, offs_m, qpos, offs_d, offs_dv, K, V, Bias, Mask,
            kbase, vbase, bbase, mbase, skn, skd, svn, svd, sbm, sbn, smm, smn,
            M, N, D, DV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
            HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
            CAUSAL: tl.constexpr, DIR: tl.constexpr, EDGE: tl.constexpr,
            IEEE: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
            POS_SCALE: tl.constexpr, BN: tl.constexpr):
    """One key block of the online softmax, scores in log2 units (the host folds log2(e)
    into SCALE1 without a bias, into SCALE2 with one, and into the fill values).
    EDGE=False: a block wholly inside the causal region and the key range (no masks
    computed; most blocks of a long causal row). EVEN_N: N is a multiple of BN (no key
    bound in edge blocks); EVEN_D: D and DV are their blocks (no head-dim bound);
    POS_SCALE: SCALE1 >= 0 (the max of the scaled scores is the scaled max)."""
    offs_n = start + tl.arange(0, BN)
    kp = K + kbase + offs_n[None, :] * skn + offs_d[:, None] * skd
    vp = V + vbase + offs_n[:, None] * svn + offs_dv[None, :] * svd
    n_bound = EDGE and not EVEN_N
    if n_bound and EVEN_D:
        k = tl.load(kp, mask=offs_n[None, :] < N, other=0.0)
    elif n_bound:
        k = tl.load(kp, mask=(offs_n[None, :] < N) & (offs_d[:, None] < D), other=0.0)
    elif EVEN_D:
        k = tl.load(kp)
    else:
        k = tl.load(kp, mask=offs_d[:, None] < D, other=0.0)
    if IEEE:
        s = tl.dot(q, k.to(q.dtype), input_precision="ieee")
    else:
        s = tl.dot(q, k.to(q.dtype))
    plain = POS_SCALE and not EDGE and not HAS_BIAS and not HAS_MASK
    if plain:
        # the common block: one multiply-add per score (scale, minus the row max) and no
        # -inf guard (every score is finite)
        m_new = tl.maximum(m_i, tl.max(s, 1) * SCALE1)
        p = tl.math.exp2(s * SCALE1 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    else:
        s = s * SCALE1
        if HAS_BIAS:
            b = tl.load(Bias + bbase + offs_m[:, None] * sbm + offs_n[None, :] * sbn,
                        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0)
            s = (s + BIAS_SIGN * b.to(tl.float32)) * SCALE2
        if CAUSAL and EDGE:
            s = tl.where(band_keep(qpos[:, None], offs_n[None, :], DELTA, WHI, DIR), s,
                         FILL_C)
        if HAS_MASK:
            mk = tl.load(Mask + mbase + offs_m[:, None] * smm + offs_n[None, :] * smn,
                         mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0)
            s = tl.where((mk != 0) == MASK_KEEP, s, FILL_M)
        if n_bound:
            s = tl.where(offs_n[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with nothing kept yet (all -inf so far) shifts by 0: exp2(-inf) = 0, no NaN
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if n_bound and EVEN_D:
        v = tl.load(vp, mask=offs_n[:, None] < N, other=0.0)
    elif n_bound:
        v = tl.load(vp, mask=(offs_n[:, None] < N) & (offs_dv[None, :] < DV), other=0.0)
    elif EVEN_D:
        v = tl.load(vp)
    else:
        v = tl.load(vp, mask=offs_dv[None, :] < DV, other=0.0)
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def key_range(pid_m, M, N, DELTA, WHI, Q_LEN, Q_DIV, CAUSAL: tl.constexpr,
              DIR: tl.constexpr, SKIP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """(lo, wfull, full, hi) for query block ``pid_m``: keys below ``lo`` and from ``hi``
    on are masked for every row (skipped); blocks [lo, wfull) cross a window's lower edge
    (masked), [wfull, full) need neither the causal, window nor the length mask,
    [full, hi) cross the diagonal (masked). Without a window (WHI = NO_WINDOW) lo = wfull
    = 0. Row r has query position (r // Q_DIV) % Q_LEN; SKIP holds only where that is
    monotonic within a block (ScorePlan.skip_for: jax.nn's grouped rows [q, g] with
    Q_DIV = g, or a grouped einsum's [g, q] with BM dividing Q_LEN)."""
    hi = N
    full = 0
    lo = 0
    wfull = 0
    if SKIP:
        # keep k iff q >= k + DELTA (GE) or q > k + DELTA (GT)
        last_q = (tl.minimum(pid_m * BM + BM, M) - 1) // Q_DIV % Q_LEN
        first_q = pid_m * BM // Q_DIV % Q_LEN
        if DIR == 0:
            hi = tl.minimum(N, last_q - DELTA + 1)
            full = first_q - DELTA + 1
        else:
            hi = tl.minimum(N, last_q - DELTA)
            full = first_q - DELTA
        full = tl.minimum(tl.maximum(full, 0), hi) // BN * BN
        # the window keeps k >= q - WHI: keys below the first row's bound are dropped for
        # the whole block, keys from the last row's bound on are kept by every row
        lo = tl.minimum(tl.maximum(first_q - WHI, 0), hi) // BN * BN
        full = tl.maximum(full, lo)
        wfull = (tl.maximum(last_q - WHI, 0) + BN - 1) // BN * BN
        wfull = tl.minimum(tl.maximum(wfull, lo), full)
    elif not CAUSAL:
        full = N // BN * BN
    return lo, wfull, full, hi


@triton.jit
def _flash_fwd(Q, K, V, O, Bias, Mask,
               sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd,
               soz, soh, som, sod, sbz, sbh, sbm, sbn, smz, smh, smm, smn,
               H, M, N, D, DV, Q_LEN, Q_DIV, SCALE1, SCALE2, BIAS_SIGN, DELTA, WHI, FILL_C, FILL_M,
               RowMax, RowSum, srz, srh, srm, ssz, ssh, ssm, sqg, sog, QG, OG,
               HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, MASK_KEEP: tl.constexpr,
               CAUSAL: tl.constexpr, DIR: tl.constexpr, SKIP: tl.constexpr,
               IEEE: tl.constexpr, STATS: tl.constexpr, EVEN_N: tl.constexpr,
               EVEN_D: tl.constexpr, POS_SCALE: tl.constexpr, HEAVY_FIRST: tl.constexpr,
               BM: tl.constexpr,
               BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               KG: tl.constexpr, VG: tl.constexpr):
    if HEAVY_FIRST:
        # grid (z*h, query blocks), last query block first: with a causal skip the longest
        # rows start in the first wave and the short ones fill the tail (load balance)
        zh = tl.program_id(0)
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid_m = tl.program_id(0)
        zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    # rows in two runs (grouped query heads, rows [t, g] of q [b, t, kv, g, d]): row r is
    # at (r // QG) * sqm + (r % QG) * sqg, read in place instead of a copy (QG = 1: one run)
    q_rows = (offs_m // QG) * sqm + (offs_m % QG) * sqg
    qp = Q + z * sqz + h * sqh + q_rows[:, None] + offs_d[None, :] * sqd
    if EVEN_D:
        q = tl.load(qp, mask=offs_m[:, None] < M, other=0.0)
    else:
        q = tl.load(qp, mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    qpos = (offs_m // Q_DIV) % Q_LEN     # rows [.., q, g..]: q counts every Q_DIV rows
    # K/V heads shared by KG / VG query heads (heads repeated with jnp.repeat, read in place)
    kbase = z * skz + (h // KG) * skh
    vbase = z * svz + (h // VG) * svh
    bbase = z * sbz + h * sbh
    mbase = z * smz + h * smh
    lo, wfull, full, hi = key_range(pid_m, M, N, DELTA, WHI, Q_LEN, Q_DIV, CAUSAL, DIR, SKIP,
                                    BM, BN)
    for start in range(lo, wfull, BN):      # across the window's lower edge
        m_i, l_i, acc = _attend(q, m_i, l_i, acc, start, offs_m, qpos, offs_d, offs_dv, K, V,
                                Bias, Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd,
                                sbm, sbn, smm, smn, M, N, D, DV, SCALE1, SCALE2, BIAS_SIGN,
                                DELTA, WHI, FILL_C, FILL_M, HAS_BIAS, HAS_MASK, MASK_KEEP,
                                CAUSAL, DIR, True, IEEE, EVEN_N, EVEN_D, POS_SCALE, BN)
    for start in range(wfull, full, BN):
        m_i, l_i, acc = _attend(q, m_i, l_i, acc, start, offs_m, qpos, offs_d, offs_dv, K, V,
                                Bias, Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd,
                                sbm, sbn, smm, smn, M, N, D, DV, SCALE1, SCALE2, BIAS_SIGN,
                                DELTA, WHI, FILL_C, FILL_M, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                                DIR, False, IEEE, EVEN_N, EVEN_D, POS_SCALE, BN)
    for start in range(full, hi, BN):
        m_i, l_i, acc = _attend(q, m_i, l_i, acc, start, offs_m, qpos, offs_d, offs_dv, K, V,
                                Bias, Mask, kbase, vbase, bbase, mbase, skn, skd, svn, svd,
                                sbm, sbn, smm, smn, M, N, D, DV, SCALE1, SCALE2, BIAS_SIGN,
                                DELTA, WHI, FILL_C, FILL_M, HAS_BIAS, HAS_MASK, MASK_KEEP, CAUSAL,
                                DIR, True, IEEE, EVEN_N, EVEN_D, POS_SCALE, BN)
    o = acc / l_i[:, None]
    o_rows = (offs_m // OG) * som + (offs_m % OG) * sog
    op = O + z * soz + h * soh + o_rows[:, None] + offs_dv[None, :] * sod
    if EVEN_D:
        tl.store(op, o.to(O.dtype.element_ty), mask=offs_m[:, None] < M)
    else:
        tl.store(op, o.to(O.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_dv[None, :] < DV))
    if STATS:   # the softmax's row max (back in natural units) and row sum, for the backward
        tl.store(RowMax + z * srz + h * srh + offs_m * srm,
                 (m_i * 0.6931471805599453).to(RowMax.dtype.element_ty), mask=offs_m < M)
        tl.store(RowSum + z * ssz + h * ssh + offs_m * ssm,
                 l_i.to(RowSum.dtype.element_ty), mask=offs_m < M)


NO_WINDOW = 1 << 30     # WHI without a window: q - k <= 2^30 holds for every position pair


def merge_bands(steps: list) -> Any:
    """One causal step keeping what every step of ``steps`` keeps
    (``passes.fusion.attention.merged_band``), or Unsupported."""
    from passes.fusion.attention import merged_band
    band = merged_band(steps)
    if band is None:
        raise Unsupported("two causal compares that are not one band of q - k")
    return band


class Unsupported(Exception):
    """A matched attention this kernel does not run (the reason); the host runs it."""


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _zh(t: Any, nb: int) -> Any:
    """[batch..., rows..., x] -> [z, h, rows, x] (a view where strides allow)."""
    shape = list(t.shape)
    batch, rest = shape[:nb], shape[nb:]
    z = math.prod(batch[:-1]) if nb >= 2 else 1
    h = batch[-1] if nb >= 1 else 1
    return t.reshape(z, h, math.prod(rest[:-1]), rest[-1])


class ScorePlan:
    """How the kernels read q and k and apply the score function of a matched q·k (shared
    by the forward and the backward): q/k permutations into [batch..., rows..., d] /
    [batch..., keys, d], the scales, bias, causal and boolean masks."""

    def __init__(self, comp, qk, k_is_lhs: bool, logits, steps: list, nb: int):
        from passes.fusion.attention import canonical, keeps_diagonal, score_dims
        self.params = {id(p): p.attrs.get("parameter_number", k)
                       for k, p in enumerate(comp.parameters)}
        self.q, self.k = self.param(qk.operands[1 if k_is_lhs else 0]), \
            self.param(qk.operands[0 if k_is_lhs else 1])
        self.nb = nb
        a = qk.attrs
        rank = logits.shape.rank
        where = score_dims(logits, qk)           # score dim -> qk dim
        lb, lc = list(a["lhs_batch_dims"]), list(a["lhs_contracting_dims"])
        rb, rc = list(a["rhs_batch_dims"]), list(a["rhs_contracting_dims"])
        lf = [d for d in range(qk.operands[0].shape.rank) if d not in lb + lc]
        rf = [d for d in range(qk.operands[1].shape.rank) if d not in rb + rc]
        # qk dim -> (side, operand dim)
        src = [(0, lb[i]) for i in range(nb)] + [(0, d) for d in lf] + [(1, d) for d in rf]
        qside = 1 if k_is_lhs else 0
        qb, qc = (rb, rc) if k_is_lhs else (lb, lc)
        kb, kc = (lb, lc) if k_is_lhs else (rb, rc)
        # the scores in the kernels' order [batch..., rows..., keys] (score dims; grouped
        # heads written group-major interleave batch and row dims)
        self.canon = canonical(logits, qk)
        row_dims = self.canon[nb:rank - 1]
        rows = [src[where[d]][1] for d in row_dims]
        assert all(src[where[d]][0] == qside for d in row_dims)
        self.q_perm = qb + rows + qc
        self.k_perm = kb + [src[where[rank - 1]][1]] + kc
        self.score_shape = tuple(logits.shape.dims)
        self.q_len, self.q_div = self.score_shape[row_dims[-1]], 1
        self.multi_rows = rank - nb - 1 > 1
        self.scale1, self.scale2, self.bias, self.sign = 1.0, 1.0, None, 1.0
        self.causal = self.mask = None
        causals = []
        fills = []
        for s in steps:
            if s.kind == "scale":
                if self.causal is not None or self.mask is not None:
                    raise Unsupported("a scale after a mask")
                if self.bias is None:
                    self.scale1 *= s.value
                else:
                    self.scale2 *= s.value
            elif s.kind == "bias":
                if self.bias is not None or self.causal is not None or self.mask is not None:
                    raise Unsupported("two biases, or a bias after a mask")
                self.bias, self.sign = (self.param(s.tensor), s.where), s.value
            elif s.kind == "causal":
                causals.append(s)
                fills.append(s.fill)
            elif s.kind == "mask":
                if self.mask is not None:
                    raise Unsupported("two boolean masks")
                self.mask = (self.param(s.tensor), s.where, s.keep_if_true, s.fill)
                fills.append(s.fill)
        if len(set(fills)) > 1:
            raise Unsupported("a causal and a boolean mask with different fill values")
        # two selects with position compares (jnp.where(tril) then jnp.where(q - k < w)):
        # the kernels apply one band, their intersection
        self.causal = c = merge_bands(causals) if causals else None
        q_dim = row_dims[-1] if c is None or c.q_dim < 0 else c.q_dim
        if c is not None:
            if q_dim not in row_dims:
                raise Unsupported("a causal compare on a batch dim")
            at = row_dims.index(q_dim)
            self.q_len = self.score_shape[q_dim]
            self.q_div = math.prod(self.score_shape[d] for d in row_dims[at + 1:])
        # causal block skipping needs the query position monotonic in each row block: one
        # row dim, or the position the outermost row dim (rows [q, g], q = row // Q_DIV),
        # or the innermost ([g, q], q = row % Q_LEN) with blocks that divide Q_LEN
        # (skip_for); and a mask that keeps the diagonal side (k <= q + c, c <= 0)
        keeps = keeps_diagonal(c)
        # a band's other bound, q - k <= whi (the kernels' WHI; NO_WINDOW: none)
        self.whi = c.window if c is not None and c.window is not None else NO_WINDOW
        self.skip = keeps and (not self.multi_rows or q_dim == row_dims[0])
        self.skip_inner = keeps and self.multi_rows and q_dim == row_dims[-1]

    def skip_for(self, bm: int) -> bool:
        """Whether kernels with row blocks of ``bm`` skip the causal blocks."""
        return self.skip or (self.skip_inner and self.q_len % bm == 0)

    # Whether q, k and v may be slices (and row-major reshapes of them) of an operand taken
    # into the fusion (passes/fusion/attention_pass.py ``operand_slices``): the forward
    # reads them in place (``with_views``); the backward takes its operands as they are.
    views_ok = False

    def group(self, index: int) -> int:
        """How many heads of the kernel share each head of operand ``index`` (1: none)."""
        return getattr(self, "groups", {}).get(index, 1)

    def param(self, inst) -> int:
        """The index of ``inst`` among the kernel's operands: a fusion parameter, or (where
        ``views_ok``) a view of one appended after them by ``with_views``. A K or V whose
        heads repeat a parameter's (``head_repeat``) is that parameter, its group in
        ``groups``: the kernel reads head h // group."""
        if id(inst) in self.params:
            return self.params[id(inst)]
        if self.views_ok:
            from passes.fusion.attention_pass import head_repeat
            rep = head_repeat(inst)
            src = inst.operands[0].operands[0] if rep is not None else None
            if src is not None and id(src) in self.params:
                index = self.params[id(src)]
                self.__dict__.setdefault("groups", {})[index] = rep[1]
                return index
        chain, cur = [], inst
        while self.views_ok and cur.opcode in ("slice", "bitcast", "reshape"):
            chain.append(cur)
            cur = cur.operands[0]
        if not chain or id(cur) not in self.params:
            raise Unsupported(f"%{inst.name} ({inst.opcode}) is computed inside the fusion; "
                              "the kernel reads q, k, v, bias and mask as operands")
        views = self.__dict__.setdefault("views", [])
        views.append((self.params[id(cur)], chain[::-1]))
        return len(self.params) + len(views) - 1

    def with_views(self, operands: list) -> list:
        """``operands`` and after them the views ``param`` handed out indices for."""
        views = getattr(self, "views", ())
        return list(operands) + [operand_view(operands[k], chain) for k, chain in views]

    def score_args(self, operands: list) -> tuple[Any, tuple, Any, tuple, bool, float]:
        """(bias, its [z,h,m,n] strides, mask, its strides, keep-if-true, mask fill) as
        the kernels take them (q stands in for an absent tensor)."""
        import torch
        bias = mask = operands[self.q]
        bstr = mstr = (0, 0, 0, 0)
        if self.bias is not None:
            bias = _zh(_scores_view(operands[self.bias[0]], self.bias[1], self.score_shape)
                       .permute(self.canon), self.nb)
            bstr = bias.stride()
        keep, fill_m = True, 0.0
        if self.mask is not None:
            t = operands[self.mask[0]]
            if t.dtype == torch.bool:
                t = t.view(torch.uint8)
            mask = _zh(_scores_view(t, self.mask[1], self.score_shape).permute(self.canon),
                       self.nb)
            mstr = mask.stride()
            keep, fill_m = self.mask[2], self.mask[3]
        return bias, bstr, mask, mstr, keep, fill_m

    def causal_args(self) -> tuple:
        """(DELTA, WHI, FILL_C) and the constexprs CAUSAL, DIR, SKIP."""
        c = self.causal
        return (c.delta if c else 0, self.whi, c.fill if c else 0.0,
                dict(CAUSAL=c is not None, DIR=_DIRS[c.direction] if c else 0, SKIP=self.skip))


class Plan(ScorePlan):
    """Everything the forward launch needs that depends only on the fusion body. A body
    whose root is a tuple also outputs the softmax's row max and row sum (for a fused
    backward): ``outputs`` names each tuple element "o", "max" or "sum"."""

    views_ok = True

    def __init__(self, comp):
        from passes.fusion.attention import NoMatch, attention_root, match_attention, row_stats
        outs = list(comp.root.operands) if comp.root.opcode == "tuple" else [comp.root]
        o_root = next((o for o in outs if attention_root(o)[0].opcode == "dot"), comp.root)
        pv, where = attention_root(o_root)
        # pv dim j is the output's dim out_perm[j]: the kernel stores through those strides
        self.out_perm = [where.index(j) for j in range(len(where))]
        try:
            m = match_attention(pv, stats_out=len(outs) > 1)
        except NoMatch as e:
            raise Unsupported(str(e)) from None
        if m is None:
            raise Unsupported("the root is not softmax·v")
        self.m = m
        super().__init__(comp, m.qk, m.k_is_lhs, m.logits, m.steps, m.n_batch)
        stats = dict(zip((id(i) for i in row_stats(m)), ("max", "sum")))
        self.outputs = ["o" if o is o_root else stats.get(id(o), "") for o in outs]
        if "" in self.outputs or self.outputs.count("o") != 1:
            raise Unsupported("a flash-attention fusion outputs its result, row max and "
                              "row sum only")
        self.tuple_out = comp.root.opcode == "tuple"
        self.v = self.param(m.v)
        nb = self.nb
        b = m.pv.attrs
        vs = "rhs" if m.p_is_lhs else "lhs"
        vb, vc = list(b[f"{vs}_batch_dims"]), list(b[f"{vs}_contracting_dims"])
        vf = [d for d in range(m.v.shape.rank) if d not in vb + vc]
        self.v_perm = vb + vc + vf
        out_rank = m.pv.shape.rank
        # pv output: [batch, rows..., dv] (p lhs) or [batch, dv, rows...] (v lhs)
        self.o_perm = list(range(out_rank)) if m.p_is_lhs else \
            list(range(nb)) + list(range(nb + 1, out_rank)) + [nb]


def operand_view(t: Any, chain: list) -> Any:
    """``t`` (a fusion operand) seen through ``chain``, slices and row-major reshapes from
    the operand outwards: a view on the same storage where strides allow (a column slice of
    a merged q|k|v projection split into heads), else a copy."""
    for inst in chain:
        if inst.opcode == "slice":
            t = t[tuple(slice(d.start, d.limit, d.stride) for d in inst.attrs["slice"].dims)]
        else:
            t = t.reshape(tuple(inst.shape.dims))
    return t


def _scores_view(t: Any, where: tuple, shape: tuple) -> Any:
    """A bias/mask tensor seen with the scores' shape (stride 0 where it broadcasts)."""
    import torch
    strides = [t.stride(w) if w is not None else 0 for w in where]
    return torch.as_strided(t, shape, strides, t.storage_offset())


def _candidates(dtype_bytes: int, d: int) -> list[tuple[int, int, int, int]]:
    """(BM, BN, warps, stages) configs that fit one H100/H200 SM's shared memory, the
    untuned default first."""
    if dtype_bytes >= 4:
        return [(64, 32, 4, 2)] if d <= 128 else [(32, 32, 4, 1)]
    # bf16/f16: the fastest four of benchmarks/flash_sweep.py on the H200 (NOTES, i14-flash:
    # within ~5% of each other on the causal cases; 128x128 leads without a mask)
    if d <= 64:
        return [(64, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 3)]
    if d <= 128:
        return [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 4)]
    return [(64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2)]


# (device, dtype, D, DV, Z*H, M, N, masks) -> the fastest config measured for it
_TUNED: dict[tuple, tuple[int, int, int, int]] = {}


def _autotune_enabled(t: Any) -> bool:
    import os

    import torch
    if os.environ.get("HLOTK_FLASH_AUTOTUNE", "1") in ("0", "false", "no", "off"):
        return False
    return t.is_cuda and not torch.cuda.is_current_stream_capturing()


def _source_key() -> str:
    """A hash of this file and the backward's (their kernels and candidate lists): a stored
    choice is for these kernels only."""
    global _SOURCE_KEY
    if _SOURCE_KEY is None:
        import hashlib
        from pathlib import Path
        h = hashlib.sha256()
        here = Path(__file__)
        for name in ("attention.py", "attention_backward.py"):
            p = here.with_name(name)
            h.update(p.read_bytes() if p.exists() else b"-")
        _SOURCE_KEY = h.hexdigest()[:20]
    return _SOURCE_KEY


_SOURCE_KEY: Optional[str] = None


def _disk_key(key: tuple) -> str:
    from .autotune import tuning_key
    return tuning_key(f"flash|{_source_key()}|{key!r}")


def _as_config(v: Any) -> Any:
    return tuple(_as_config(x) for x in v) if isinstance(v, list) else v


def _stored(key: tuple, candidates: list) -> Optional[tuple]:
    """The choice measured by an earlier process for this shape, device, Triton version and
    kernel source (``$HLOTK_CACHE_DIR/triton/tuning.json``, autotune.py's table), if it is
    still one of the candidates."""
    from .autotune import load_table
    entry = load_table().get(_disk_key(key))
    if not isinstance(entry, dict):
        return None
    try:
        cfg = _as_config(entry["config"])
    except (KeyError, TypeError):
        return None
    return cfg if cfg in candidates else None


def _store(key: tuple, best: tuple, times: dict) -> None:
    from .autotune import load_table, tuning_path, _write_json_atomic
    table = dict(load_table())
    table[_disk_key(key)] = {"config": best, "kernel": "flash",
                             "measured_us": {repr(c): ms * 1e3 for c, ms in times.items()}}
    try:
        _write_json_atomic(tuning_path(), table)
    except OSError:
        pass


def _pick(key: tuple, candidates: list, launch, probe: Any) -> tuple[int, int, int, int]:
    """The config for ``key``: measured once per shape on the GPU (each candidate timed with
    triton.testing.do_bench) and remembered on disk, the default elsewhere (interpreter,
    graph capture, HLOTK_FLASH_AUTOTUNE=0). Inside ``parallel.collecting()`` (the first
    call's compile step) each candidate that would be timed is launched into the collector,
    so that they compile in the pool; nothing runs."""
    from .parallel import collecting_now
    hit = _TUNED.get(key)
    if hit is not None:
        return hit
    tune = len(candidates) > 1 and _autotune_enabled(probe)
    if tune:
        hit = _stored(key, candidates)
        if hit is not None:
            _TUNED[key] = hit
            return hit
    if not tune:
        return candidates[0]
    if collecting_now():
        for cfg in candidates[1:]:
            launch(cfg)
        return candidates[0]
    from triton.testing import do_bench
    times = {}
    for cfg in candidates:
        try:
            times[cfg] = do_bench(lambda: launch(cfg), warmup=5, rep=20)
        except Exception:           # out of shared memory / registers for this shape
            continue
    best = min(times, key=times.get) if times else candidates[0]
    _TUNED[key] = best
    if times:
        _store(key, best, times)
    return best


_PLANS: dict[tuple[type, int], tuple[Any, Any]] = {}


def cached_plan(cls: type, inst) -> Any:
    """``cls(body)`` for the fusion ``inst``, built once per instruction and body."""
    comp = inst.attrs["calls"]
    hit = _PLANS.get((cls, id(inst)))
    if hit is not None and hit[0] is comp:
        return hit[1]
    p = cls(comp)
    _PLANS[(cls, id(inst))] = (comp, p)
    return p


def plan_for(inst) -> Plan:
    return cached_plan(Plan, inst)


def _log2_units(x: float) -> float:
    """A score value (a fill) in the kernel's log2 units; a finite fill stays finite (f32
    max at most), so a row whose scores are all that fill still averages its values."""
    y = x * LOG2E
    return y if math.isinf(x) or math.isnan(x) else max(-_F32_MAX, min(_F32_MAX, y))


class FwdLaunch:
    """The forward launch for one call of a flash-attention fusion: the [z, h, rows, d]
    views of q, k, v and the outputs, the score arguments in log2 units. ``launch(cfg)``
    runs the kernel with a (BM, BN, warps, stages) config; ``finish()`` copies scratch
    outputs back into the fusion's result buffers where they could not be written in place.
    Keyword ``flags`` override the kernel's constexpr choices (the sweep script's variants)."""

    def __init__(self, inst, operands: list, out: Optional[Any] = None):
        import torch
        p = self.plan = plan_for(inst)
        operands = p.with_views(operands)
        nb = p.nb
        q, q_str, q_run = zh_runs(operands[p.q].permute(p.q_perm), nb)
        k = _zh(operands[p.k].permute(p.k_perm), nb)
        v = _zh(operands[p.v].permute(p.v_perm), nb)
        kg, vg = p.group(p.k), p.group(p.v)
        if k.shape[1] * kg != q.shape[1] or k.shape[0] != q.shape[0] or \
                v.shape[1] * vg != q.shape[1]:
            raise Unsupported("q and k batch/head counts differ")
        Z, H, M, D = q.shape
        N, DV = k.shape[2], v.shape[3]
        shapes = inst.shape.elements if p.tuple_out else [inst.shape]
        if out is None:
            out = tuple(torch.empty(tuple(s.dims), device=v.device,
                                    dtype=v.dtype if kind == "o" else torch.float32)
                        for s, kind in zip(shapes, p.outputs))
            out = out if p.tuple_out else out[0]
        self.out = out
        outs = list(out) if p.tuple_out else [out]
        by_kind = dict(zip(p.outputs, outs))
        o_view = by_kind["o"].permute(p.out_perm).permute(p.o_perm)
        o, copy_o, o_str, o_run = zh_out_runs(o_view, (Z, H, M, DV), nb)
        # the row statistics are in the scores' order without the keys: as [batch, rows]
        stats = [zh_out(by_kind[s].permute(p.canon[:-1]), (Z, H, M), nb) if s in by_kind
                 else (q, None) for s in ("max", "sum")]
        self.copies = [(o, copy_o)] + stats
        bias, bstr, mask, mstr, keep, fill_m = p.score_args(operands)
        delta, whi, fill_c, causal = p.causal_args()
        rmax, rsum = stats[0][0], stats[1][0]
        rstr = (rmax.stride() if p.tuple_out else (0, 0, 0))
        sstr = (rsum.stride() if p.tuple_out else (0, 0, 0))
        # log2(e) rides on the last multiply before the softmax: one scale without a bias
        if p.bias is None:
            scale1, scale2 = p.scale1 * p.scale2 * LOG2E, 1.0
        else:
            scale1, scale2 = p.scale1, p.scale2 * LOG2E
        self.args = (q, k, v, o, bias, mask, *q_str, *k.stride(), *v.stride(),
                     *o_str, *bstr, *mstr, H, M, N, D, DV, p.q_len, p.q_div, scale1, scale2,
                     p.sign, delta, whi, _log2_units(fill_c), _log2_units(fill_m), rmax, rsum,
                     *rstr, *sstr, q_run[0], o_run[0], q_run[1], o_run[1])
        self.flags = dict(HAS_BIAS=p.bias is not None, HAS_MASK=p.mask is not None,
                          MASK_KEEP=keep, IEEE=q.element_size() >= 4, STATS=p.tuple_out,
                          EVEN_D=_pow2(D) == D and _pow2(DV) == DV,
                          POS_SCALE=scale1 >= 0, HEAVY_FIRST=causal["SKIP"],
                          BD=_pow2(D), BDV=_pow2(DV), KG=kg, VG=vg, **causal)
        self.shape = (Z, H, M, N, D, DV)
        self.key = (str(q.device), q.dtype, D, DV, Z * H, M, N, p.causal is not None,
                    p.bias is not None, p.mask is not None, p.tuple_out) + \
            ((kg, vg) if (kg, vg) != (1, 1) else ()) + \
            ((whi,) if whi != NO_WINDOW else ())
        self.candidates = _candidates(q.element_size(), D)
        self.q = q

    def launch(self, cfg: tuple[int, int, int, int], **flags: Any) -> None:
        bm, bn, warps, stages = cfg
        Z, H, M, N = self.shape[:4]
        skip = self.plan.skip_for(bm)
        f = {**self.flags, "SKIP": skip, "HEAVY_FIRST": skip, **flags}
        grid = (Z * H, triton.cdiv(M, bm)) if f["HEAVY_FIRST"] else \
            (triton.cdiv(M, bm), Z * H)
        direct_launch.launch(_flash_fwd, grid, self.args,
                             dict(EVEN_N=N % bn == 0, BM=bm, BN=bn, num_warps=warps,
                                  num_stages=stages, **f))

    def finish(self) -> Any:
        for (t, dst) in self.copies:
            if dst is not None:
                dst.copy_(t.reshape(dst.shape))
        return self.out


def flash_attention(inst, operands: list, out: Optional[Any] = None) -> Any:
    """Run the flash-attention fusion ``inst`` on torch tensors; writes ``out`` if given
    (a tuple of tensors for a fusion that also outputs its row max and row sum)."""
    run = FwdLaunch(inst, operands, out)
    run.launch(_pick(run.key, run.candidates, run.launch, run.q))
    return run.finish()


def _row_runs(t: Any, nb: int) -> Optional[tuple[Any, tuple, tuple[int, int]]]:
    """[batch..., rows..., x] as (a [z, h, rows, x] tensor on the same storage, its
    strides with the outer run's row stride, (inner run's stride, inner run's length)):
    row r lies at (r // length) * outer + (r % length) * inner. Grouped query heads have
    rows [t, g] whose strides do not merge (q is [b, t, kv, g, d]); the kernel reads them
    in place. None when no split of the rows into two runs gives views."""
    import torch
    shape = list(t.shape)
    batch, rows, x = shape[:nb], shape[nb:-1], shape[-1]
    z = math.prod(batch[:-1]) if nb >= 2 else 1
    h = batch[-1] if nb >= 1 else 1
    for cut in range(1, len(rows)):
        a, b = math.prod(rows[:cut]), math.prod(rows[cut:])
        try:
            v5 = t.view(z, h, a, b, x)
        except RuntimeError:
            continue
        st = v5.stride()
        try:    # (the shape the host reads; the kernel gets the strides below)
            v4 = torch.as_strided(t, (z, h, a * b, x), (st[0], st[1], st[3], st[4]),
                                  t.storage_offset())
        except RuntimeError:
            continue
        return v4, (st[0], st[1], st[2], st[4]), (st[3], b)
    return None


def zh_runs(t: Any, nb: int) -> tuple[Any, tuple, tuple[int, int]]:
    """(q as [z, h, rows, d], the strides the kernel uses, (inner row stride, inner run
    length)) for the forward kernel: a view with one row stride ((0, 1)), or one with two
    runs of rows (``_row_runs``), or a copy."""
    try:
        shape = list(t.shape)
        z = math.prod(shape[:nb - 1]) if nb >= 2 else 1
        h = shape[nb - 1] if nb >= 1 else 1
        v = t.view(z, h, math.prod(shape[nb:-1]), shape[-1])
        return v, tuple(v.stride()), (0, 1)
    except RuntimeError:
        pass
    runs = _row_runs(t, nb)
    if runs is not None:
        return runs
    c = _zh(t, nb)
    return c, tuple(c.stride()), (0, 1)


def zh_out_runs(view: Any, shape: tuple, nb: int
                ) -> tuple[Any, Optional[Any], tuple, tuple[int, int]]:
    """zh_out for the forward's output O, also written in place through two runs of rows
    (``_row_runs``): (tensor, copy-back target or None, the kernel's strides, (inner
    stride, run length))."""
    t, dst = zh_out(view, shape, nb)
    if dst is None:
        return t, None, tuple(t.stride()), (0, 1)
    runs = _row_runs(view, nb)
    if runs is not None and tuple(runs[0].shape) == tuple(shape):
        return runs[0], None, runs[1], runs[2]
    return t, dst, tuple(t.stride()), (0, 1)


def zh_out(view: Any, shape: tuple, nb: int) -> tuple[Any, Optional[Any]]:
    """A [z, h, rows, x] (or [z, h, rows]) tensor the kernel writes for the output ``view``:
    a view of it where its strides allow (then None), else a scratch tensor and ``view``
    to copy it back into."""
    import torch
    if len(shape) == 3:     # row statistics [batch..., rows...]
        z = math.prod(view.shape[:nb - 1]) if nb >= 2 else 1
        h = view.shape[nb - 1] if nb >= 1 else 1
        r = view.reshape(z, h, -1)
    else:
        r = _zh(view, nb)
    if tuple(r.shape) == tuple(shape) and r.data_ptr() == view.data_ptr() and \
            _same_storage_view(r, view):
        return r, None
    return torch.empty(shape, dtype=view.dtype, device=view.device), view


def _same_storage_view(a: Any, b: Any) -> bool:
    """Whether reshape ``a`` of ``b`` is a view (shares its storage) rather than a copy."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
