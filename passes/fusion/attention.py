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
runs both matchers in the fusion pass. The score function's steps and the analysis of
masks (causal and sliding-window bands) are in attention_masks.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hlo.ir import Instruction

# The score function's steps and masks live in attention_masks.py; the names other modules
# import from here stay importable from here.
from .attention_masks import (_GENERATED, _VIEWS, NoMatch, ScoreStep,  # noqa: F401
                              _is_identity, _is_row_broadcast, _mask_step, _row_reduce,
                              _same_elements, _scalar_constant, _through, band_text,
                              keeps_diagonal, merged_band, recomputable)
from .rewrite import _unique
from .views import compose, view_step

FLASH_ATTENTION = "__flash_attention"



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


# Fewer query rows per (batch, head) than this (a decoding step's 1 to 8) are not fused:
# the flash kernel's grid has one program per head then, each streaming its K and V alone
# (0.146 ms for B8 H16 S2048 Dh128 on the H200, XLA's two GEMMs and softmax ~0.07 ms), and
# the scores are a small fraction of K and V.
MIN_QUERY_ROWS = 16


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
    # other code also reads stays outside and becomes an operand, unless it is recomputable
    # (attention_masks.recomputable: a causal mask, a fill, a padding mask's broadcast;
    # attention_pass.privatize_recomputable gives the fusion its own copy, as every layer
    # of a model reads one mask after CSE).
    members = [i for i in members if i.opcode != "constant"]
    ids = {id(i) for i in members}
    free: dict[int, bool] = {}
    while True:
        shared = [i for i in members if i.opcode in _GENERATED and i not in (qk, pv)
                  and not recomputable(i, free) and any(id(u) not in ids for u in i.users)]
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
    _, rows = score_layout(m.logits, m.qk)
    queries = int(np.prod([m.logits.shape.dims[r] for r in rows])) if rows else 1
    if queries < MIN_QUERY_ROWS:
        kib = m.logits.shape.size * 4 // 1024
        raise NoMatch(f"{queries} query row(s) per batch and head (a decoding step): the "
                      f"scores %{m.logits.name} are {kib} KiB, and a flash kernel would "
                      "stream K and V with one program per head; the dots run as library "
                      "GEMMs, reading K and V once at full bandwidth")
    members = m.members
    ids = {id(i) for i in members}
    allowed = {id(i) for i in row_stats(m)} if stats_out else set()
    free: dict[int, bool] = {}
    read_outside = [(i, u) for i in members if i is not pv and id(i) not in allowed
                    and not recomputable(i, free) for u in i.users if id(u) not in ids]
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
