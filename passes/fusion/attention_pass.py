"""Flash attention in the fusion pass: forward and backward matches paired, found in a
computation, explained and merged into groups.

``find_attention`` runs the matchers (passes/fusion/attention.py for the forward,
attention_grad.py for jax.grad's backward) over every dot; where the forward's probabilities
are read by a backward that matches too, the backward gets its own copy of the recompute
chain (q·k, score function, exp) and the forward fusion also outputs its row max and row
sum. A dot that looks like the end of an attention but does not match leaves its reason in
the fusion report ("no flash-attention fusion: ..."), and so does a backward that is not
matched (which part, why). ``form_attention_group`` merges a match into one group with its
backend config and explanation.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from hlo.ir import Instruction

from .attention import (AttentionMatch, NoMatch, _match_forward, _scalar_constant, _through,
                        backend_config, match_attention, row_stats, score_layout)
from .attention_masks import recomputable


def _checked_backward(pv: Instruction):
    """(forward match, backward match, the instructions the backward must recompute) when
    the forward's probabilities are read by jax.grad's backward and the two can be fused
    apart; raises NoMatch (with what was not matched). Changes nothing."""
    from .attention_grad import match_backward
    found = _match_forward(pv)
    if found is None:
        raise NoMatch(f"%{pv.name} is not the end of a softmax·V")
    m, core = found
    div = _through(m.pv.operands[0 if m.p_is_lhs else 1])[0]
    b = match_backward(div, fwd=m)
    stats = {id(i) for i in row_stats(m)}
    core_ids = {id(i) for i in core}
    # Forward views the backward also reads (the row sum broadcast) are recomputed.
    b.nodes = [i for i in b.nodes if id(i) not in core_ids]
    # Broadcast constants (the scale) that the forward also reads: the backward gets a copy.
    # (Only those read outside the backward: a copy of one the backward alone reads would
    # leave the original, maybe a broadcast plus its layout copy, dead in the graph.)
    nodes = {id(i) for i in b.nodes}
    shared_constants = [i for i in b.nodes if _scalar_constant(i) is not None
                        and i not in b.outputs and i.opcode != "constant"
                        and any(id(u) not in nodes for u in i.users)]
    b.nodes = [i for i in b.nodes if i not in shared_constants]
    bwd = {id(i) for i in b.nodes}
    outs = {id(i) for i in b.outputs}
    free: dict = {}
    for i in b.nodes:
        for u in i.users:
            if id(i) not in outs and id(u) not in bwd and not recomputable(i, free):
                raise NoMatch(f"the backward's %{i.name} is also read by %{u.name} outside "
                              "it (a bias gradient or a returned dS are not fused)")
    for i in core:
        for u in i.users:
            if i is not pv and id(i) not in stats and id(u) not in core_ids | bwd \
                    and not recomputable(i, free):
                raise NoMatch(f"%{i.name} ({i.opcode}, inside the attention) is also read by "
                              f"%{u.name}, which is neither the forward nor its backward")
    recompute = [i for i in core if i is not pv and id(i) not in stats] + shared_constants
    return m, b, recompute


def _with_backward(pv: Instruction):
    """(forward, backward) when the forward's probabilities are read by jax.grad's
    backward (passes/fusion/attention_grad.py): the backward gets its own copy of the
    recompute chain, the forward also outputs its row max and row sum. Raises NoMatch
    (with what was not matched) and leaves the graph alone then."""
    from .attention_grad import split_backward
    _, b, recompute = _checked_backward(pv)
    clones = split_backward(b, recompute)
    b.nodes = b.nodes + [c for c in clones if c.opcode != "constant"]
    fwd = match_attention(pv, stats_out=True)
    assert fwd is not None
    _read_forward_output(fwd, b)
    return fwd, b


def _read_forward_output(fwd: AttentionMatch, b) -> None:
    """Let the backward read the forward's output O (``b.o_value``, ``b.o_perm``) when
    something outside both fusions reads O, so that the forward fusion outputs it anyway."""
    from .attention_grad import gradient_order
    o = fwd.out_views[-1] if fwd.out_views else fwd.pv
    inside = {id(i) for i in fwd.members} | {id(i) for i in b.nodes}
    if not o.is_root and not any(id(u) not in inside for u in o.users):
        return
    p_side = 0 if fwd.p_is_lhs else 1
    div = _through(fwd.pv.operands[p_side])[0]
    where = list(fwd.out_where) if fwd.out_where else list(range(fwd.pv.shape.rank))
    try:
        order = gradient_order(fwd.pv, p_side, div)     # pv dims as [batch, rows, dv]
        b.o_perm = [where.index(d) for d in order]
    except (AssertionError, ValueError):
        return
    b.o_value = o


def kernel_dots(instructions: list[Instruction]) -> list[Instruction]:
    """The dots flash-attention kernels will run (forward q·k and p·v; with jax.grad's
    backward also dP, dV, dQ and dK), found as the fusion pass finds them but without
    rewriting anything: layout assignment leaves their operands in place (the kernels
    read any strides), so no layout copy comes between a backward dot and the q or k
    the forward reads."""
    dots: list[Instruction] = []
    for inst in instructions:
        if inst.opcode != "dot":
            continue
        try:
            m = match_attention(inst)
        except NoMatch:
            try:
                m, b, _ = _checked_backward(inst)
            except NoMatch:
                continue
            dots += [b.dp, b.dv, b.dq, b.dk]
        if m is not None:
            dots += [m.qk, m.pv]
    return dots


def _find(instructions: list[Instruction], backward: bool = False
          ) -> tuple[list, list[tuple[Instruction, str]]]:
    """Every attention ending at a dot of ``instructions``; near misses with reasons.
    ``backward``: also match jax.grad's backward of an attention (rewrites the graph: the
    backward gets its own recompute chain)."""
    found, missed = [], []
    taken: set[int] = set()
    for inst in instructions:
        if inst.opcode != "dot":
            continue
        b = None
        try:
            m = match_attention(inst)
        except NoMatch as e:
            if not backward:
                missed.append((inst, str(e)))
                continue
            try:
                m, b = _with_backward(inst)
            except NoMatch as e2:
                both = "backward" in str(e) and str(e2) != str(e)
                missed.append((inst, f"{e}; {e2}" if both else str(e)))
                continue
            found.append(b)
        if m is None:
            continue
        if any(id(i) in taken for i in m.members):
            missed.append((inst, "shares instructions with another attention"))
            continue
        m.members = privatize_recomputable(m.members)
        if b is not None:
            b.nodes = privatize_recomputable(b.nodes)
        taken.update(id(i) for i in m.members)
        if isinstance(m, AttentionMatch):
            m.members = m.members + operand_slices(m)
        found.append(m)
    inside = {id(i) for m in found for i in m.members}
    return found, [(i, why) for i, why in missed if id(i) not in inside]


def privatize_recomputable(members: list[Instruction]) -> list[Instruction]:
    """``members`` with each recomputable member (``attention_masks.recomputable``: a
    causal mask, its fill, a padding mask's broadcast) that is also read outside them
    replaced by a copy of its own, which the members read instead; the original stays for
    its other readers. Without this, a mask that CSE shared between two layers' attentions
    left the fusion reading it (a B·H·S·S operand) and its fill as parameters, or made no
    fusion at all."""
    if not members or members[0].parent is None:
        return members
    comp = members[0].parent
    ids = {id(i) for i in members}
    order = {id(i): n for n, i in enumerate(comp.instructions)}
    out = list(members)
    free: dict[int, bool] = {}
    # Users before operands: a copy's operands are then copied in their own turn.
    for i in sorted(members, key=lambda i: -order.get(id(i), -1)):
        inside = [u for u in i.users if id(u) in ids]
        if not inside or len(inside) == len(i.users) or not recomputable(i, free):
            continue
        c = comp.insert_before(Instruction(i.opcode, list(i.operands), i.shape, i.attrs,
                                           name=f"{i.name}.own", literal=i.literal), i)
        for u in inside:
            u.replace_operand_with(i, c)
        out[out.index(i)] = c
        ids.discard(id(i))
        ids.add(id(c))
    return out


# Views between a slice and the attention's q, k or v operand that the forward kernel
# takes in place (codegen/triton/attention.py ``operand_view``): row-major reshapes only.
_SLICE_VIEWS = ("bitcast", "reshape")


def _row_major(inst: Instruction) -> bool:
    lay = inst.shape.layout
    return lay is None or lay.is_row_major


def head_repeat(reshape: Instruction) -> Optional[tuple[int, int]]:
    """(head dim, group) when ``reshape`` (a reshape or bitcast, row-major) of a broadcast
    is ``jnp.repeat(t, group, axis=head dim)``: the broadcast inserts a dim of size group
    right after the head dim of its operand t and the reshape merges the two, every other
    dim kept in place. Each of the result's heads h is then t's head h // group: K and V
    heads shared by query groups (grouped-query attention written with jnp.repeat), which
    the forward kernel reads in place. None for anything else (jnp.tile's order too)."""
    if reshape.opcode not in _SLICE_VIEWS or not reshape.shape.is_array or \
            not _row_major(reshape) or not reshape.operands:
        return None
    b = reshape.operands[0]
    if b.opcode != "broadcast" or not b.shape.is_array or not _row_major(b) or \
            b.shape.dtype != reshape.shape.dtype or not _row_major(b.operands[0]):
        return None
    src, dims = b.operands[0].shape.dims, tuple(b.attrs.get("dimensions", ()))
    out = b.shape.dims
    if len(out) != len(src) + 1:
        return None
    for at in range(len(src)):
        if dims == tuple(range(at + 1)) + tuple(range(at + 2, len(out))):
            merged = out[:at] + (out[at] * out[at + 1],) + out[at + 2:]
            if reshape.shape.dims == merged and out[at + 1] > 1:
                return at, out[at + 1]
    return None


def operand_slices(m: AttentionMatch) -> list[Instruction]:
    """The slices (and the row-major reshapes after them) that q, k and v of a forward
    match are read through, read by nothing else: taken into the attention fusion, so the
    kernel reads its operand in place through strides instead of a copy kernel writing each
    slice first (a merged q|k|v projection, passes/dot_merger.py). Likewise K and V heads
    repeated for query groups (``head_repeat``): the kernel reads the shared heads."""
    members = {id(i) for i in m.members}
    taken: list[Instruction] = []
    for x in (m.k, m.v):
        if head_repeat(x) is None:
            continue
        chain = [x, x.operands[0]]
        if any(id(u) not in members | {id(i) for i in chain} for i in chain for u in i.users) \
                or any(id(i) in members for i in chain):
            continue
        taken += [i for i in chain if i not in taken]
    for x in (m.q, m.k, m.v):
        if any(x is t for t in taken):
            continue
        chain, cur = [], x
        while cur.opcode in _SLICE_VIEWS and cur.shape.is_array and _row_major(cur) and \
                _row_major(cur.operands[0]) and (cur.opcode == "reshape" or
                                                 cur.shape.dtype == cur.operands[0].shape.dtype):
            chain.append(cur)
            cur = cur.operands[0]
        if cur.opcode != "slice" or not cur.shape.is_array or \
                any(d.stride < 1 for d in cur.attrs["slice"].dims):
            continue
        chain.append(cur)
        inside = members | {id(i) for i in taken} | {id(i) for i in chain}
        if any(id(u) not in inside for i in chain for u in i.users) or \
                any(id(i) in members for i in chain):
            continue
        taken += [i for i in chain if i not in taken]
    return taken


# --- in the fusion pass ------------------------------------------------------------------------
REASON = ("flash attention: q·k, softmax and ·v in one kernel with an online softmax; the "
          "scores never leave the chip")


def grouped_rows(scores: tuple, row_dims: list, steps: list) -> int:
    """How many query heads share one K/V head: the product of the scores' row dims
    (``row_dims``) other than the query position, 1 for plain rows. The position is the
    causal compare's row dim (jax.nn's grouped form has rows [q, g]); without one, the one
    row dim as long as the keys if there is exactly one, else the last (a grouped einsum's
    [kv head, group, q] rows)."""
    rows = [scores[d] for d in row_dims]
    causal = next((s for s in steps if s.kind == "causal"), None)
    if causal is not None and causal.q_dim in row_dims:
        at = row_dims.index(causal.q_dim)
    else:
        same = [i for i, n in enumerate(rows) if n == scores[-1]]
        at = same[0] if len(same) == 1 else len(rows) - 1
    return int(np.prod(rows[:at] + rows[at + 1:], dtype=np.int64))


def reason_for(m) -> str:
    """The explanation recorded for a match's fused edges: what was matched."""
    from .attention_grad import BackwardMatch
    x = m.x if isinstance(m, BackwardMatch) else m.logits
    scores = x.shape.dims
    row_dims = score_layout(x, m.qk)[1]
    group = grouped_rows(scores, row_dims, m.steps)
    rows = [scores[d] for d in row_dims]
    if isinstance(m, BackwardMatch):
        why = ("flash-attention backward (jax.grad's): dV = P^T.dO, dP = dO.V^T, the softmax "
               "gradient dS = P*(dP - rowsum(P*dP)), dQ = dS.K, dK = dS^T.Q in one fusion; P "
               "is recomputed from q, k and the forward's row max/sum, no scores tensor")
        if m.o_value is not None:
            why += (f"; it also reads the forward's output %{m.o_value.name} for "
                    "rowsum(dO*O) = rowsum(P*dP), so P*dP is not recomputed for it")
        if group > 1:
            why += (f"; grouped-query heads: {group} query heads share each K/V head (rows "
                    f"{rows} per K/V head), so dK and dV sum over the group "
                    "inside the kernel")
        return why + _window_note(m.steps, backward=True)
    if group > 1:
        return (f"{REASON}; grouped-query heads: {group} query heads share each K/V head "
                f"(rows {rows} per K/V head), K and V read once per group" +
                _window_note(m.steps) + _slices_note(m))
    return REASON + _window_note(m.steps) + _slices_note(m)


def _slices_note(m: AttentionMatch) -> str:
    """What the explanation says about slices and head repeats taken in
    (``operand_slices``)."""
    note = ""
    slices = [i for i in m.members if i.opcode == "slice"]
    if slices:
        names = ", ".join(f"%{i.name}" for i in slices)
        srcs = ", ".join(sorted({f"%{i.operands[0].name}" for i in slices}))
        note += (f"; the slices {names} of {srcs} are read in place through strides (no "
                 "copy kernel writes them)")
    repeats = [(i, r) for i in m.members if i.opcode != "slice" and i.operands
               and i.operands[0] in m.members and (r := head_repeat(i)) is not None]
    for inst, (_, group) in repeats:
        note += (f"; %{inst.name} repeats each head of %{inst.operands[0].operands[0].name} "
                 f"{group} times: the kernel reads the shared heads in place (no copy)")
    return note


def _window_note(steps: list, backward: bool = False) -> str:
    """What the explanation says about a recognized band mask (a sliding window): the
    kernels test it themselves (no mask operand) and skip the key blocks outside it."""
    from .attention import band_text, merged_band
    causal = [s for s in steps if s.kind == "causal"]
    # several selects (a causal one, then a window one): the band the kernels apply
    c = (merged_band(causal) or causal[0]) if causal else None
    if c is None or c.window is None:
        return ""
    blocks = "key blocks (query blocks for dK/dV)" if backward else "key blocks"
    return (f"; {band_text(c)}: the mask's compares are recognized as a band of q - k that "
            f"the kernels test themselves (no mask operand), skipping the {blocks} outside "
            "it on both sides")


def find_attention(instructions: list[Instruction], report=None, backward: bool = False
                   ) -> list:
    """Attention matches (AttentionMatch, and with ``backward`` BackwardMatch too)."""
    found, missed = _find(list(instructions), backward)
    if report is not None:
        from .explain import FusionDecision
        for inst, why in missed:
            report.record(FusionDecision(inst.name, "-", False, "attention",
                                         f"no flash-attention fusion: {why}",
                                         computation=inst.parent.name if inst.parent else ""))
    return found


def form_attention_group(state, m: AttentionMatch, report=None):
    """Merge the match's instructions into one attention group (they are all fusible and
    still on their own: attention goes first)."""
    from .explain import FusionDecision
    groups = _unique_groups(state.group_of(i) for i in m.members)
    apart = sum(state.node_estimate(g).time_us for g in groups)
    g = state.merge_many(groups, "attention")
    if isinstance(m, AttentionMatch):
        g.config = backend_config(m)
    else:
        from .attention_grad import backend_config as backward_config
        g.config = backward_config(m)
        if m.o_value is not None:
            g.reads = [m.o_value]
    if report is not None:
        est = state.node_estimate(g).time_us
        why = reason_for(m)
        for i in m.members:
            for o in i.operands:
                if o in g:
                    report.record(FusionDecision(o.name, i.name, True, "attention", why,
                                                 apart, est, state.comp.name))
    return g


def _unique_groups(groups) -> list:
    out, seen = [], set()
    for g in groups:
        if g is not None and g.id not in seen:
            seen.add(g.id)
            out.append(g)
    return out
