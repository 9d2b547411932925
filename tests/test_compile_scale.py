"""Shortcuts that keep compile steps linear in the program (issue 13) give what the plain
walks gave: post orders, buffer sets of wide tuples, the scheduler's reads."""
from __future__ import annotations

import random

import numpy as np
import pytest

import hlo
from passes.dataflow import Dataflow
from passes.scheduling import MemoryModel

CHAIN = """\
HloModule c
ENTRY main {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] add(p, q)
  b = f32[4] multiply(a, p)
  n = f32[4] negate(q), control-predecessors={b}
  c = f32[4] subtract(b, n)
  ROOT t = (f32[4], f32[4], f32[4], f32[4]) tuple(c, a, c, p)
}
"""


def _walk(comp: hlo.Computation) -> list[hlo.Instruction]:
    """Depth first from each instruction in list order, operands then control
    predecessors in order: the post order as computed before its shortcut."""
    seen: set[int] = set()
    order: list[hlo.Instruction] = []

    def visit(inst: hlo.Instruction) -> None:
        if id(inst) in seen:
            return
        seen.add(id(inst))
        for o in inst.operands + inst.control_predecessors:
            visit(o)
        order.append(inst)
    for i in comp.instructions:
        visit(i)
    return order


def test_post_order_of_a_list_in_order_is_the_list():
    m = hlo.parse_hlo(CHAIN)
    comp = m.entry
    names = [i.name for i in comp.instructions]
    got = comp.post_order()
    assert [i.name for i in got] == names == [i.name for i in _walk(comp)]
    assert got is not comp.instructions          # a new list: callers assign it back


@pytest.mark.parametrize("seed", range(6))
def test_post_order_of_any_list_is_the_walks(seed):
    """Shuffled lists (operands and control predecessors after their users) take the walk;
    its order depends on the list's, so the shortcut must not apply to them."""
    m = hlo.parse_hlo(CHAIN)
    comp = m.entry
    random.Random(seed).shuffle(comp.instructions)
    want = [i.name for i in _walk(comp)]
    assert [i.name for i in comp.post_order()] == want
    # n's control predecessor b comes first in every post order
    assert want.index("b") < want.index("n")


def test_post_order_with_an_operand_outside_the_list_walks_to_it():
    """An instruction the list lacks (a caller removed it from the list only) is still
    reached through its user, as the walk always did."""
    m = hlo.parse_hlo(CHAIN)
    comp = m.entry
    a = comp.get("a")
    comp.instructions.remove(a)
    got = [i.name for i in comp.post_order()]
    assert got == [i.name for i in _walk(comp)]
    assert got.index("a") < got.index("b") and len(got) == len(comp.instructions) + 1


def test_sets_of_a_wide_tuple_in_leaf_order_once_each():
    m = hlo.parse_hlo(CHAIN)
    flow = Dataflow(m)
    root = m.entry.root
    sets = flow.sets_of(root)
    # leaves c, a, c, p: three distinct buffers, in the order of their first leaf
    assert sets == [flow.buffer_set(m.entry.get(x)) for x in ("c", "a", "p")]


def test_memory_model_reads_each_set_once_in_operand_order():
    m = hlo.parse_hlo(CHAIN)
    flow = Dataflow(m)
    model = MemoryModel(m.entry, flow)
    root = m.entry.root
    assert [bs.id for bs in model.reads[root.uid]] == [bs.id for bs in flow.sets_of(root)]
    b = m.entry.get("b")
    assert [bs.id for bs in model.reads[b.uid]] == \
        [flow.buffer_set(m.entry.get("a")).id, flow.buffer_set(m.entry.get("p")).id]


def test_wide_optimizer_step_post_order_and_sets_match_the_walks():
    """An optimizer step over 40 arrays as JAX gives it (the entry's root a tuple of 80)."""
    import jax.numpy as jnp

    def step(ps, gs):
        return [p - 0.1 * g / (jnp.abs(g) + 1.0) for p, g in zip(ps, gs)], list(gs)
    args = [[np.ones((n % 7 + 1,), np.float32) for n in range(40)] for _ in range(2)]
    m = hlo.from_jax(step, *args)
    for comp in m.computations:
        assert comp.post_order() == _walk(comp)
    flow = Dataflow(m)
    root = m.entry.root
    want = []
    for _, bs in flow.positions(root):
        if bs not in want:
            want.append(bs)
    assert flow.sets_of(root) == want and len(want) == 80
