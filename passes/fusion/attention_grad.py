"""Flash-attention backward: the gradient ``jax.grad`` writes for an attention, recognized.

For o = softmax(score(q·k))·v and a cotangent dO, JAX's backward is, in some spelling::

    dV  = dot(P, dO)            contracting the rows         [batch, keys, dv] (any order)
    dP  = dot(dO, V)            contracting the head dim     [batch, rows, keys]
    dX  = f(P, e, l, m, x, dP)  the softmax VJP, = P * (dP - rowsum(P * dP)) per row
    dS  = scale * select(keep, dX, 0)  through the score function (masks, scale, converts)
    dQ  = dot(dS, K)   dK = dot(dS, Q)

``match_backward(div)`` starts from the probabilities P (the softmax's divide) and finds
those five dots. The softmax VJP ``f`` is accepted whatever ops JAX used for it (the
custom-JVP form, or the transposed division chain ``e / l``, ``-e / l^2`` ...), as long as
it is a per-row function of (x, x - m, e, l, m, P, dP) built from elementwise ops, compares,
selects, row sums and row broadcasts: it is evaluated in float64 on random rows and must
equal P * (dP - rowsum(P * dP)) (attention_vjp.py). Anything else is a NoMatch with the
reason. (A softmax
written by hand without stop_gradient on its max adds the max's gradient, rowsum(dX) times
the argmax indicator: zero in exact arithmetic, so it passes the check and the kernel
leaves it out; jax.jit's value of it is rounding noise.)

The dots may read dS, P and dO through views that only permute their dims, and the
scores may be a transpose of q·k: a grouped-query einsum (q as [b, s, kv head, group, d])
has scores [b, kv head, group, q, k] made from q·k's [b, kv head, k, q, group], and its
gradient reads dS transposed back. Each dot's dims are paired with the q, k or score dims
they stand for, so the group is one more row dim of each K/V head: dV = Pᵀ·dO and
dK = dSᵀ·Q contract it with the queries (the sum over the group), as the kernels do.
dP and dS need not be in the scores' order either: jax.nn's grouped form has scores
[b, kv, t, g, s] but computes dP as [b, kv, g, t, s] and dS as [g, b, kv, t, s]. The match
keeps their *score maps* (``dp_perm``, ``g_perm``: which score dim each of their dims is),
the VJP check follows them through every view, and the kernels permute by them. The batch
dims may also sit between row dims (scores [b, g, kv, q, k]; ``score_layout``).

``split_backward`` then gives the backward its own copy of the recompute chain (q·k, the
score function, x - m, exp, divide by l), reading only q, k, the masks and the forward's
row max and row sum: the forward fusion outputs O plus those two [batch, rows] vectors (its
logsumexp), and the backward fusion (``__flash_attention_backward``) recomputes P block by
block. No instruction of either fusion is [batch, rows, keys] outside a kernel.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hlo.ir import Instruction

from .attention import (NoMatch, QKOperands, _find_qk, _scalar_constant, _score_steps,
                        _softmax, _through, check_qk, score_dims, score_layout)
from .attention_vjp import check_vjp, normalized
from .views import VIEW_OPS, trace_view, view_step

FLASH_ATTENTION_BACKWARD = "__flash_attention_backward"


@dataclass
class BackwardMatch(QKOperands):
    div: Instruction            # P = e / l
    ex: Instruction
    sub: Instruction            # x - m
    x: Instruction              # the softmax input
    m_src: Instruction          # the row max (a reduce, or a parameter in a fusion body)
    l_src: Instruction          # the row sum
    qk: Instruction
    k_is_lhs: bool
    steps: list
    dv: Instruction             # dot(P, dO)
    dp: Instruction             # dot(dO, V): [batch, rows, keys] in the scores' order
    dq: Instruction             # dot(dS, K)
    dk: Instruction             # dot(dS, Q)
    g_root: Instruction         # dS as the dq/dk dots read it (before views/converts)
    dx_root: Instruction        # dX, the softmax VJP's result
    selects: list = field(default_factory=list)   # (pred, keep_if_true) applied to dX
    scale: float = 1.0
    nodes: list = field(default_factory=list)     # backward instructions (not the recompute)
    # The forward's output O (the fusion pass sets it when O is read outside the forward,
    # so the forward fusion outputs it) and o_perm: its dims as [batch, rows in the scores'
    # order..., dv], dO's order in the kernels. The kernels then take delta = rowsum(dO∘O)
    # (FlashAttention's preprocess, one pass over two [rows, dv] tensors) instead of
    # rowsum(P∘dP) (two block products per block pair).
    o_value: Optional[Instruction] = None
    o_perm: list = field(default_factory=list)
    # dS and dP dim -> score dim: jax.nn's grouped-query form computes them in other orders
    # than the scores ([g, b, kv, t, s] and [b, kv, g, t, s] against [b, kv, t, g, s])
    dp_perm: tuple = ()
    g_perm: tuple = ()

    @property
    def members(self) -> list[Instruction]:
        return self.nodes

    @property
    def outputs(self) -> list[Instruction]:
        return [self.dq, self.dk, self.dv]


def backend_config(b: BackwardMatch) -> str:
    summary = {"causal": any(s.kind == "causal" for s in b.steps),
               "mask": any(s.kind == "mask" for s in b.steps),
               "bias": any(s.kind == "bias" for s in b.steps),
               "scale": round(b.scale, 8), "outputs": ["dq", "dk", "dv"]}
    if b.o_value is not None:     # the fusion's last operand is O (rewrite.Group.reads)
        summary["o_operand"] = "last"
        summary["o_perm"] = list(b.o_perm)
    return json.dumps({"fusion_backend_config": {"kind": FLASH_ATTENTION_BACKWARD,
                                                 "flash_attention_backward": summary}},
                      separators=(",", ":"))


def forward_output_perm(inst: Instruction) -> Optional[list[int]]:
    """The permutation of a backward fusion's last operand, the forward's output O, into
    [batch, rows in the scores' order..., dv] when the fusion reads O (its backend config
    says so), else None."""
    cfg = inst.attrs.get("backend_config")
    text = str(getattr(cfg, "text", cfg) or "")
    try:
        summary = json.loads(text)["fusion_backend_config"]["flash_attention_backward"]
    except (ValueError, KeyError, TypeError):
        return None
    if summary.get("o_operand") != "last":
        return None
    return [int(d) for d in summary["o_perm"]]


# --- helpers --------------------------------------------------------------------------------
def _src(inst: Instruction) -> Instruction:
    return _through(inst)[0]


def _readers(inst: Instruction) -> list[tuple[Instruction, Instruction]]:
    """(reader, operand as read) for every non-view reader of ``inst`` through views
    that only permute its dims (transposes included) and float converts."""
    out, stack, seen = [], [inst], set()
    while stack:
        cur = stack.pop()
        for u in cur.users:
            if id(u) in seen:
                continue
            seen.add(id(u))
            step = view_step(u, converts=True) if u.opcode in VIEW_OPS | {"convert"} else None
            if step is not None and _as_permutation(
                    tuple(None if d is None or cur.shape.dims[d] == 1 else d for d in step),
                    cur.shape.dims) is not None:
                stack.append(u)
            else:
                out.append((u, cur))
    return out


def _dims(dot: Instruction, side: int) -> tuple[list, list, list]:
    """(batch, contracting, free) dims of the dot's operand ``side`` (0 lhs, 1 rhs)."""
    s = "lhs" if side == 0 else "rhs"
    b = list(dot.attrs.get(f"{s}_batch_dims", ()))
    c = list(dot.attrs.get(f"{s}_contracting_dims", ()))
    rank = dot.operands[side].shape.rank
    return b, c, [d for d in range(rank) if d not in b and d not in c]


def _as_permutation(where: tuple, src_dims: tuple) -> Optional[tuple]:
    """``where`` (operand dim -> source dim, None for a size-1 dim) as a full permutation of
    the source's dims, the size-1 dims paired in order (which goes where moves no
    element); None when the view broadcasts, drops or merges a dim."""
    if len(where) != len(src_dims):
        return None
    spare = iter(d for d in range(len(src_dims)) if d not in where and src_dims[d] == 1)
    perm = tuple(next(spare, None) if w is None else w for w in where)
    return perm if None not in perm and sorted(perm) == list(range(len(src_dims))) else None


def value_perm(dot: Instruction, side: int, value: Instruction) -> Optional[tuple]:
    """operand dim -> ``value`` dim when the dot's operand ``side`` is ``value`` through
    views/converts that only permute its dims (a grouped-query einsum's backward reads dS
    transposed back to q·k's order), else None."""
    src, where, _ = _through(dot.operands[side])
    return _as_permutation(where, value.shape.dims) if src is value else None


def _side(dot: Instruction, value: Instruction) -> Optional[int]:
    """Which operand of ``dot`` is ``value`` through views that only permute its dims."""
    for side in (0, 1):
        if value_perm(dot, side, value) is not None:
            return side
    return None


def _paired(dot: Instruction, side: int, value: Instruction) -> tuple[dict, dict]:
    """({value batch dim: other operand's batch dim}, the same for contracting dims), the
    value read through its permutation."""
    w = value_perm(dot, side, value)
    assert w is not None
    s, o = ("lhs", "rhs") if side == 0 else ("rhs", "lhs")
    a = dot.attrs
    return ({w[d]: e for d, e in zip(a.get(f"{s}_batch_dims", ()), a.get(f"{o}_batch_dims", ()))},
            {w[d]: e for d, e in zip(a.get(f"{s}_contracting_dims", ()),
                                     a.get(f"{o}_contracting_dims", ()))})


def other_dims(dot: Instruction, side: int, value: Instruction) -> tuple[list, list, list]:
    """(batch, contracting, free) dims of the operand facing ``value`` (on ``side``), the
    batch and contracting ones ordered by the value dims they pair with."""
    bp, cp = _paired(dot, side, value)
    b, c = [bp[d] for d in sorted(bp)], [cp[d] for d in sorted(cp)]
    return b, c, _dims(dot, 1 - side)[2]


def gradient_order(dot: Instruction, side: int, value: Instruction,
                   to_scores: Optional[tuple] = None) -> list[int]:
    """The dims of a gradient dot's result (``value`` = dS or P on ``side``) listed as
    [batch in the scores' order..., the value's free dims in the scores' order..., the other
    operand's free dims]: the kernels' [z, h, rows, d]. ``to_scores``: value dim -> score
    dim (identity when the value is in the scores' order)."""
    w = value_perm(dot, side, value)
    assert w is not None
    if to_scores:
        w = tuple(to_scores[d] for d in w)
    vb, _, vf = _dims(dot, side)
    nb = len(vb)
    n_lhs_free = len(_dims(dot, 0)[2])
    v_free_at = list(range(nb, nb + len(vf))) if side == 0 else \
        list(range(nb + n_lhs_free, dot.shape.rank))
    o_free_at = list(range(nb + len(vf), dot.shape.rank)) if side == 0 else \
        list(range(nb, nb + n_lhs_free))
    batch = [j for _, j in sorted((w[d], j) for j, d in enumerate(vb))]
    free = [j for _, j in sorted((w[d], j) for j, d in zip(v_free_at, vf))]
    return batch + free + o_free_at


# --- the match --------------------------------------------------------------------------------
def _score_backward(g_root: Instruction, b: BackwardMatch) -> None:
    """Walk dS down to dX: converts, scale by constants, select(keep, ., 0)."""
    cur, scale = g_root, 1.0
    while True:
        op = cur.opcode
        if op == "convert":
            cur = cur.operands[0]
            continue
        if op in ("multiply", "divide"):
            c = [_scalar_constant(o) for o in cur.operands]
            if op == "divide" and c[1] not in (None, 0):
                scale, cur = scale / c[1], cur.operands[0]
                continue
            if op == "multiply" and (c[0] is not None or c[1] is not None):
                k = 0 if c[0] is not None else 1
                scale, cur = scale * c[k], cur.operands[1 - k]
                continue
        if op == "select":
            for path, fill, keep in ((1, 2, True), (2, 1, False)):
                if _scalar_constant(cur.operands[fill]) == 0:
                    b.selects.append((cur.operands[0], keep))
                    cur = cur.operands[path]
                    break
            else:
                break
            continue
        break
    b.dx_root, b.scale = cur, scale


def _cone(root: Instruction, stop: set[int]) -> list[Instruction]:
    out, stack, seen = [], [root], set()
    while stack:
        i = stack.pop()
        if id(i) in seen or id(i) in stop or i.opcode in ("constant", "parameter"):
            continue
        seen.add(id(i))
        out.append(i)
        stack.extend(i.operands)
    return out


def _other_dots(value: Instruction, *known: Instruction) -> list[Instruction]:
    """Dots reading ``value`` (through permuting views) besides the ``known`` ones."""
    ids = {id(k) for k in known}
    return [u for u, _ in _readers(value) if u.opcode == "dot" and id(u) not in ids]


def _missing(part: str, wrt: str, why: str, others: list[Instruction]) -> str:
    """Which part of the backward is missing and why, for the explanation."""
    if others:
        return (f"{part} is not matched: {why}; %{others[0].name} reads it but not in that "
                "form (its dims do not pair with the scores' as the kernel needs)")
    return (f"{part} is not in this gradient ({why}: the gradient is not taken with "
            f"respect to {wrt}); the fused backward computes dQ, dK and dV together from one "
            "recompute of P, so a gradient without all three is left unfused")


def _operand_maps(qk: Instruction, x: Instruction, k_is_lhs: bool
                  ) -> tuple[tuple[Instruction, dict], tuple[Instruction, dict]]:
    """((q source, {score dim: q source dim}), (k source, {score dim: k source dim})) for
    the batch and row dims (q) and the batch and key dims (k); the source is q or k before
    views that only permute its dims."""
    where = score_dims(x, qk)                   # score dim -> q·k dim
    nb = len(qk.attrs.get("lhs_batch_dims", ()))
    dims = [_dims(qk, 0), _dims(qk, 1)]
    # q·k dim -> (side, operand dim) for its non-batch dims
    free = [(0, d) for d in dims[0][2]] + [(1, d) for d in dims[1][2]]
    out = []
    for side in ((1, 0) if k_is_lhs else (0, 1)):
        src = _src(qk.operands[side])
        perm = value_perm(qk, side, src)
        if perm is None:
            src, perm = qk.operands[side], tuple(range(qk.operands[side].shape.rank))
        of = {s: perm[dims[side][0][where[s]]] for s in range(x.shape.rank) if where[s] < nb}
        for s in (s for s in range(x.shape.rank) if where[s] >= nb):
            o_side, d = free[where[s] - nb]
            if o_side == side:
                of[s] = perm[d]
        out.append((src, of))
    return out[0], out[1]


def match_backward(div: Instruction, stats_given: bool = False, fwd=None) -> BackwardMatch:
    """The attention backward reading the probabilities ``div``; raises NoMatch."""
    ex, x, _ = _softmax(div, stats_given)
    sub = _src(ex.operands[0])
    m_src, l_src = _src(sub.operands[1]), _src(div.operands[1])
    qk = _find_qk(x)
    k_is_lhs = check_qk(qk, x)
    steps, _ = _score_steps(x, qk)
    dv, p_side = _match_dv(div, x, qk)
    dp, dp_perm = _match_dp(dv, p_side, div, x, qk, fwd)
    b = BackwardMatch(div, ex, sub, x, m_src, l_src, qk, k_is_lhs, steps, dv, dp,
                      dv, dv, div, div, dp_perm=dp_perm)
    b.dq, b.dk, b.g_root, b.g_perm = _match_ds(qk, x, k_is_lhs)
    _score_backward(b.g_root, b)
    fwd_scale = float(np.prod([s.value for s in steps if s.kind == "scale"]))
    if not np.isclose(b.scale, fwd_scale, rtol=1e-6):
        raise NoMatch(f"dS is scaled by {b.scale:g}, the scores by {fwd_scale:g}")
    _check_masks(b)
    rank = x.shape.rank
    leaves = {id(i): (name, normalized(tuple(range(rank)), x.shape.dims))
              for i, name in ((x, "x"), (sub, "sub"), (ex, "ex"), (div, "p"))}
    leaves[id(dp)] = ("dp", normalized(dp_perm, dp.shape.dims))
    for name, value, read in (("m", m_src, sub.operands[1]), ("l", l_src, div.operands[1])):
        leaves[id(value)] = (name, _row_map(value, read))
    got = check_vjp(b.dx_root, leaves, x.shape.dims)
    if got != normalized(b.g_perm, b.g_root.shape.dims):
        raise NoMatch(f"the softmax gradient %{b.dx_root.name} is not in the order of the dS "
                      f"%{b.g_root.name} that dQ and dK read")
    stop = {id(i) for i in (x, sub, ex, div, m_src, l_src, dp)}
    # a mask the forward reads as an operand (a sliding window's two compares) stays
    # outside the backward too: both fusions read the [q, k] mask
    stop |= {id(s.tensor) for s in steps if s.tensor is not None}
    r_nodes = _cone(b.g_root, stop)
    views = [v for d in (dv, b.dq, b.dk) for o in d.operands for v in _through(o)[2]
             if id(v) not in stop] + _through(dp.operands[0])[2]    # dO as dP reads it
    b.nodes = _unique_insts([dp, dv, b.dq, b.dk] + r_nodes + views)
    return b


def _row_map(value: Instruction, read: Instruction) -> tuple:
    """The score map of a row statistic ``value`` (the row max or sum) that ``read`` (a
    [rows, keys] operand of the softmax) broadcasts: value dim -> score dim."""
    src, where = trace_view(read, converts=True)
    assert src is value
    inv = {w: s for s, w in enumerate(where) if w is not None}
    return tuple(inv.get(d) for d in range(value.shape.rank))


def _match_dv(div: Instruction, x: Instruction, qk: Instruction) -> tuple[Instruction, int]:
    """dV = dot(P, dO): the dot reading P (maybe transposed) that contracts all its rows;
    (the dot, P's side)."""
    rank = x.shape.rank
    batch, rows = score_layout(x, qk)
    dvs = []
    for u, _r in _readers(div):
        s = _side(u, div) if u.opcode == "dot" else None
        if s is not None:
            bp, cp = _paired(u, s, div)
            if sorted(bp) == batch and sorted(cp) == rows:
                dvs.append((u, s))
    if not dvs:
        # (the forward's P·V reads P too, contracting its keys)
        others = [u for u in _other_dots(div) if _side(u, div) is None or
                  rank - 1 not in _paired(u, _side(u, div), div)[1]]
        raise NoMatch(_missing("dV = P^T.dO", "v", f"no dot contracts the probabilities "
                               f"%{div.name} over their rows", others))
    if len(dvs) != 1:
        raise NoMatch(f"{len(dvs)} dots contract the probabilities %{div.name} over their rows "
                      "(dV = P^T.dO); the fused backward has one")
    return dvs[0]


def _match_dp(dv: Instruction, p_side: int, div: Instruction, x: Instruction, qk: Instruction,
              fwd) -> tuple[Instruction, tuple]:
    """dP = dot(dO, V): batch and rows of dO as dV reads them; (the dot, its score map:
    dP dim -> score dim). jax.nn's grouped form writes dP's rows in another order than the
    scores' ([g, t] against [t, g]): the map says which."""
    rank = x.shape.rank
    batch, rows = score_layout(x, qk)
    do_read = dv.operands[1 - p_side]
    do = _src(do_read)
    if value_perm(dv, 1 - p_side, do) is None:
        do = do_read
    d_perm = value_perm(dv, 1 - p_side, do)
    do_b, do_c, _ = (list(map(d_perm.__getitem__, dims))
                     for dims in other_dims(dv, p_side, div))
    dps = []
    for u, _r in _readers(do):
        if u.opcode != "dot" or u is dv or _side(u, do) != 0 or u.shape.rank != rank:
            continue
        w = value_perm(u, 0, do)
        b_, c_, f_ = ([w[d] for d in dims] for dims in _dims(u, 0))
        if b_ == do_b and sorted(f_) == sorted(do_c) and len(c_) == 1 and \
                len(_dims(u, 1)[2]) == 1:
            dps.append((u, tuple(batch) + tuple(rows[do_c.index(f)] for f in f_) +
                        (rank - 1,)))
    if not dps:
        raise NoMatch(_missing("dP = dO.V^T", "q and k", f"no dot reads the cotangent "
                               f"%{do.name} as dO.V^T ([batch, rows, keys])",
                               _other_dots(do, dv)))
    if len(dps) != 1:
        raise NoMatch(f"{len(dps)} dots read the cotangent %{do.name} as dO.V^T; the fused "
                      "backward has one")
    dp = dps[0][0]
    if fwd is not None:     # V as the forward read it: dP contracts its head dim
        pv_v = 1 if fwd.p_is_lhs else 0
        vb, vc, vf = _dims(fwd.pv, pv_v)
        if _src(dp.operands[1]) is not _src(fwd.v) or _dims(dp, 1) != (vb, vf, vc):
            raise NoMatch(f"%{dp.name} = dO.V^T does not read the forward's V by its head dim")
    return dps[0]


def _ds_readers(src: Instruction, of: dict, contract: set, qk: Instruction, x: Instruction
                ) -> list[tuple[Instruction, Instruction, dict]]:
    """Dots that contract a dS-shaped value with ``src`` (k for dQ, q for dK) as the
    gradient does: (dot, dS, {dS dim: score dim}) for those whose batch dims pair with the
    scores' batch dims and whose contracted dims are ``contract``, through ``of`` (score
    dim -> ``src`` dim)."""
    rank = x.shape.rank
    batch = set(score_layout(x, qk)[0])
    score_of = {v: s for s, v in of.items()}      # src dim -> score dim
    out = []
    for u, _r in _readers(src):
        if u.opcode != "dot" or u is qk:
            continue
        o_side = _side(u, src)
        if o_side is None:
            continue
        g = _src(u.operands[1 - o_side])
        if g.shape.rank != rank or sorted(g.shape.dims) != sorted(x.shape.dims) or \
                _side(u, g) != 1 - o_side:
            continue
        o_perm = value_perm(u, o_side, src)
        bp, cp = _paired(u, 1 - o_side, g)
        gmap = {d: score_of.get(o_perm[e]) for pairs in (bp, cp) for d, e in pairs.items()}
        if {gmap[d] for d in bp} == batch and {gmap[d] for d in cp} == contract and \
                all(x.shape.dims[s] == g.shape.dims[d] for d, s in gmap.items()):
            out.append((u, g, gmap))
    return out


def _match_ds(qk: Instruction, x: Instruction, k_is_lhs: bool
              ) -> tuple[Instruction, Instruction, Instruction, tuple]:
    """dQ = dot(dS, K) and dK = dot(dS, Q), both reading one dS, which may be in another
    dim order than the scores (a grouped-query einsum's gradient reads dS in q·k's order,
    jax.nn's grouped form computes it as [g, b, kv, t, s]): every dim of dS pairs with the
    q or k dim that made that score dim. Returns (dQ, dK, dS, dS dim -> score dim)."""
    rank = x.shape.rank
    (q_src, q_of), (k_src, k_of) = _operand_maps(qk, x, k_is_lhs)
    dqs = _ds_readers(k_src, k_of, {rank - 1}, qk, x)
    dks = _ds_readers(q_src, q_of, set(score_layout(x, qk)[1]), qk, x)
    for name, mine, theirs, what, src in (("dq", dqs, dks, "q", k_src),
                                          ("dk", dks, dqs, "k", q_src)):
        if not mine and theirs:
            raise NoMatch(_missing(
                "dQ = dS.K" if name == "dq" else "dK = dS^T.Q", what,
                f"{'dK = dS^T.Q' if name == 'dq' else 'dQ = dS.K'} is there, but no dot "
                f"contracts that dS with %{src.name} as "
                f"{'dQ = dS.K' if name == 'dq' else 'dK = dS^T.Q'} would",
                _other_dots(src, qk, theirs[0][0])))
    for dq, g, qmap in dqs:
        for dk, g2, kmap in dks:
            if g2 is not g or any(qmap[d] != kmap[d] for d in set(qmap) & set(kmap)):
                continue
            perm = {**qmap, **kmap}
            g_perm = tuple(perm.get(d, -1) for d in range(rank))
            if sorted(g_perm) == list(range(rank)):
                return dq, dk, g, g_perm
    raise NoMatch(f"dQ = dS.K and dK = dS^T.Q reading one dS not found (found "
                  f"{[n for n, c in (('dq', dqs), ('dk', dks)) if c] or 'neither'})")


def _mask_key(pred: Instruction, to_scores: dict, keep: bool) -> tuple:
    """A mask as (its source, score dim -> source dim, keep-if-true), whatever views and
    dim order the select reading it has (``to_scores``: score dim -> the select's dim)."""
    src, where = trace_view(pred)
    return id(src), tuple(where[to_scores[s]] for s in range(len(to_scores))), keep


def _check_masks(b: BackwardMatch) -> None:
    """The selects on dX are the forward's masks (causal test, boolean mask), each read with
    the same score dims (the backward's dS may be in another order)."""
    rank = b.x.shape.rank
    fwd = set()
    for s in b.steps:
        if s.kind in ("mask", "causal"):
            at = score_dims(b.x, b.qk, to=s.inst)
            fwd.add(_mask_key(s.inst.operands[0], dict(enumerate(at)),
                              _path_operand(s.inst) is s.inst.operands[1]))
    g_dim = {s: d for d, s in enumerate(b.g_perm)}
    bwd = {_mask_key(p, {s: g_dim[s] for s in range(rank)}, keep) for p, keep in b.selects}
    if fwd != bwd:
        raise NoMatch("the gradient's selects on dX are not the forward's masks")


def _path_operand(sel: Instruction) -> Instruction:
    """The scores' operand of a forward mask select (the one that is not the fill)."""
    return sel.operands[1] if _scalar_constant(sel.operands[2]) is not None else sel.operands[2]


def _unique_insts(items: list[Instruction]) -> list[Instruction]:
    seen, out = set(), []
    for i in items:
        if id(i) not in seen:
            seen.add(id(i))
            out.append(i)
    return out


def split_backward(b: BackwardMatch, recompute: list[Instruction]) -> list[Instruction]:
    """Give the backward instructions their own copies of the ``recompute`` instructions
    (q·k, score function, mask cone, x - m, exp, P) they read; returns the copies."""
    comp = b.div.parent
    assert comp is not None
    rec = {id(i) for i in recompute}
    clones: dict[int, Instruction] = {}
    order = {id(i): n for n, i in enumerate(comp.instructions)}
    anchor = min(b.nodes, key=lambda i: order[id(i)])
    made: list[Instruction] = []

    def clone(i: Instruction) -> Instruction:
        if id(i) not in rec or i.opcode == "constant":
            return i
        c = clones.get(id(i))
        if c is None:
            ops = [clone(o) for o in i.operands]
            c = Instruction(i.opcode, ops, i.shape, i.attrs, name=i.name + ".bwd",
                            literal=i.literal)
            comp.insert_before(c, anchor)
            clones[id(i)] = c
            made.append(c)
        return c

    ids = {id(i) for i in b.nodes}
    for node in b.nodes:
        for n, o in enumerate(list(node.operands)):
            if id(o) in rec and id(o) not in ids:
                node.replace_operand(n, clone(o))
    return made
