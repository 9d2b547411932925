"""Asynchronous collectives and the latency-hiding scheduler: start/done pairs as XLA
prints them, a schedule that puts independent work between a start and its done (from a
cost model of collective time in the device specs), the interpreter, the CPU executable
and sharded jax.Array arguments running them."""
from __future__ import annotations

import numpy as np
import pytest

import hlo
import passes
from hlo.evaluator.collectives import simulate
from passes.async_collectives import AsyncCollectiveCreator
from passes.dataflow import Dataflow
from passes.fusion.cost_model import get_device
from passes.latency_hiding_scheduler import collective_time_us, predicted_overlap
from passes.spmd import collective_stats
from runtime.client import flatten_value
from runtime.spmd import compile_spmd

EVERY_KIND = """HloModule kinds, num_partitions=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[2,4]) -> (f32[2,4], f32[2,8], f32[2,2], f32[2,4], f32[2,4]) {
  %x = f32[2,4] parameter(0)
  %ar = f32[2,4] all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%sum
  %ag = f32[2,8] all-gather(%x), channel_id=2, replica_groups={{0,1},{2,3}}, dimensions={1}, use_global_device_ids=true
  %rs = f32[2,2] reduce-scatter(%x), channel_id=3, replica_groups={{0,1},{2,3}}, dimensions={1}, use_global_device_ids=true, to_apply=%sum
  %a2a = f32[2,4] all-to-all(%x), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={1}
  %cp = f32[2,4] collective-permute(%x), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT %t = (f32[2,4], f32[2,8], f32[2,2], f32[2,4], f32[2,4]) tuple(%ar, %ag, %rs, %a2a, %cp)
}
"""


def _args4():
    return [[np.arange(8, dtype=np.float32).reshape(2, 4) * (d + 1) + d] for d in range(4)]


def test_every_collective_becomes_a_start_done_pair_printed_as_xla_prints_it():
    m = hlo.parse_hlo(EVERY_KIND)
    want = [flatten_value(r) for r in simulate(m, _args4(), 1, 4)]
    assert AsyncCollectiveCreator().run(m)
    text = m.to_text()
    assert "= f32[2,4] all-reduce-start(%x), channel_id=1" in text
    assert "= f32[2,4] all-reduce-done(%all_reduce_start)" in text
    assert "= (f32[2,4], f32[2,8]) all-gather-start(%x), channel_id=2" in text
    assert "= f32[2,8] all-gather-done(%all_gather_start)" in text
    assert "= (f32[2,4], f32[2,4], u32[], u32[]) collective-permute-start(%x)" in text
    assert "= ((f32[2,4]), f32[2,2]) async-start(%x), calls=%wrapped_reduce_scatter" in text
    assert text.count("async-done(") == 2 and "calls=%wrapped_reduce_scatter" in text
    ops = [i.opcode for i in m.entry.instructions]
    assert not {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                "collective-permute"} & set(ops)
    again = hlo.parse_hlo(text)                      # prints and parses back
    assert again.to_text() == text
    hlo.verify(again)
    got = [flatten_value(r) for r in simulate(again, _args4(), 1, 4)]
    for d in range(4):
        for a, b in zip(got[d], want[d]):
            np.testing.assert_array_equal(a, b)
    # Counted once each, at the start (the wrapped computations are not counted again).
    assert {k: c for k, (c, _) in collective_stats(again).items()} == {
        "all-reduce": 1, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1,
        "collective-permute": 1}


def test_a_done_is_its_starts_buffer_and_a_start_keeps_its_operands_alive():
    m = hlo.parse_hlo(EVERY_KIND)
    AsyncCollectiveCreator().run(m)
    flow = Dataflow(m)
    by = {i.opcode: i for i in m.entry.instructions}
    ag, agd = by["all-gather-start"], by["all-gather-done"]
    assert flow.buffer_set(agd) is flow.buffer_set(ag, (1,))
    assert flow.buffer_set(ag, (0,)) is flow.buffer_set(m.entry.parameters[0])
    assert flow.buffer_set(by["all-reduce-done"]) is flow.buffer_set(by["all-reduce-start"])


def test_collective_time_is_bytes_over_link_bandwidth_plus_latency():
    h100 = get_device("h100")
    assert (h100.link_bandwidth_gbps, h100.collective_latency_us) == (450, 10.0)
    m = hlo.parse_hlo("""HloModule c, num_partitions=4
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (x: f32[262144]) -> f32[262144] {
  %x = f32[262144] parameter(0)
  %st = f32[262144] all-reduce-start(%x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%sum
  ROOT %dn = f32[262144] all-reduce-done(%st)
}""")
    start = m.entry.instructions[1]
    # A ring all-reduce of 1 MiB over 4 devices moves 2 * 3/4 MiB per device.
    expect = 10.0 + 2 * 0.75 * 262144 * 4 / 450e3
    assert collective_time_us(start, h100, 4) == pytest.approx(expect)


OVERLAP = """
HloModule overlap, num_partitions=4

ENTRY %main (x: f32[256,512], w1: f32[512,256], a: f32[256,512], b: f32[512,512]) -> f32[256,512] {
  %x = f32[256,512] parameter(0), sharding={devices=[1,4]<=[4]}
  %w1 = f32[512,256] parameter(1), sharding={devices=[4,1]<=[4]}
  %a = f32[256,512] parameter(2), sharding={replicated}
  %b = f32[512,512] parameter(3), sharding={replicated}
  %partial = f32[256,256] dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  %independent = f32[256,512] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  %t = f32[256,512] tanh(%independent)
  %c = f32[256,512] concatenate(%partial, %partial), dimensions={1}
  ROOT %out = f32[256,512] add(%c, %t), sharding={replicated}
}
"""


def _overlap_args():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32)
            for s in [(256, 512), (512, 256), (256, 512), (512, 512)]]
    p = args[0] @ args[1]
    return args, np.concatenate([p, p], 1) + np.tanh(args[2] @ args[3])


def _position(comp, prefix):
    return next(k for k, i in enumerate(comp.instructions) if i.name.startswith(prefix))


def test_the_schedule_puts_the_independent_dot_between_start_and_done():
    exe = compile_spmd(hlo.parse_hlo(OVERLAP))
    assert exe.pipeline.endswith("async-collective-creator,latency-hiding-scheduler")
    comp = exe.module.entry
    start = _position(comp, "all_reduce_start")
    done = _position(comp, "all_reduce_done")
    assert start < _position(comp, "independent") < done
    assert start < _position(comp, "t.") < done
    report = predicted_overlap(comp, "h100", 4)
    (coll, hidden), = report.overlaps.values()
    assert hidden > 0 and coll == pytest.approx(10.0 + 2 * 0.75 * 256 * 256 * 4 / 450e3)
    args, want = _overlap_args()
    (out,) = exe.execute_arrays(args)                # the interpreter runs the async forms
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_without_independent_work_nothing_moves_between_start_and_done():
    text = OVERLAP.replace("ROOT %out = f32[256,512] add(%c, %t)",
                           "ROOT %out = f32[256,512] add(%c, %c)")
    comp = compile_spmd(hlo.parse_hlo(text)).module.entry
    assert _position(comp, "all_reduce_done") == _position(comp, "all_reduce_start") + 1


def test_cpu_executable_runs_async_collectives_on_every_device():
    """The CPU pipeline (layout, fusion, schedule: latency-hiding for this computation)
    and the compiled CPU executable on four simulated devices, collectives in background
    threads between their start and done."""
    exe = compile_spmd(hlo.parse_hlo(OVERLAP), pipeline="default")
    kinds = exe.cpu_executable.describe()
    assert "async-start %all_reduce_start" in kinds and "async-done %all_reduce_done" in kinds
    assert exe.module.is_scheduled
    args, want = _overlap_args()
    (out,) = exe.execute_arrays(args)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_data_parallel_step_overlaps_gradient_all_reduces_with_the_backward_pass():
    """Three gradient all-reduces too big to combine (over the combiner's threshold): the
    schedule starts each as soon as its gradient exists and runs the rest of the backward
    pass before waiting; the compiled CPU run equals jax.jit."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def step(w1, w2, x, y):
        def loss(ws):
            return jnp.mean((jnp.tanh(x @ ws[0]) @ ws[1] - y) ** 2)
        g = jax.grad(loss)((w1, w2))
        return w1 - 0.1 * g[0], w2 - 0.1 * g[1]
    rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    f = jax.jit(step, in_shardings=(rep, rep, data, data), out_shardings=(rep, rep))
    rng = np.random.default_rng(1)
    args = [(rng.standard_normal(s) * 0.3).astype(np.float32)
            for s in [(16, 32), (32, 8), (32, 16), (32, 8)]]
    exe = compile_spmd(hlo.from_jax(f, *args), pipeline="default")
    starts = [i for i in exe.module.entry.instructions if i.opcode == "all-reduce-start"]
    assert len(starts) == 1        # small gradients combine into one (XLA's threshold)
    for a, b in zip(exe.execute_arrays(args), jax.jit(step)(*args)):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6)
    # Over the threshold they stay apart, and the first starts before the last gradient.
    m = hlo.from_jax(f, *args)
    passes.run_pipeline(m, "sharding-propagation,spmd-partitioner,all-reduce-combiner"
                           "{threshold_bytes=1},async-collective-creator,"
                           "latency-hiding-scheduler", verify=True)
    order = [i.opcode for i in m.entry.instructions]
    first_start, first_done = order.index("all-reduce-start"), order.index("all-reduce-done")
    assert order.count("all-reduce-start") == 2
    assert "dot" in order[first_start:first_done]


def test_sharded_jax_arrays_pass_shard_by_shard():
    jax = pytest.importorskip("jax")
    import runtime
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)]]
    specs = (P(), P(None, "x"), P("x", None))
    on_mesh = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    compiled = runtime.jit(mlp, in_shardings=specs, out_shardings=P(), mesh=mesh) \
        .lower(*args).compile()
    np.testing.assert_allclose(compiled(*on_mesh), mlp(*args), rtol=1e-5, atol=1e-5)
    assert compiled.executable.transfers == {"sharded_arguments": 3, "host_arguments": 0}
    np.testing.assert_allclose(compiled(*args), mlp(*args), rtol=1e-5, atol=1e-5)
    assert compiled.executable.transfers == {"sharded_arguments": 3, "host_arguments": 3}
    # Split another way than the parameter: gathered on the host and split again.
    other = jax.device_put(args[1], NamedSharding(mesh, P("x", None)))
    compiled(on_mesh[0], other, on_mesh[2])
    assert compiled.executable.transfers["host_arguments"] == 4
