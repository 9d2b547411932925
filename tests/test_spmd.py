"""SPMD: Shardy import, tilings, propagation, the partitioner's collectives, running on
simulated devices, and hlotk vs jax.jit/XLA on four sharded programs."""
from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

import hlo
import passes
from hlo.errors import EvaluationError, HlotkError
from hlo.sharding import Sharding, parse_sharding
from hlo.stablehlo.shardy import Mesh, axes_to_sharding, convert_sharding
from passes.spmd import SpmdError, Tiling, collective_stats
from passes.spmd.tiling import find_iota, replica_groups
from runtime.spmd import compile_spmd, join_array, split_array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report():
    """benchmarks/spmd_report.py (the four programs and the XLA comparison)."""
    import sys
    if "spmd_report" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "spmd_report", os.path.join(ROOT, "benchmarks", "spmd_report.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["spmd_report"] = mod   # dataclasses look their module up here
        spec.loader.exec_module(mod)
    return sys.modules["spmd_report"]


def _partition(text: str) -> hlo.Module:
    m = hlo.parse_hlo(text)
    passes.run_pipeline(m, "sharding-propagation,spmd-partitioner", verify=True)
    return m


def _opcodes(m: hlo.Module) -> list[str]:
    return [i.opcode for i in m.entry.instructions]


# --- Shardy -> HLO shardings ------------------------------------------------------------
MESH = {"mesh": Mesh((("data", 2), ("model", 4)))}


@pytest.mark.parametrize("text,expected", [
    ('#sdy.sharding<@mesh, [{}, {"model"}]>',
     "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"),
    ('#sdy.sharding<@mesh, [{"data"}, {}]>', "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    ('#sdy.sharding<@mesh, [{"data"}, {"model"}]>', "{devices=[2,4]<=[8]}"),
    ('#sdy.sharding<@mesh, [{"model"}, {"data"}]>', "{devices=[4,2]<=[2,4]T(1,0)}"),
    ('#sdy.sharding<@mesh, [{"data", "model"}, {}]>', "{devices=[8,1]<=[8]}"),
    ('#sdy.sharding<@mesh, [{}, {}]>', "{replicated}"),
])
def test_shardy_to_hlo_sharding_prints_as_xla(text, expected):
    assert convert_sharding(text, MESH).to_text() == expected
    # and it parses back to the same tile assignment
    assert parse_sharding(expected) == convert_sharding(text, MESH)


def test_shardy_explicit_device_ids_and_errors():
    mesh = Mesh((("x", 2),), device_ids=(1, 0))
    assert axes_to_sharding(mesh, [[0]]).to_text() == "{devices=[2]1,0}"
    with pytest.raises(HlotkError, match="mesh axis 'nope'"):
        convert_sharding('#sdy.sharding<@mesh, [{"nope"}]>', MESH)
    with pytest.raises(HlotkError, match="no sdy.mesh @other"):
        convert_sharding('#sdy.sharding<@other, [{}]>', MESH)


def test_from_jax_imports_shardy_params_constraint_and_result():
    import jax
    rep = _report()
    f, args = rep.PROGRAMS[0].make()
    m = hlo.from_jax(f, *args)
    params = m.entry.parameters
    assert str(params[0].sharding) == "{replicated}"
    assert str(params[1].sharding) == "{devices=[1,8]<=[8]}"
    assert str(params[2].sharding) == "{devices=[8,1]<=[8]}"
    assert str(m.entry.root.sharding) == "{replicated}"
    assert m.config["num_partitions"] == 8

    mesh = rep._mesh((2, 4), ("data", "model"))

    def g(x):
        return jax.lax.with_sharding_constraint(x * 2, rep._ns(mesh, "model")) + 1
    m = hlo.from_jax(jax.jit(g, in_shardings=rep._ns(mesh, "data")),
                     jax.ShapeDtypeStruct((8, 4), np.float32))
    cc = [i for i in m.entry.instructions if i.opcode == "custom-call"]
    assert [i.attrs["custom_call_target"] for i in cc] == ["Sharding"]
    assert str(cc[0].sharding) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    # Text round trip keeps the shardings.
    assert hlo.parse_hlo(m.to_text()).to_text() == m.to_text()


# --- tilings and replica groups ---------------------------------------------------------
def test_tiling_round_trip_and_local_shape():
    s = parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
    t = Tiling.from_sharding(s, 2, 8)
    assert t.tiles == (1, 4)
    assert t.index[0] == (0, 0) and t.index[1] == (0, 1) and t.index[4] == (0, 0)
    assert t.to_sharding() == s
    assert t.local_dims((6, 8)) == (6, 2)
    # Uneven: 6 over 4 tiles is 2 per device, padded (GSPMD): 2, 2, 2, 0 real elements.
    assert t.local_dims((6, 6)) == (6, 2)
    assert t.padded_dims((6, 6)) == [1]
    assert t.valid_counts((6, 6), 1) == [2, 2, 2, 0, 2, 2, 2, 0]
    with pytest.raises(SpmdError, match="uses 8 devices but the program is partitioned over 4"):
        Tiling.from_sharding(s, 2, 4)


def test_replica_groups_print_in_iota_form_when_possible():
    assert str(replica_groups([[0, 1, 2, 3], [4, 5, 6, 7]])) == "[2,4]<=[8]"
    assert str(replica_groups([[0, 4], [1, 5], [2, 6], [3, 7]])) == "[4,2]<=[2,4]T(1,0)"
    assert str(replica_groups([[0, 3], [1, 2]])) == "{{0,3},{1,2}}"
    assert find_iota((0, 2, 1, 3)) == ((2, 2), (1, 0))


def test_split_and_join_arrays():
    x = np.arange(32).reshape(4, 8)
    s = parse_sharding("{devices=[2,2]<=[2,2]T(1,0)}")   # device d -> tile (d%2, d//2)
    pieces = split_array(x, s, 4)
    np.testing.assert_array_equal(pieces[1], x[2:4, 0:4])
    np.testing.assert_array_equal(join_array(pieces, s, x.shape, 4), x)


# --- propagation ------------------------------------------------------------------------
MLP_TEXT = """
HloModule mlp, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[8,16], w1: f32[16,32], w2: f32[32,16]) -> f32[16] {
  %x = f32[8,16] parameter(0), sharding={replicated}
  %w1 = f32[16,32] parameter(1), sharding={devices=[1,4]<=[4]}
  %w2 = f32[32,16] parameter(2), sharding={devices=[4,1]<=[4]}
  %h = f32[8,32] dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %zero = f32[] constant(0)
  %zeros = f32[8,32] broadcast(%zero), dimensions={}
  %r = f32[8,32] maximum(%h, %zeros)
  %t = f32[32,8] transpose(%r), dimensions={1,0}
  %rt = f32[8,32] transpose(%t), dimensions={1,0}
  %o = f32[8,16] dot(%rt, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %red = f32[16] reduce(%o, %zero), dimensions={0}, to_apply=%add, sharding={replicated}
}
"""


def test_propagation_forward_backward_and_fixed_points():
    m = hlo.parse_hlo(MLP_TEXT)
    passes.run_pipeline(m, "sharding-propagation", verify=True)
    sh = {i.name: str(i.sharding) for i in m.entry.instructions}
    assert sh["h"] == "{devices=[1,4]<=[4]}"            # dot: rhs free dim
    assert sh["zeros"] == "{devices=[1,4]<=[4]}"        # backwards from maximum
    assert sh["t"] == "{devices=[4,1]<=[4]}"            # transpose moves the split
    assert sh["o"] == "{replicated}"                    # contracting split summed away
    assert sh["red"] == "{replicated}" and sh["x"] == "{replicated}"   # annotations kept


def test_megatron_text_partitions_to_one_all_reduce_and_runs():
    m = _partition(MLP_TEXT)
    ops = _opcodes(m)
    assert ops.count("all-reduce") == 1 and "all-gather" not in ops
    ar = next(i for i in m.entry.instructions if i.opcode == "all-reduce")
    assert "replica_groups=[1,4]<=[4]" in ar.to_text() and "channel_id=1" in ar.to_text()
    assert [p.shape.dims for p in m.entry.parameters] == [(8, 16), (16, 8), (8, 16)]
    rng = np.random.default_rng(1)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)])
    exe = compile_spmd(hlo.parse_hlo(MLP_TEXT))
    (out,) = exe.execute_arrays([x, w1, w2])
    np.testing.assert_allclose(out, (np.maximum(x @ w1, 0) @ w2).sum(0), rtol=1e-4, atol=1e-4)


# --- resharding: each collective --------------------------------------------------------
def _reshard_module(src: str, dst: str, shape=(8, 8), n=4) -> str:
    dims = ",".join(map(str, shape))
    return f"""
HloModule r, num_partitions={n}
ENTRY %main (x: f32[{dims}]) -> f32[{dims}] {{
  %x = f32[{dims}] parameter(0), sharding={src}
  ROOT %y = f32[{dims}] negate(%x), sharding={dst}
}}
"""


@pytest.mark.parametrize("src,dst,collective", [
    ("{devices=[4,1]<=[4]}", "{replicated}", "all-gather"),
    ("{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", "all-to-all"),
    ("{devices=[4,1]<=[4]}", "{devices=[4,1]3,2,1,0}", "collective-permute"),
    ("{replicated}", "{devices=[2,2]<=[4]}", None),          # a local dynamic-slice
])
def test_reshard_uses_the_expected_collective_and_is_exact(src, dst, collective):
    text = _reshard_module(src, dst)
    m = _partition(text)
    ops = _opcodes(m)
    present = [c for c in ("all-gather", "all-to-all", "collective-permute", "all-reduce")
               if c in ops]
    assert present == ([collective] if collective else [])
    if collective is None:
        assert "dynamic-slice" in ops and "partition-id" in ops
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    (out,) = compile_spmd(hlo.parse_hlo(text)).execute_arrays([x])
    np.testing.assert_array_equal(out, -x)


def test_partial_sum_becomes_reduce_scatter_when_the_result_is_split():
    text = """
HloModule rs, num_partitions=4
ENTRY %main (a: f32[8,16], b: f32[16,8]) -> f32[8,8] {
  %a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  %b = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT %d = f32[8,8] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
}
"""
    m = _partition(text)
    ops = _opcodes(m)
    assert ops.count("reduce-scatter") == 1 and "all-reduce" not in ops
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    (out,) = compile_spmd(hlo.parse_hlo(text)).execute_arrays([a, b])
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_unsupported_op_runs_on_whole_operands():
    text = """
HloModule sort, num_partitions=2
%lt (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=LT
}
ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0), sharding={devices=[2]<=[2]}
  ROOT %s = f32[8] sort(%x), dimensions={0}, to_apply=%lt, sharding={devices=[2]<=[2]}
}
"""
    x = np.asarray([5, 3, 7, 1, 0, 2, 6, 4], np.float32)
    (out,) = compile_spmd(hlo.parse_hlo(text)).execute_arrays([x])
    np.testing.assert_array_equal(out, np.sort(x))


# --- errors ---------------------------------------------------------------------------------
def test_errors_are_clear_never_hangs():
    with pytest.raises(HlotkError, match=r"sharded over 4 devices \(mesh/num_partitions\) but 8 devices were given"):
        compile_spmd(hlo.parse_hlo(_reshard_module("{replicated}", "{devices=[4,1]<=[4]}")),
                     num_devices=8)
    # A collective whose groups leave a device out: an error naming it, not a hang.
    bad = hlo.parse_hlo("""
HloModule bad, num_partitions=4
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main (x: f32[2]) -> f32[2] {
  %x = f32[2] parameter(0)
  ROOT %r = f32[2] all-reduce(%x), channel_id=1, replica_groups={{0,1},{2}}, use_global_device_ids=true, to_apply=%add
}
""")
    from hlo.evaluator.collectives import simulate
    with pytest.raises(EvaluationError, match="device 3 is in no replica group"):
        simulate(bad, [[np.zeros(2, np.float32)]] * 4, 1, 4, timeout=5)


# --- hlotk vs jax.jit / XLA ------------------------------------------------------------------
@pytest.fixture(scope="module")
def report_rows():
    return {r["name"]: r for r in _report().main(path=os.devnull)}


@pytest.mark.parametrize("name", ["megatron_mlp", "dp_train_step", "transformer_block_2d",
                                  "seq_sharded_reduce", "vocab_mlp_uneven", "scan_layers",
                                  "embedding_lookup", "shard_map_ring", "lm_train_step"])
def test_matches_jax_jit_and_never_more_bytes_than_xla(report_rows, name):
    r = report_rows[name]
    assert r["max_abs_err"] < 1e-4
    ours = sum(b for _, b in r["hlotk"].values())
    xla = sum(b for _, b in r["xla"].values())
    assert 0 < ours <= xla, (r["hlotk"], r["xla"])


def test_top_k_per_row_needs_no_collective(report_rows):
    r = report_rows["top_k_rows"]       # (jax 0.10's XLA all-gathers the rows here)
    assert r["max_abs_err"] == 0 and r["hlotk"] == {}


def test_megatron_forward_has_exactly_one_all_reduce(report_rows):
    assert report_rows["megatron_mlp"]["hlotk"] == {"all-reduce": (1, 16 * 32 * 4)}
    assert report_rows["megatron_mlp"]["xla"] == {"all-reduce": (1, 16 * 32 * 4)}


def test_data_parallel_step_all_reduces_the_gradients(report_rows):
    r = report_rows["dp_train_step"]
    assert set(r["hlotk"]) == {"all-reduce"}
    # Gradients of w (16x8) and b (8) plus the loss: 4 * (128 + 8 + 1) bytes, as XLA.
    assert r["hlotk"]["all-reduce"][1] == 4 * (16 * 8 + 8 + 1) == r["xla"]["all-reduce"][1]


def test_runtime_jit_with_partition_specs_and_mesh():
    import jax
    import runtime
    from jax.sharding import PartitionSpec as P
    rep = _report()
    mesh = rep._mesh((2, 4), ("data", "model"))

    def f(x, w):
        return jax.nn.relu(x @ w).sum(0)
    g = runtime.jit(f, in_shardings=(P("data"), P(None, "model")), out_shardings=P("model"),
                    mesh=mesh)
    x = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)
    w = np.linspace(-1, 1, 16 * 32, dtype=np.float32).reshape(16, 32)
    np.testing.assert_allclose(g(x, w), np.asarray(jax.jit(f)(x, w)), rtol=1e-5, atol=1e-5)
    compiled = g.lower(x, w).compile()
    assert compiled.module.config["num_partitions"] == 8
    assert [p.shape.dims for p in compiled.module.entry.parameters] == [(4, 16), (16, 8)]
    with pytest.raises(HlotkError, match="PartitionSpec: pass mesh"):
        runtime.jit(f, in_shardings=(P("data"), P()))


def test_graph_shows_shardings_on_edges_and_collectives():
    from hlo.render import to_dot
    m = hlo.parse_hlo(MLP_TEXT)
    passes.run_pipeline(m, "sharding-propagation")
    assert "devices=[1,4]<=[4]" in to_dot(m)
    passes.run_pipeline(m, "spmd-partitioner")
    dot = to_dot(m)
    assert "all-reduce" in dot and "#fef08a" in dot   # the collective category colour




def test_the_gpu_pipeline_of_a_partitioned_program_decides_for_its_gpus(monkeypatch):
    """backend="cuda": the partitioned module's CUDA pipeline has fusion decide for the GPUs
    the workers run on (GPU 0's spec), as a one-GPU compile does; no GPU, no target. The
    workers start at the first run, so compiling needs none (Triton's interpreter stands in
    for the GPU count check)."""
    pytest.importorskip("torch")
    import runtime.spmd as spmd
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(spmd, "_gpu_fusion_target", lambda: "a100")
    exe = compile_spmd(hlo.parse_hlo(MLP_TEXT), backend="cuda")
    assert re.search(r"fusion\{[^}]*target=a100", exe.pipeline) and \
        "layout-assignment{target=gpu}" in exe.pipeline, exe.pipeline
    monkeypatch.setattr(spmd, "_gpu_fusion_target", lambda: None)
    exe = compile_spmd(hlo.parse_hlo(MLP_TEXT), backend="cuda")
    assert re.search(r"fusion\{[^}]*\}", exe.pipeline) and "target=a100" not in exe.pipeline, \
        exe.pipeline
