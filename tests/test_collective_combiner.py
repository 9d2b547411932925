"""all-reduce-combiner: which all-reduces merge, the thresholds, the order it leaves, and
the data-parallel step of benchmarks/spmd_report.py partitioned to one gradient all-reduce
that still matches jax.jit on 8 simulated devices."""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

import hlo
import passes
from hlo.evaluator.collectives import simulate
from passes.collective_combiner import AllReduceCombiner
from passes.pipelines import SIMPLIFY
from passes.spmd import collective_stats
from runtime.spmd import compile_spmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ADD = """
%add (add_a: f32[], add_b: f32[]) -> f32[] {
  %add_a = f32[] parameter(0)
  %add_b = f32[] parameter(1)
  ROOT %add_r = f32[] add(%add_a, %add_b)
}
"""
# The same reduction as %add, written by someone else (names and parameter order differ).
SUM = """
%sum (sum_p: f32[], sum_q: f32[]) -> f32[] {
  %sum_p = f32[] parameter(0)
  %sum_q = f32[] parameter(1)
  ROOT %sum_r = f32[] add(%sum_q, %sum_p)
}
"""
MAX = """
%max (max_a: f32[], max_b: f32[]) -> f32[] {
  %max_a = f32[] parameter(0)
  %max_b = f32[] parameter(1)
  ROOT %max_r = f32[] maximum(%max_a, %max_b)
}
"""
ADD_S32 = """
%add_s32 (adds_a: s32[], adds_b: s32[]) -> s32[] {
  %adds_a = s32[] parameter(0)
  %adds_b = s32[] parameter(1)
  ROOT %adds_r = s32[] add(%adds_a, %adds_b)
}
"""
GROUPS = "channel_id={c}, replica_groups={{{{0,1,2,3}}}}, use_global_device_ids=true"


def _module(body: str, params: str, result: str, scheduled: bool = False,
            comps: str = ADD) -> hlo.Module:
    head = "HloModule m, num_partitions=4" + (", is_scheduled=true" if scheduled else "")
    return hlo.parse_hlo(f"{head}\n{comps}\nENTRY %main ({params}) -> {result} {{\n"
                         f"{body}\n}}\n")


def _all_reduces(m: hlo.Module) -> list[hlo.Instruction]:
    return [i for i in m.entry.instructions if i.opcode == "all-reduce"]


def _combine(m: hlo.Module, **options) -> bool:
    changed = AllReduceCombiner(**options).run(m)
    hlo.verify(m)
    return changed


def _run4(m: hlo.Module, per_device: list[list[np.ndarray]]) -> list:
    return simulate(m, per_device, 1, 4, timeout=10)


def _check_order(comp: hlo.Computation) -> None:
    """Every operand and control predecessor comes before its user in the list."""
    seen: set[int] = set()
    for i in comp.instructions:
        assert all(id(o) in seen for o in i.operands + i.control_predecessors), i.name
        seen.add(id(i))


# --- which all-reduces combine ------------------------------------------------------------
FOUR_INDEPENDENT = f"""
  %x = f32[8] parameter(0)
  %y = f32[2,3] parameter(1)
  %z = f32[] parameter(2)
  %ax = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %ay = f32[2,3] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%sum
  %az = f32[] all-reduce(%z), {GROUPS.format(c=3)}, to_apply=%add
  %nz = f32[] negate(%z)
  %anz = f32[] all-reduce(%nz), {GROUPS.format(c=4)}, to_apply=%add
  ROOT %t = (f32[8], f32[2,3], f32[], f32[]) tuple(%ax, %ay, %az, %anz)"""
FOUR_PARAMS = "x: f32[8], y: f32[2,3], z: f32[]"
FOUR_RESULT = "(f32[8], f32[2,3], f32[], f32[])"


def _four_args(seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(np.float32) for s in [(8,), (2, 3), ()]]
            for _ in range(4)]


def test_independent_all_reduces_become_one_variadic_all_reduce_with_the_same_results():
    m = _module(FOUR_INDEPENDENT, FOUR_PARAMS, FOUR_RESULT, comps=ADD + SUM)
    args = _four_args()
    before = _run4(m, args)
    assert collective_stats(m) == {"all-reduce": (4, 4 * (8 + 6 + 1 + 1))}
    assert _combine(m)
    (ar,) = _all_reduces(m)
    assert [o.name for o in ar.operands] == ["x", "y", "z", "nz"]
    assert str(ar.shape) == "(f32[8], f32[2,3], f32[], f32[])"
    # The first member's channel id and reducer; the one the %sum member used is gone.
    assert ar.attrs["channel_id"] == 1 and ar.attrs["to_apply"].name == "add"
    assert [c.name for c in m.computations] == ["add", "main"]
    assert collective_stats(m) == {"all-reduce": (1, 4 * 16)}
    assert [str(o) for o in m.entry.root.operands] == [
        f"%get_tuple_element{s} = {t} get-tuple-element(%all_reduce), index={k}"
        for k, (s, t) in enumerate([("", "f32[8]"), (".1", "f32[2,3]"), (".2", "f32[]"),
                                    (".3", "f32[]")])]
    after = _run4(m, args)
    total = [sum(a[k] for a in args) for k in range(3)]
    for dev in range(4):
        for got, want in zip(after[dev], [*total, -total[2]]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        for got, old in zip(after[dev], before[dev]):
            np.testing.assert_array_equal(got, old)
    assert not _combine(m)                  # a fixed point: nothing left to merge


def test_a_chain_all_reduce_add_all_reduce_is_not_combined():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %s = f32[8] add(%a1, %y)
  %a2 = f32[8] all-reduce(%s), {GROUPS.format(c=2)}, to_apply=%add
  ROOT %t = (f32[8], f32[8]) tuple(%a1, %a2)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8])")
    text = m.to_text()
    assert not _combine(m)
    assert m.to_text() == text
    # Through a control edge only, the second waits for the first just the same.
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %a2 = f32[8] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add, control-predecessors={{%a1}}
  ROOT %t = (f32[8], f32[8]) tuple(%a1, %a2)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8])")
    assert not _combine(m)


def test_a_dependent_all_reduce_ends_the_group_and_starts_the_next_one():
    # %a3 reads %a1 (through %s); %a2 is independent of both: {a1, a2} and then {a3, a4}.
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %a2 = f32[8] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add
  %s = f32[8] add(%a1, %y)
  %a3 = f32[8] all-reduce(%s), {GROUPS.format(c=3)}, to_apply=%add
  %n = f32[8] negate(%y)
  %a4 = f32[8] all-reduce(%n), {GROUPS.format(c=4)}, to_apply=%add
  ROOT %t = (f32[8], f32[8], f32[8], f32[8]) tuple(%a1, %a2, %a3, %a4)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8], f32[8], f32[8])")
    rng = np.random.default_rng(3)
    args = [[rng.standard_normal(8).astype(np.float32) for _ in range(2)] for _ in range(4)]
    assert _combine(m)
    ars = _all_reduces(m)
    assert [[o.name for o in a.operands] for a in ars] == [["x", "y"], ["s", "n"]]
    assert [a.attrs["channel_id"] for a in ars] == [1, 3]       # still unique
    _check_order(m.entry)
    X, Y = (sum(a[k] for a in args) for k in range(2))
    want = [X, Y, 4 * X + Y, -Y]            # each device adds the reduced X to its own y
    for got in _run4(m, args):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


G4 = GROUPS.format(c=2)


@pytest.mark.parametrize("second,why", [
    (("all-reduce(%y), channel_id=2, replica_groups={{0,1},{2,3}}, "
      "use_global_device_ids=true, to_apply=%add"), "other replica groups"),
    ("all-reduce(%y), replica_groups={{0,1,2,3}}, to_apply=%add", "no channel_id"),
    ("all-reduce(%y), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add",
     "use_global_device_ids differs"),
    (f"all-reduce(%y), {G4}, to_apply=%max", "maximum, not add"),
    (f'all-reduce(%y), {G4}, to_apply=%add, frontend_attributes={{_xla_stream="1"}}',
     "other frontend attributes"),
])
def test_incompatible_all_reduces_stay_apart(second, why):
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %a2 = f32[8] {second}
  ROOT %t = (f32[8], f32[8]) tuple(%a1, %a2)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8])", comps=ADD + MAX)
    assert not _combine(m), why
    assert len(_all_reduces(m)) == 2


def test_element_types_are_not_mixed_as_in_xla():
    body = f"""
  %x = f32[8] parameter(0)
  %i = s32[8] parameter(1)
  %y = f32[4] parameter(2)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %a2 = s32[8] all-reduce(%i), {GROUPS.format(c=2)}, to_apply=%add_s32
  %a3 = f32[4] all-reduce(%y), {GROUPS.format(c=3)}, to_apply=%add
  ROOT %t = (f32[8], s32[8], f32[4]) tuple(%a1, %a2, %a3)"""
    m = _module(body, "x: f32[8], i: s32[8], y: f32[4]", "(f32[8], s32[8], f32[4])",
                comps=ADD + ADD_S32)
    assert _combine(m)
    assert sorted(str(a.shape) for a in _all_reduces(m)) == ["(f32[8], f32[4])", "s32[8]"]


def test_replica_groups_compare_by_the_devices_they_name():
    body = """
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
  %a2 = f32[8] all-reduce(%y), channel_id=2, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[8], f32[8]) tuple(%a1, %a2)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8])")
    assert _combine(m)
    (ar,) = _all_reduces(m)
    assert "replica_groups=[2,2]<=[4]" in ar.to_text()
    args = [[np.full(8, d, np.float32), np.full(8, 10 * d, np.float32)] for d in range(4)]
    for d, got in enumerate(_run4(m, args)):
        pair = (0 + 1) if d < 2 else (2 + 3)
        np.testing.assert_array_equal(got[0], np.full(8, pair, np.float32))
        np.testing.assert_array_equal(got[1], np.full(8, 10 * pair, np.float32))


def test_layout_constrained_all_reduce_leaves_the_module_alone():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, constrain_layout=true, to_apply=%add
  %a2 = f32[8] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add
  %a3 = f32[8] all-reduce(%y), {GROUPS.format(c=3)}, to_apply=%add
  ROOT %t = (f32[8], f32[8], f32[8]) tuple(%a1, %a2, %a3)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8], f32[8])")
    assert not _combine(m)


# --- thresholds -------------------------------------------------------------------------
def _n_independent(n: int, size: int = 8) -> hlo.Module:
    params = ", ".join(f"p{k}: f32[{size}]" for k in range(n))
    lines = [f"  %p{k} = f32[{size}] parameter({k})" for k in range(n)]
    lines += [f"  %a{k} = f32[{size}] all-reduce(%p{k}), {GROUPS.format(c=k + 1)}, to_apply=%add"
              for k in range(n)]
    lines.append(f"  ROOT %t = ({', '.join([f'f32[{size}]'] * n)}) tuple("
                 + ", ".join(f"%a{k}" for k in range(n)) + ")")
    return _module("\n".join(lines), params, f"({', '.join([f'f32[{size}]'] * n)})")


def _groups(m: hlo.Module) -> list[list[str]]:
    return [[o.name for o in a.operands] for a in _all_reduces(m)]


@pytest.mark.parametrize("spec,groups", [
    ("all-reduce-combiner", [["p0", "p1", "p2", "p3", "p4"]]),
    # 32 bytes each: at most two fit under 64 bytes.
    ("all-reduce-combiner{threshold_bytes=64}", [["p0", "p1"], ["p2", "p3"], ["p4"]]),
    ("all-reduce-combiner{threshold_bytes=95}", [["p0", "p1"], ["p2", "p3"], ["p4"]]),
    ("all-reduce-combiner{threshold_bytes=96}", [["p0", "p1", "p2"], ["p3", "p4"]]),
    ("all-reduce-combiner{threshold_count=3}", [["p0", "p1", "p2"], ["p3", "p4"]]),
    ("all-reduce-combiner{threshold_count=1}", [[f"p{k}"] for k in range(5)]),
    ("all-reduce-combiner{threshold_bytes=31}", [[f"p{k}"] for k in range(5)]),
    ("all-reduce-combiner{threshold_bytes=0}", [[f"p{k}"] for k in range(5)]),
])
def test_thresholds_bound_each_combined_all_reduce(spec, groups):
    m = _n_independent(5)
    passes.run_pipeline(m, spec, verify=True)
    assert _groups(m) == groups
    assert [a.attrs["channel_id"] for a in _all_reduces(m)] == [int(g[0][1:]) + 1 for g in groups]


def test_an_all_reduce_over_the_byte_threshold_stays_alone_and_the_rest_combine():
    m = _module(f"""
  %x = f32[8] parameter(0)
  %big = f32[64] parameter(1)
  %y = f32[8] parameter(2)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %a2 = f32[64] all-reduce(%big), {GROUPS.format(c=2)}, to_apply=%add
  %a3 = f32[8] all-reduce(%y), {GROUPS.format(c=3)}, to_apply=%add
  ROOT %t = (f32[8], f32[64], f32[8]) tuple(%a1, %a2, %a3)""",
                "x: f32[8], big: f32[64], y: f32[8]", "(f32[8], f32[64], f32[8])")
    assert _combine(m, threshold_bytes=128)
    assert sorted(_groups(m)) == [["big"], ["x", "y"]]


# --- order, schedules, control edges, shardings, text -----------------------------------------
def test_readers_between_members_move_after_the_combined_op_in_a_scheduled_module():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add
  %r = f32[8] negate(%a1)
  %u = f32[8] exponential(%y)
  %a2 = f32[8] all-reduce(%u), {GROUPS.format(c=2)}, to_apply=%add
  %w = f32[8] add(%r, %a2)
  ROOT %t = (f32[8], f32[8]) tuple(%w, %r)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8])", scheduled=True)
    assert _combine(m)
    assert m.is_scheduled
    assert [i.name for i in m.entry.instructions] == [
        "x", "y", "u", "all_reduce", "get_tuple_element", "get_tuple_element.1", "r", "w", "t"]
    _check_order(m.entry)


def test_control_edges_move_to_the_combined_op():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %e = f32[8] exponential(%y)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add, control-predecessors={{%e}}
  %a2 = f32[8] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add
  %n = f32[8] negate(%x), control-predecessors={{%a2}}
  ROOT %t = (f32[8], f32[8], f32[8]) tuple(%a1, %a2, %n)"""
    m = _module(body, "x: f32[8], y: f32[8]", "(f32[8], f32[8], f32[8])")
    assert _combine(m)
    (ar,) = _all_reduces(m)
    assert [p.name for p in ar.control_predecessors] == ["e"]
    assert [p.name for p in m.entry.get("n").control_predecessors] == ["all_reduce"]
    _check_order(m.entry)
    assert hlo.parse_hlo(m.to_text()).to_text() == m.to_text()


def test_text_round_trip_keeps_shardings_metadata_and_the_tuple_result():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[2,2] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add, sharding={{replicated}}, metadata={{op_name="g"}}
  %a2 = f32[2,2] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add, sharding={{replicated}}, metadata={{op_name="g"}}
  ROOT %t = (f32[8], f32[2,2]) tuple(%a1, %a2), sharding={{{{replicated}}, {{replicated}}}}"""
    m = _module(body, "x: f32[8], y: f32[2,2]", "(f32[8], f32[2,2])")
    assert _combine(m)
    (ar,) = _all_reduces(m)
    line = ar.to_text()
    assert line == ("%all_reduce = (f32[8], f32[2,2]) all-reduce(%x, %y), channel_id=1, "
                    "replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add, "
                    "sharding={{replicated}, {replicated}}, metadata={op_name=\"g\"}")
    assert [str(o.sharding) for o in m.entry.root.operands] == ["{replicated}"] * 2
    text = m.to_text()
    back = hlo.parse_hlo(text)
    hlo.verify(back)
    assert back.to_text() == text
    (ar2,) = _all_reduces(back)
    assert ar2.shape.is_tuple and len(ar2.operands) == 2


# --- the data-parallel step: three gradient all-reduces become one ------------------------------
def _report():
    if "spmd_report" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "spmd_report", os.path.join(ROOT, "benchmarks", "spmd_report.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["spmd_report"] = mod   # dataclasses look their module up here
        spec.loader.exec_module(mod)
    return sys.modules["spmd_report"]


def test_data_parallel_step_has_one_gradient_all_reduce_and_matches_jax_jit():
    import jax
    rep = _report()
    f, args = rep.dp_train_step()
    module = hlo.from_jax(f, *args)
    # Before: the partitioner's three all-reduces (loss, grad b, grad w).
    uncombined = module.clone()
    passes.run_pipeline(uncombined, f"sharding-propagation,spmd-partitioner,{SIMPLIFY}",
                        verify=True)
    nbytes = 4 * (1 + 8 + 16 * 8)
    assert collective_stats(uncombined) == {"all-reduce": (3, nbytes)}
    # After (runtime.spmd's pipeline runs the combiner, then makes the collectives
    # asynchronous): one, same bytes, as XLA.
    exe = compile_spmd(module)
    assert ",all-reduce-combiner,async-collective-creator," in exe.pipeline
    assert collective_stats(exe.module) == {"all-reduce": (1, nbytes)}
    (ar,) = [i for i in exe.module.entry.instructions if i.opcode == "all-reduce-start"]
    assert sorted(str(s) for s in ar.shape.elements) == ["f32[8,16]{1,0}", "f32[8]{0}", "f32[]"]
    xla = rep.xla_compiled_module(f, args)
    assert collective_stats(xla) == {"all-reduce": (1, nbytes)}
    assert rep.all_reduce_operands(xla) == rep.all_reduce_operands(exe.module) == 3
    ours = exe.execute_arrays(args)
    ref = [np.asarray(r) for r in jax.tree_util.tree_leaves(f(*args))]
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert hlo.parse_hlo(exe.module.to_text()).to_text() == exe.module.to_text()


def test_a_combined_root_keeps_its_sharding_on_the_get_tuple_element():
    body = f"""
  %x = f32[8] parameter(0)
  %y = f32[8] parameter(1)
  %a1 = f32[8] all-reduce(%x), {GROUPS.format(c=1)}, to_apply=%add, sharding={{replicated}}
  %n = f32[8] negate(%a1)
  ROOT %a2 = f32[8] all-reduce(%y), {GROUPS.format(c=2)}, to_apply=%add, sharding={{replicated}}"""
    m = _module(body, "x: f32[8], y: f32[8]", "f32[8]")
    assert _combine(m)
    root = m.entry.root
    assert root.opcode == "get-tuple-element" and root.attrs["index"] == 1
    assert str(root.sharding) == "{replicated}"
    args = [[np.full(8, d, np.float32), np.full(8, 2 * d, np.float32)] for d in range(4)]
    for got in _run4(m, args):
        np.testing.assert_array_equal(got, np.full(8, 12, np.float32))
