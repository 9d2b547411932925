"""Dataflow, schedulers, heap simulator, buffer assignment and the arena executable."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
import runtime
from passes.buffer_assignment import assign_buffers
from passes.dataflow import Dataflow, format_input_output_alias, parse_input_output_alias
from passes.heap_simulator import HeapBuffer, best_fit, check_packing, lower_bound, simulate
from passes.scheduling import (MemoryModel, Schedule, dfs_schedule, list_schedule,
                               post_order_schedule, schedule_module)
from runtime.executable import CpuExecutable


def scheduled(text: str) -> hlo.Module:
    m = hlo.parse_hlo(text)
    Schedule().run(m)
    hlo.verify(m)
    return m


# --- dataflow ---------------------------------------------------------------------------------
TUPLES = """\
HloModule t
ENTRY main {
  p = f32[4] parameter(0)
  n = f32[4] negate(p)
  e = f32[4] exponential(p)
  t = (f32[4], f32[4]) tuple(n, e)
  g = f32[4] get-tuple-element(t), index=1
  b = f32[2,2] bitcast(g)
  ROOT r = f32[2,2] add(b, b)
}
"""


def test_tuples_gte_bitcast_share_buffers():
    m = hlo.parse_hlo(TUPLES)
    flow = Dataflow(m)
    e, t, g, b, n = (m.entry.get(x) for x in ("e", "t", "g", "b", "n"))
    assert flow.buffer_set(t, (1,)) is flow.buffer_set(e) is flow.buffer_set(g) is flow.buffer_set(b)
    assert flow.buffer_set(t, (0,)) is flow.buffer_set(n)
    assert flow.buffer_set(n) is not flow.buffer_set(e)
    # p, n, e, r: four buffers (the tuple's leaves are n's and e's)
    assert len(flow.sets) == 4


WHILE = """\
HloModule w
cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  c = s32[] constant(3)
  ROOT lt = pred[] compare(i, c), direction=LT
}
body {
  bs = (s32[], f32[4]) parameter(0)
  bi = s32[] get-tuple-element(bs), index=0
  x = f32[4] get-tuple-element(bs), index=1
  one = s32[] constant(1)
  i2 = s32[] add(bi, one)
  x2 = f32[4] add(x, x)
  ROOT r = (s32[], f32[4]) tuple(i2, x2)
}
ENTRY main {
  p = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, p)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(w), index=1
}
"""


def test_while_state_is_one_buffer_per_leaf_and_copies_are_inserted():
    m = scheduled(WHILE)
    flow = Dataflow(m)
    w = next(i for i in m.entry.instructions if i.opcode == "while")
    body, cond = w.attrs["body"], w.attrs["condition"]
    for leaf in ((0,), (1,)):
        s = flow.buffer_set(w, leaf)
        assert flow.buffer_set(body.parameters[0], leaf) is s
        assert flow.buffer_set(body.root, leaf) is s
        assert flow.buffer_set(cond.parameters[0], leaf) is s
        assert flow.buffer_set(w.operands[0], leaf) is s
    # The init may not be the entry parameter nor the constant: both were copied.
    init = w.operands[0]
    assert [o.opcode for o in init.operands] == ["copy", "copy"]
    # The entry result is the loop state (no extra copy: it belongs to the loop).
    assert flow.buffer_set(m.entry.root) is flow.buffer_set(w, (1,))
    got = CpuExecutable.build(m, poison=True).run([np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(got[0], np.arange(4, dtype=np.float32) * 8)


def test_rotating_loop_state_is_copied_through_temporaries():
    def f(a, b, c):
        def body(i, s):
            x, y, z = s
            return (y, z, x + 1.0)
        return jax.lax.fori_loop(0, 4, body, (a, b, c))
    args = [np.full(3, k, np.float32) for k in (1, 2, 3)]
    got = runtime.jit(f, poison=True)(*args)
    want = jax.jit(f)(*args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


COND = """\
HloModule c
t_br {
  ta = f32[4] parameter(0)
  ROOT tn = f32[4] negate(ta)
}
f_br {
  a = f32[4] parameter(0)
  ROOT same = f32[4] copy(a)
}
ENTRY main {
  p = pred[] parameter(0)
  x = f32[4] parameter(1)
  ROOT c = f32[4] conditional(p, x, x), true_computation=t_br, false_computation=f_br
}
"""


def test_conditional_branch_roots_share_the_result_buffer():
    m = scheduled(COND)
    flow = Dataflow(m)
    c = m.entry.root
    s = flow.buffer_set(c)
    for b in (c.attrs["true_computation"], c.attrs["false_computation"]):
        assert flow.buffer_set(b.root) is s
        assert flow.buffer_set(b.parameters[0]) is flow.buffer_set(m.entry.parameters[1])
    exe = CpuExecutable.build(m, poison=True)
    x = np.array([1, -2, 3, 4], np.float32)
    np.testing.assert_array_equal(exe.run([np.bool_(True), x])[0], -x)
    np.testing.assert_array_equal(exe.run([np.bool_(False), x])[0], x)


DUS = """\
HloModule d
ENTRY main {
  p = f32[8] parameter(0)
  u = f32[2] parameter(1)
  i = s32[] parameter(2)
  e = f32[8] exponential(p)
  d = f32[8] dynamic-update-slice(e, u, i)
  ROOT r = f32[8] negate(d)
}
"""


def test_in_place_dynamic_update_slice_and_elementwise_share():
    m = scheduled(DUS)
    ba = assign_buffers(m)
    e, d, r = (m.entry.get(x) for x in ("e", "d", "r"))
    # e dies at d, d dies at r: all three are one buffer, the output's.
    assert ba.buffer(e) is ba.buffer(d) is ba.buffer(r)
    assert ba.buffer(r).kind == "output"
    assert ("d", "e") in ba.shared_in_place and ("r", "d") in ba.shared_in_place
    assert ba.temp_size == 0
    p = np.linspace(0, 1, 8, dtype=np.float32)
    u = np.array([5, 6], np.float32)
    got = CpuExecutable(m, ba, poison=True).run([p, u, np.int32(3)])[0]
    want = np.exp(p)
    want[3:5] = u
    np.testing.assert_allclose(got, -want, rtol=1e-6)


def test_no_in_place_sharing_when_the_operand_lives_on():
    m = scheduled(DUS.replace("ROOT r = f32[8] negate(d)",
                              "n = f32[8] negate(d)\n  ROOT r = (f32[8], f32[8]) tuple(n, e)"))
    ba = assign_buffers(m)
    e, d = m.entry.get("e"), m.entry.get("d")
    assert ba.buffer(e) is not ba.buffer(d)


# --- schedulers -------------------------------------------------------------------------------
# Two independent chains off one parameter, each with a 4 KiB and a 400 B temporary.
# Interleaving keeps both big temporaries live at once; finishing one chain first does not.
CHAINS = """\
HloModule chains
ENTRY main {
  p = f32[10] parameter(0)
  a1 = f32[1000] broadcast(p), dimensions={}
  b1 = f32[1000] broadcast(p), dimensions={}
  a2 = f32[100] slice(a1), slice={[0:100]}
  b2 = f32[100] slice(b1), slice={[0:100]}
  a3 = f32[] reduce(a2, z), dimensions={0}, to_apply=sum
  b3 = f32[] reduce(b2, z), dimensions={0}, to_apply=sum
  z = f32[] constant(0)
  ROOT r = (f32[], f32[]) tuple(a3, b3)
}
"""


def _chains() -> hlo.Module:
    text = CHAINS.replace("f32[10] parameter(0)", "f32[] parameter(0)").replace(
        "HloModule chains\n", "HloModule chains\nsum {\n  x = f32[] parameter(0)\n"
        "  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n")
    # z must come before its users in text order for the parser's single pass.
    text = text.replace("  z = f32[] constant(0)\n", "").replace(
        "  a1 =", "  z = f32[] constant(0)\n  a1 =")
    return hlo.parse_hlo(text)


def test_each_scheduler_peak_by_hand():
    m = _chains()
    flow = Dataflow(m)
    model = MemoryModel(m.entry, flow)
    # Live bytes: p 4 + z 4 + outputs a3, b3 (4 each, pinned) are small; the big ones:
    # interleaved (post-order of the text order a1,b1,a2,b2,...): a1+b1 live = 8000,
    # then + a2 (400) while a1 is read by a2 -> 8400 + 4 (p) + 4 (z).
    post = post_order_schedule(m.entry, model)
    assert [i.name for i in post][:4] == ["p", "z", "a1", "b1"]
    assert model.peak(post) == 4 + 4 + 4000 + 4000 + 400
    # DFS and list finish one chain first: peak = p + z + the first chain's result (4 B,
    # an output, live to the end) + the second chain's a1 + a2.
    for sched in (dfs_schedule, list_schedule):
        order = sched(m.entry, model)
        assert model.peak(order) == 4 + 4 + 4 + 4000 + 400, sched.__name__
    chosen = schedule_module(m)
    assert chosen["main"][1] == 4412 and chosen["main"][0] in ("dfs", "list")
    assert m.is_scheduled and m.to_text().startswith("HloModule chains, is_scheduled=true")


def test_schedules_respect_control_predecessors():
    m = _chains()
    a1, b1 = m.entry.get("a1"), m.entry.get("b1")
    a1.control_predecessors.append(b1)   # b1 must run before a1
    model = MemoryModel(m.entry, Dataflow(m))
    for sched in (post_order_schedule, dfs_schedule, list_schedule):
        order = [i.name for i in sched(m.entry, model)]
        assert order.index("b1") < order.index("a1"), sched.__name__


def _list_schedule_recomputing(comp, model):
    """list_schedule as it was before its priorities were kept (issue 13): every ready
    instruction's priority recomputed at every step."""
    from passes.scheduling import _predecessors, _successors
    succ = _successors(comp)
    waiting = {i.uid: len(_predecessors(i)) for i in comp.instructions}
    left: dict = {}
    for inst in comp.instructions:
        for bs in model.reads[inst.uid]:
            left[bs.id] = left.get(bs.id, 0) + 1
    position = {i.uid: k for k, i in enumerate(comp.instructions)}

    def priority(inst):
        freed = sum(bs.size for bs in model.reads[inst.uid]
                    if left[bs.id] == 1 and bs.id not in model.pinned)
        return (sum(bs.size for bs in model.defines[inst.uid]) - freed, position[inst.uid])
    ready = [i for i in comp.instructions if waiting[i.uid] == 0]
    order = []
    while ready:
        best = min(ready, key=priority)
        ready.remove(best)
        order.append(best)
        for bs in model.reads[best.uid]:
            left[bs.id] -= 1
        for s_ in succ[best.uid]:
            waiting[s_.uid] -= 1
            if waiting[s_.uid] == 0:
                ready.append(s_)
    return order


def _optimizer_step(rng, n: int):
    """A momentum step over ``n`` arrays of random sizes (many ready parameters, buffers
    read by several instructions), imported."""
    import jax.numpy as jnp
    sizes = [int(k) for k in rng.integers(1, 64, n)]

    def step(ps, gs, ms):
        ms = [0.9 * m + 0.1 * g for m, g in zip(ms, gs)]
        return [p - 0.01 * m / (jnp.abs(g) + 1.0) for p, m, g in zip(ps, ms, gs)], ms
    args = [[np.ones((k,), np.float32) for k in sizes] for _ in range(3)]
    return hlo.from_jax(step, *args)


@pytest.mark.parametrize("seed", range(4))
def test_list_schedule_keeps_the_order_of_recomputed_priorities(seed):
    """Kept priorities (dropped when a buffer they read loses a reader) give the schedule
    that recomputing every priority at every step gives: on the chains above and on an
    optimizer-like step (many ready parameters, buffers read by several instructions)."""
    rng = np.random.default_rng(seed)
    for m in (_chains(), _optimizer_step(rng, 12)):
        model = MemoryModel(m.entry, Dataflow(m))
        got = [i.name for i in list_schedule(m.entry, model)]
        assert got == [i.name for i in _list_schedule_recomputing(m.entry, model)]


def _peak_reference(model, order):
    """MemoryModel.peak as it was before its tables (issue 13): sizes from the sets, pinned
    sets counted and skipped at each step."""
    remaining: dict = {}
    for inst in order:
        for bs in model.reads[inst.uid]:
            remaining[bs.id] = remaining.get(bs.id, 0) + 1
    live = peak = 0
    sizes: dict = {}
    for inst in order:
        for bs in model.defines[inst.uid]:
            sizes[bs.id] = bs.size
            live += bs.size
        peak = max(peak, live)
        for bs in model.reads[inst.uid]:
            remaining[bs.id] -= 1
            if remaining[bs.id] == 0 and bs.id not in model.pinned and bs.id in sizes:
                live -= sizes.pop(bs.id)
        for bs in model.defines[inst.uid]:
            if remaining.get(bs.id, 0) == 0 and bs.id not in model.pinned and bs.id in sizes:
                live -= sizes.pop(bs.id)
    return peak


@pytest.mark.parametrize("seed", range(3))
def test_peak_equals_the_reference_on_random_orders(seed):
    """peak() from its per-instruction tables equals the direct count, on every scheduler's
    order and on random topological orders of an optimizer-like step (pinned parameters
    and outputs, buffers read by several instructions, tuple views)."""
    rng = np.random.default_rng(seed)
    m = _optimizer_step(rng, 8)
    model = MemoryModel(m.entry, Dataflow(m))
    orders = [s(m.entry, model) for s in (post_order_schedule, dfs_schedule, list_schedule)]
    for _ in range(5):                      # random topological orders
        waiting = {i.uid: len(set(map(id, i.operands))) for i in m.entry.instructions}
        ready = [i for i in m.entry.instructions if waiting[i.uid] == 0]
        order = []
        while ready:
            inst = ready.pop(int(rng.integers(len(ready))))
            order.append(inst)
            for u in inst.users:
                waiting[u.uid] -= 1
                if waiting[u.uid] == 0:
                    ready.append(u)
        orders.append(order)
    peaks = [model.peak(o) for o in orders]
    assert peaks == [_peak_reference(model, o) for o in orders]
    assert len(set(peaks)) > 1               # the orders differ in peak: the test can fail


# --- heap simulator ---------------------------------------------------------------------------
def test_best_fit_offsets_by_hand():
    bufs = [HeapBuffer("A", 100, 0, 2),   # aligned 128
            HeapBuffer("B", 64, 1, 3),
            HeapBuffer("C", 128, 3, 5),
            HeapBuffer("D", 64, 4, 5)]
    r = best_fit(bufs, "spatial")
    # Biggest first: A (128) and C (128, tie: longer A's range is equal; A starts first) at 0
    # -- A and C do not overlap in time, so both get offset 0; B (live with A and C) goes
    # above them at 128; D (live with C only) fills the gap at 128 (B ends at 3, D starts 4).
    assert r.offsets == {"A": 0, "C": 0, "B": 128, "D": 128}
    assert r.heap_size == 192
    assert lower_bound(bufs) == 192 and not check_packing(bufs, r.offsets)


def test_best_fit_picks_the_smallest_gap_and_simulate_keeps_the_better_order():
    # X (0..9, 64 B) and Y (0..9, 64 B) with a hole between them where Z (1..2) was: best fit
    # puts a small buffer into the smallest hole.
    bufs = [HeapBuffer("big", 256, 0, 1), HeapBuffer("late", 192, 2, 3),
            HeapBuffer("small", 64, 2, 3), HeapBuffer("tiny", 64, 0, 3)]
    r = best_fit(bufs, "spatial")
    assert r.offsets["big"] == 0 and r.offsets["late"] == 0
    assert r.offsets["small"] == 192 and r.offsets["tiny"] == 256
    assert r.heap_size == 320 == lower_bound(bufs)
    both = simulate(bufs)
    assert both.heap_size <= min(best_fit(bufs, "temporal").heap_size, r.heap_size)


def test_best_fit_can_lose_to_the_lower_bound():
    # Fragmentation: at t=0 two 64 B buffers at 0 and 64; at t=1 the first ends and a 128 B
    # buffer needs a contiguous hole: there is none of 128 below 128, so it goes on top.
    bufs = [HeapBuffer("a", 64, 0, 0), HeapBuffer("b", 64, 0, 1), HeapBuffer("c", 128, 1, 1)]
    r = best_fit(bufs, "temporal")
    assert lower_bound(bufs) == 192
    assert r.heap_size >= lower_bound(bufs) and not check_packing(bufs, r.offsets)


# --- buffer assignment and the executable -----------------------------------------------------
def test_buffer_assignment_report_and_timeline():
    m = scheduled(WHILE)
    ba = assign_buffers(m)
    text = ba.to_text()
    assert text.startswith("BufferAssignment:\nallocation 0:")
    assert "parameter 0" in text and "preallocated-temp" in text and "maybe-live-out" in text
    svg = ba._repr_svg_()
    assert svg.startswith("<svg") and "peak" in svg and "</svg>" in svg
    assert ba.temp_size >= ba.lower_bound


def test_output_index_is_the_first_root_leaf_of_each_output_buffer():
    """Each output buffer's index is the first leaf of the root holding one of its sets
    (found from one walk of the root's leaves: issue 13). Copy insertion gives a repeated
    result and a returned parameter buffers of their own; ``n`` and its copy share one by
    in-place sharing, so leaf 1 (not 4) is theirs."""
    m = scheduled("""\
HloModule o
ENTRY main {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  n = f32[4] negate(p)
  e = f32[4] exponential(p)
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(e, n, e, p, n)
}
""")
    ba = assign_buffers(m)
    root = m.entry.root
    assert [ba.buffer(o).output_index for o in root.operands] == [(k,) for k in range(5)]
    assert ba.buffer(m.entry.get("n")).output_index == (1,)
    assert ba.buffer(m.entry.get("p")).output_index is None
    assert ba.buffer(m.entry.get("q")).output_index is None
    # On an optimizer-like step, as the walk of the root for each group found them.
    import jax.numpy as jnp

    def step(ps, gs):
        return [p - 0.1 * g / (jnp.abs(g) + 1.0) for p, g in zip(ps, gs)], list(gs)
    args = [[np.ones((n,), np.float32) for n in (3, 5, 7)] for _ in range(2)]
    m = hlo.from_jax(step, *args)
    Schedule().run(m)
    ba = assign_buffers(m)
    leaves = ba.flow.positions(m.entry.root)
    for b in ba.buffers:
        want = next((ix for ix, s in leaves if s in b.sets), None)
        assert b.output_index == want
    assert sorted(b.output_index for b in ba.buffers if b.output_index is not None) == \
        [(k,) for k in range(len(leaves))]


def test_corrupted_assignment_gives_a_wrong_answer():
    """Two live buffers at the same arena offset must change the result."""
    m = scheduled("""\
HloModule bad
ENTRY main {
  p = f32[16] parameter(0)
  a = f32[16] exponential(p)
  b = f32[16] negate(p)
  c = f32[16] multiply(a, b)
  ROOT r = f32[16] add(c, a)
}
""")
    p = np.linspace(-1, 1, 16, dtype=np.float32)
    want = np.exp(p) * -p + np.exp(p)
    ba = assign_buffers(m)
    np.testing.assert_allclose(CpuExecutable(m, ba, poison=True).run([p])[0], want, rtol=1e-6)
    a, b = ba.buffer(m.entry.get("a")), ba.buffer(m.entry.get("b"))
    assert a.kind == "temp" or b.kind == "temp"
    assert a.interval.overlaps(b.interval)
    # Corrupt: put b where a is (both are live at the multiply).
    b.allocation, b.offset = a.allocation, a.offset
    if a.kind != "temp":
        ba.allocations[a.allocation].size = max(ba.allocations[a.allocation].size, 64)
    got = CpuExecutable(m, ba, poison=True).run([p])[0]
    assert not np.allclose(got, want, rtol=1e-3)


def test_poison_fills_the_arena_with_ff_bytes():
    m = scheduled(TUPLES)
    exe = CpuExecutable.build(m, poison=True)
    mem = exe._memory([np.zeros(4, np.float32)], frozenset())
    temp = exe.assignment.temp_allocation
    assert temp is not None and temp.size > 0
    assert (mem.buffers[temp.index] == 0xFF).all()


def test_memory_analysis_by_hand():
    def f(x, w):
        h = jnp.tanh(x @ w)          # dot (temp 8x16 f32 = 512 B), tanh in place of it
        return h.sum(axis=1), h      # outputs: f32[8] and f32[8,16]
    x = np.ones((8, 4), np.float32)
    w = np.ones((4, 16), np.float32)
    compiled = runtime.jit(f).lower(x, w).compile()
    mem = compiled.memory_analysis()
    assert mem.argument_size_in_bytes == (8 * 4 + 4 * 16) * 4
    assert mem.output_size_in_bytes == (8 + 8 * 16) * 4
    assert mem.alias_size_in_bytes == 0
    # The dot's buffer is taken over by tanh (elementwise, dies there), which is an output:
    # nothing is left in the temp arena.
    assert mem.temp_size_in_bytes == mem.temp_lower_bound_in_bytes
    assert mem.temp_size_in_bytes == 0
    got = compiled(x, w)
    np.testing.assert_allclose(got[1], np.tanh(4.0) * np.ones((8, 16)), rtol=1e-6)


# --- donation ---------------------------------------------------------------------------------
def test_donate_argnums_aliases_and_invalidates_the_buffer():
    def step(params, g):
        return params - 0.1 * g
    jitted = runtime.jit(step, donate_argnums=0)
    p = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = np.ones((2, 3), np.float32)
    compiled = jitted.lower(p, g).compile()
    assert "input_output_alias={ {}: (0, {}, may-alias) }" in compiled.as_text()
    mem = compiled.memory_analysis()
    assert mem.alias_size_in_bytes == 24
    client = compiled.executable.client
    buf = client.buffer_from_pyval(p)
    out = compiled(buf, g)
    np.testing.assert_allclose(out, p - 0.1, rtol=1e-6)
    with pytest.raises(hlo.HlotkError, match="donated"):
        buf.to_numpy()
    with pytest.raises(hlo.HlotkError, match="donated"):
        compiled(buf, g)
    # numpy arguments are copied in: donating them has no visible effect.
    np.testing.assert_allclose(jitted(p, g), p - 0.1, rtol=1e-6)
    np.testing.assert_array_equal(p, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_input_output_alias_text_round_trips():
    raw = format_input_output_alias({(0,): 1, (1,): 0})
    assert str(raw) == "{ {0}: (1, {}, may-alias), {1}: (0, {}, may-alias) }"
    assert parse_input_output_alias(str(raw)) == {(0,): 1, (1,): 0}
    m = hlo.parse_hlo(TUPLES)
    m.config["input_output_alias"] = raw
    assert hlo.parse_hlo(m.to_text()).to_text() == m.to_text()


# --- the zoo with poison, through the default pipeline ----------------------------------------
from tests.zoo import ZOO, ZooProgram, assert_trees_close, x64_scope  # noqa: E402


@pytest.mark.parametrize("program", ZOO, ids=[p.name for p in ZOO])
def test_zoo_poisoned_arena_matches_jax(program: ZooProgram):
    with x64_scope(program):
        args = program.args()
        want = jax.jit(program.fn)(*args)
        got = runtime.jit(program.fn, pipeline="default", poison=True)(*args)
    assert_trees_close(got, want, program.rtol, program.atol)


def test_dump_report_has_the_buffer_assignment_section(tmp_path):
    c = runtime.client("cpu")
    c.compile(hlo.parse_hlo(TUPLES), dump_dir=str(tmp_path))
    page = (tmp_path / "index.html").read_text()
    assert "<h2>Buffer assignment</h2>" in page and "preallocated-temp" in page
    assert (tmp_path / "memory_timeline.svg").read_text().startswith("<svg")


def test_donated_parameters_alias_the_elements_of_a_multi_output_fusion():
    # An optimizer step: new parameter and new moment come out of one multi-output fusion;
    # both donated inputs take their outputs' buffers (no fresh output allocation).
    def step(p, m, g):
        m2 = 0.9 * m + g
        return p - 0.1 * m2, m2
    p, m, g = (np.full((4, 8), v, np.float32) for v in (1.0, 2.0, 3.0))
    compiled = runtime.jit(step, donate_argnums=(0, 1)).lower(p, m, g).compile()
    root = compiled.module.entry.root
    fused = {o.operands[0].name for o in root.operands if o.opcode == "get-tuple-element"}
    assert fused, "expected a multi-output fusion at the root"
    assignment = compiled.buffer_assignment()
    assert assignment.aliased_outputs == {(0,): 0, (1,): 1}
    assert compiled.memory_analysis().alias_size_in_bytes == 2 * 4 * 8 * 4
    got = compiled(p, m, g)
    np.testing.assert_allclose(got[1], 0.9 * 2 + 3, rtol=1e-6)
    np.testing.assert_allclose(got[0], 1 - 0.1 * (0.9 * 2 + 3), rtol=1e-6)


ROOT_VIEWS = """\
HloModule v
ENTRY main {
  p = f32[4,3] parameter(0)
  pb = f32[4,3,1] bitcast(p)
  e = f32[4,3,1] exponential(pb)
  b1 = f32[4,3] bitcast(e)
  b2 = f32[12] bitcast(p)
  b3 = f32[3,4] bitcast(e)
  ROOT t = (f32[4,3], f32[12], f32[3,4]) tuple(b1, b2, b3)
}
"""


def test_entry_output_that_is_a_bitcast_of_a_fresh_value_owns_it_without_a_copy():
    """An output viewing a value computed here takes that buffer (no copy); a view of a
    parameter, or a value returned twice, is copied (outputs own distinct buffers)."""
    from passes.dataflow import insert_copies
    once = ROOT_VIEWS.replace("(f32[4,3], f32[12], f32[3,4]) tuple(b1, b2, b3)",
                              "(f32[4,3], f32[12]) tuple(b1, b2)")
    for text, copies in ((once, 1), (ROOT_VIEWS, 3)):
        m = hlo.parse_hlo(text)
        insert_copies(m)
        hlo.verify(m)
        assert sum(i.opcode == "copy" for i in m.entry.instructions) == copies, m.to_text()
    m = hlo.parse_hlo(once)
    insert_copies(m)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = hlo.evaluate(m, [x])
    np.testing.assert_allclose(got[0], np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(got[1], x.reshape(12))


def test_a_scans_stacked_output_is_updated_in_place_without_a_state_copy():
    """A scan writes row i of its stacked output each step (dynamic-update-slice of the
    state leaf): the update lands in the state buffer itself, with no state-update copy
    (which moved the whole stack every step); the other readers of the old stack run
    before it, and the poisoned run (temporaries filled with NaN) equals jax.jit."""
    def f(xs, w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h * 2.0
        return jax.lax.scan(step, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((6, 3, 4)).astype(np.float32)
    w = (rng.standard_normal((4, 4)) * 0.3).astype(np.float32)
    c = runtime.jit(f, poison=True).lower(xs, w).compile()
    loop = next(i for i in c.module.entry.instructions if i.opcode == "while")
    body = loop.attrs["body"]
    flow = Dataflow(c.module)
    state = body.parameters[0]
    stacked = [k for k, e in enumerate(body.root.shape.elements) if e.dims == (6, 3, 4)]
    assert stacked
    for k in stacked:
        v = body.root.operands[k]
        assert v.opcode != "copy", v.to_text()
        assert flow.buffer_set(v) is flow.buffer_set(state, (k,))
    for g, want in zip(jax.tree.leaves(c(xs, w)), jax.tree.leaves(jax.jit(f)(xs, w))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-6, atol=1e-6)
