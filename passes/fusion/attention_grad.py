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
it is a per-row function of (x, x - m, e, l, m, P, dP) built from elementwise ops, row sums
and row broadcasts: it is evaluated in float64 on random rows and must equal
P * (dP - rowsum(P * dP)). Anything else is a NoMatch with the reason.

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

from .attention import (NoMatch, QKOperands, _find_qk, _is_identity, _scalar_constant,
                        _score_steps, _softmax, _through, check_qk, score_dims)
from .views import VIEW_OPS, view_step

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
    return json.dumps({"fusion_backend_config": {"kind": FLASH_ATTENTION_BACKWARD,
                                                 "flash_attention_backward": summary}},
                      separators=(",", ":"))


# --- helpers --------------------------------------------------------------------------------
def _src(inst: Instruction) -> Instruction:
    return _through(inst)[0]


def _readers(inst: Instruction) -> list[tuple[Instruction, Instruction]]:
    """(reader, operand as read) for every non-view reader of ``inst`` through identity
    views and float converts."""
    out, stack, seen = [], [inst], set()
    while stack:
        cur = stack.pop()
        for u in cur.users:
            if id(u) in seen:
                continue
            seen.add(id(u))
            step = view_step(u, converts=True) if u.opcode in VIEW_OPS | {"convert"} else None
            if step is not None and u.shape.dims == cur.shape.dims and \
                    step == tuple(range(u.shape.rank)):
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


def _side(dot: Instruction, value: Instruction) -> Optional[int]:
    """Which operand of ``dot`` is ``value`` through identity views/converts."""
    for side in (0, 1):
        src, where, _ = _through(dot.operands[side])
        if src is value and _is_identity(where, value.shape.dims):
            return side
    return None


# --- the softmax VJP, checked on random rows ---------------------------------------------------
_ELEMENTWISE = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "negate": np.negative, "exponential": np.exp, "log": np.log, "maximum": np.maximum,
    "minimum": np.minimum,
}


def _non1(dims, where=None) -> list:
    return [d for d in range(len(dims)) if dims[d] != 1]


def _row_fn(root: Instruction, leaves: dict[int, str], full: int, keys: int,
            env: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate ``root`` as a per-row function: values with ``full`` elements are [T, keys],
    values with full/keys elements are [T]. Raises NoMatch for anything else."""
    memo: dict[int, np.ndarray] = {}

    def size(i: Instruction) -> int:
        return int(np.prod(i.shape.dims)) if i.shape.is_array else -1

    def val(i: Instruction):
        if id(i) in leaves:
            return env[leaves[id(i)]]
        if id(i) in memo:
            return memo[id(i)]
        c = _scalar_constant(i)
        if c is not None:
            return c
        n, op = size(i), i.opcode
        if op == "convert":
            v = val(i.operands[0])
        elif op in VIEW_OPS:
            src = i.operands[0]
            step = view_step(i)
            if step is None:
                raise NoMatch(f"%{i.name} ({op}) in the softmax gradient moves elements")
            sdims, idims = src.shape.dims, i.shape.dims
            mapped = [step[d] for d in range(len(idims)) if idims[d] != 1]
            if size(src) == n:      # same values, maybe other size-1 dims
                if None in mapped or mapped != sorted(mapped) or \
                        len(mapped) != len(_non1(sdims)):
                    raise NoMatch(f"%{i.name} ({op}) in the softmax gradient permutes dims")
                v = val(src)
            elif n == full and size(src) * keys == full:    # a row value broadcast along keys
                if step[-1] is not None or len([m for m in mapped if m is not None]) != \
                        len(_non1(sdims)):
                    raise NoMatch(f"%{i.name} broadcasts along a row dim, not the key axis")
                v = np.broadcast_to(np.asarray(val(src))[:, None], env["x"].shape)
            else:
                raise NoMatch(f"%{i.name} ({op}) in the softmax gradient is not a row view")
        elif op == "reduce":
            body = i.attrs.get("to_apply")
            src = i.operands[0]
            if body is None or body.root.opcode != "add" or size(src) != full or \
                    list(i.attrs.get("dimensions", ())) != [src.shape.rank - 1] or \
                    _scalar_constant(i.operands[1]) != 0:
                raise NoMatch(f"%{i.name} in the softmax gradient is not a row sum")
            v = np.asarray(val(src)).sum(axis=-1)
        elif op in _ELEMENTWISE:
            with np.errstate(all="ignore"):
                v = _ELEMENTWISE[op](*[val(o) for o in i.operands])
        else:
            raise NoMatch(f"%{i.name} ({op}) in the softmax gradient is not an elementwise "
                          "op, row sum or row broadcast")
        memo[id(i)] = v
        return v

    return np.asarray(val(root))


def _check_vjp(b: BackwardMatch) -> None:
    full = int(np.prod(b.x.shape.dims))
    keys = b.x.shape.dims[-1]
    leaves = {id(b.x): "x", id(b.sub): "sub", id(b.ex): "ex", id(b.div): "p",
              id(b.m_src): "m", id(b.l_src): "l", id(b.dp): "dp"}
    rng = np.random.default_rng(0)
    x = 2 * rng.standard_normal((5, keys))
    m = x.max(axis=-1)
    ex = np.exp(x - m[:, None])
    l_ = ex.sum(axis=-1)
    p = ex / l_[:, None]
    dp = rng.standard_normal((5, keys))
    env = {"x": x, "sub": x - m[:, None], "ex": ex, "l": l_, "m": m, "p": p, "dp": dp}
    got = _row_fn(b.dx_root, leaves, full, keys, env)
    want = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-7, atol=1e-10):
        raise NoMatch(f"%{b.dx_root.name} is not the softmax gradient P*(dP - rowsum(P*dP)) "
                      "(checked on random rows)")


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


def match_backward(div: Instruction, stats_given: bool = False, fwd=None) -> BackwardMatch:
    """The attention backward reading the probabilities ``div``; raises NoMatch."""
    ex, x, _ = _softmax(div, stats_given)
    sub = _src(ex.operands[0])
    m_src, l_src = _src(sub.operands[1]), _src(div.operands[1])
    qk = _find_qk(x)
    k_is_lhs = check_qk(qk, x)
    steps, _ = _score_steps(x, qk)
    rank = x.shape.rank
    if score_dims(x, qk) != tuple(range(rank)):
        raise NoMatch("the backward needs the scores in q·k's order (no transposes between "
                      "q·k and the softmax)")
    nb = len(qk.attrs.get("lhs_batch_dims", ()))
    rows = list(range(nb, rank - 1))
    q, k = qk.operands[1 if k_is_lhs else 0], qk.operands[0 if k_is_lhs else 1]
    q_rows = _dims(qk, 1 if k_is_lhs else 0)[2]
    # dV = dot(P, dO): the dot reading P that contracts its rows.
    dvs = [(u, s) for u, _r in _readers(div) if u.opcode == "dot"
           for s in [_side(u, div)]
           if s is not None and _dims(u, s)[1] == rows and _dims(u, s)[0] == list(range(nb))]
    if len(dvs) != 1:
        raise NoMatch(f"no single dot contracts the probabilities %{div.name} over their rows "
                      f"(dV = P^T.dO); found {len(dvs)}")
    dv, p_side = dvs[0]
    do_read = dv.operands[1 - p_side]
    do = _src(do_read)
    do_b, do_c, _ = _dims(dv, 1 - p_side)
    # dP = dot(dO, V): batch and rows of dO as in dV, result in the scores' order.
    dps = []
    for u, _r in _readers(do):
        if u.opcode != "dot" or u is dv or _side(u, do) != 0 or u.shape.dims != x.shape.dims:
            continue
        b_, c_, f_ = _dims(u, 0)
        if b_ == do_b and f_ == do_c and len(c_) == 1 and len(_dims(u, 1)[2]) == 1:
            dps.append(u)
    if len(dps) != 1:
        raise NoMatch(f"no single dot dO.V^T ([batch, rows, keys]) reads the cotangent "
                      f"%{do.name}; found {len(dps)}")
    dp = dps[0]
    if fwd is not None:     # V as the forward read it: dP contracts its head dim
        pv_v = 1 if fwd.p_is_lhs else 0
        vb, vc, vf = _dims(fwd.pv, pv_v)
        if _src(dp.operands[1]) is not _src(fwd.v) or _dims(dp, 1) != (vb, vf, vc):
            raise NoMatch(f"%{dp.name} = dO.V^T does not read the forward's V by its head dim")
    b = BackwardMatch(div, ex, sub, x, m_src, l_src, qk, k_is_lhs, steps, dv, dp,
                      dv, dv, div, div)
    # dQ = dot(dS, K), dK = dot(dS, Q), both reading the same dS.
    k_seq = _dims(qk, 0 if k_is_lhs else 1)[2]
    found: dict[str, tuple[Instruction, Instruction]] = {}
    for name, operand, g_contract in (("dq", k, [rank - 1]), ("dk", q, rows)):
        for u, _r in _readers(_src(operand)):
            if u.opcode != "dot" or u is qk:
                continue
            o_side = _side(u, _src(operand))
            if o_side is None:
                continue
            g = _src(u.operands[1 - o_side])
            gb, gc, _ = _dims(u, 1 - o_side)
            ob, oc, _ = _dims(u, o_side)
            o_contract = k_seq if name == "dq" else q_rows
            qk_side = (0 if k_is_lhs else 1) if name == "dq" else (1 if k_is_lhs else 0)
            if g.shape.dims == x.shape.dims and gb == list(range(nb)) and gc == g_contract \
                    and oc == o_contract and ob == _dims(qk, qk_side)[0] and \
                    _side(u, g) is not None:
                found[name] = (u, g)
    if set(found) != {"dq", "dk"} or found["dq"][1] is not found["dk"][1]:
        raise NoMatch(f"dQ = dS.K and dK = dS^T.Q reading one dS not found (found "
                      f"{sorted(found) or 'neither'})")
    b.dq, b.g_root = found["dq"]
    b.dk = found["dk"][0]
    _score_backward(b.g_root, b)
    fwd_scale = float(np.prod([s.value for s in steps if s.kind == "scale"]))
    if not np.isclose(b.scale, fwd_scale, rtol=1e-6):
        raise NoMatch(f"dS is scaled by {b.scale:g}, the scores by {fwd_scale:g}")
    fwd_masks = {id(s.inst.operands[0]): _path_operand(s.inst) is s.inst.operands[1]
                 for s in steps if s.kind in ("mask", "causal")}
    if fwd_masks != {id(p): keep for p, keep in b.selects}:
        raise NoMatch("the gradient's selects on dX are not the forward's masks")
    _check_vjp(b)
    stop = {id(i) for i in (x, sub, ex, div, m_src, l_src, dp)}
    r_nodes = _cone(b.g_root, stop)
    views = [v for d in (dv, b.dq, b.dk) for o in d.operands for v in _through(o)[2]
             if id(v) not in stop]
    b.nodes = _unique_insts([dp, dv, b.dq, b.dk] + r_nodes + views)
    return b


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


def check_closed(b: BackwardMatch, recompute: set[int]) -> None:
    """The backward's instructions are read only by each other and its outputs by anyone;
    whatever they read of the forward (``recompute``) is recomputed by the copy."""
    ids = {id(i) for i in b.nodes}
    outs = {id(i) for i in b.outputs}
    for i in b.nodes:
        if id(i) in outs:
            continue
        for u in i.users:
            if id(u) not in ids:
                raise NoMatch(f"%{i.name} (in the attention backward) is also read by "
                              f"%{u.name} outside it (a bias gradient or a returned dS)")


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
