"""The partitioner on what real sharded programs hit first: uneven splits (padded, the
padding masked), while loops with a sharded state, gather/scatter along sharded dims,
sort and top-k per row, shard_map bodies kept per-device. Each program runs on simulated
CPU devices and is compared with jax.jit with the same shardings (conftest gives JAX 8
host devices)."""
from __future__ import annotations

import numpy as np
import pytest

import hlo
import passes
from passes.spmd import SpmdError, collective_stats
from runtime.spmd import compile_spmd, join_array, split_array

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402


def _mesh(shape=(4,), names=("x",)):
    # Host CPU devices (conftest makes 8) even where JAX's default backend is one GPU.
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                         devices=jax.devices("cpu")[:int(np.prod(shape))])


MESH = _mesh()


def _wsc(v, *spec, mesh=MESH):
    return jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(*spec)))


def _rand(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def _same_as_jax(fn, args, in_shardings, out_shardings, mesh=MESH, rtol=1e-5, atol=1e-5):
    """hlotk's partitioned run next to jax.jit's; returns hlotk's partitioned module."""
    import runtime
    g = runtime.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, mesh=mesh)
    got = g(*args)
    want = jax.jit(fn)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)
    return g.lower(*args).compile().executable.module


def _ops(module, comp=None):
    comp = comp or module.entry
    return [i.opcode for i in comp.instructions]


# --- uneven splits ----------------------------------------------------------------------
UNEVEN = """
HloModule uneven, num_partitions=4

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %mx = f32[] maximum(%a, %b)
}

%add (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %sum = f32[] add(%p, %q)
}

ENTRY %main (x: f32[10,6], w: f32[10,3]) -> (f32[6], f32[6,3], f32[10,6]) {
  %x = f32[10,6] parameter(0), sharding={devices=[4,1]<=[4]}
  %w = f32[10,3] parameter(1), sharding={devices=[4,1]<=[4]}
  %e = f32[10,6] exponential(%x)
  %ninf = f32[] constant(-inf)
  %m = f32[6] reduce(%e, %ninf), dimensions={0}, to_apply=%max, sharding={replicated}
  %d = f32[6,3] dot(%e, %w), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={replicated}
  %neg = f32[10,6] negate(%e), sharding={replicated}
  ROOT %t = (f32[6], f32[6,3], f32[10,6]) tuple(%m, %d, %neg), sharding={{replicated}, {replicated}, {replicated}}
}
"""


def test_uneven_split_is_padded_and_the_padding_masked_in_reductions():
    """10 rows over 4 devices: 3, 3, 3 and 1 real rows. exp of the zero padding is 1, so
    a max over negative exponents or a dot contracting the rows is only right if the
    padding is masked (max with -inf, the dot with zeros), and gathering the rows back
    drops it."""
    m = hlo.parse_hlo(UNEVEN)
    passes.run_pipeline(m, "sharding-propagation,spmd-partitioner", verify=True)
    assert [p.shape.dims for p in m.entry.parameters] == [(3, 6), (3, 3)]
    ops = _ops(m)
    assert ops.count("select") >= 3 and "iota" in ops     # max mask; dot masks both sides
    ag = next(i for i in m.entry.instructions if i.opcode == "all-gather")
    assert ag.shape.dims == (12, 6) and ag.users[0].opcode == "slice"   # padding dropped
    x = -np.abs(_rand(10, 6)) - 3.0               # exp(x) < 1: zero padding would win a max
    w = _rand(10, 3, seed=1)
    m_out, d_out, neg = compile_spmd(hlo.parse_hlo(UNEVEN)).execute_arrays([x, w])
    np.testing.assert_allclose(m_out, np.exp(x).max(0), rtol=1e-6)
    np.testing.assert_allclose(d_out, np.exp(x).T @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(neg, -np.exp(x), rtol=1e-6)


def test_split_and_join_pad_and_drop_uneven_pieces():
    from hlo.sharding import parse_sharding
    s = parse_sharding("{devices=[4,1]<=[4]}")
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    pieces = split_array(x, s, 4)
    assert [p.shape for p in pieces] == [(3, 2)] * 4
    np.testing.assert_array_equal(pieces[3], [[18, 19], [0, 0], [0, 0]])
    np.testing.assert_array_equal(join_array(pieces, s, x.shape, 4), x)


def test_replicated_to_uneven_split_pads_before_its_dynamic_slice():
    text = """
HloModule r, num_partitions=4
ENTRY %main (x: f32[10,2]) -> f32[10,2] {
  %x = f32[10,2] parameter(0), sharding={replicated}
  ROOT %y = f32[10,2] negate(%x), sharding={devices=[4,1]<=[4]}
}
"""
    m = hlo.parse_hlo(text)
    passes.run_pipeline(m, "sharding-propagation,spmd-partitioner", verify=True)
    pad = next(i for i in m.entry.instructions if i.opcode == "pad")
    assert pad.shape.dims == (12, 2)
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    (out,) = compile_spmd(hlo.parse_hlo(text)).execute_arrays([x])
    np.testing.assert_array_equal(out, -x)


def test_vocabulary_not_divisible_by_the_mesh():
    """An MLP with a 30-word vocabulary split over 4 devices (8, 8, 8, 6 real columns):
    log-softmax and the cross-entropy reduce over the padded vocabulary."""
    def loss(x, w1, wout, labels):
        h = jax.nn.relu(x @ w1)
        logits = _wsc(h @ wout, None, "x")
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, 30) * logp, -1))
    labels = np.random.default_rng(3).integers(0, 30, 8).astype(np.int32)
    m = _same_as_jax(loss, [_rand(8, 16), _rand(16, 32, seed=1), _rand(32, 30, seed=2), labels],
                     (P(), P(None, "x"), P(), P()), P())
    stats = collective_stats(m)
    assert set(stats) == {"all-reduce"}       # the logits never travel whole
    assert any(i.shape.dims == (8, 8) and i.opcode == "dot" for i in m.entry.instructions)


def test_argmax_over_a_split_vocabulary_reduces_twice():
    """A variadic reduce (values and indices) over the split, padded vocabulary: each device
    reduces its columns, the partial (value, index) pairs are gathered and reduced again
    (the logits themselves never travel)."""
    mesh = _mesh((2, 4), ("d", "m"))

    def accuracy(x, w, y):
        logits = _wsc(x @ w, "d", "m", mesh=mesh)
        return jnp.mean(jnp.argmax(logits, -1) == y)
    y = np.random.default_rng(6).integers(0, 30, 8).astype(np.int32)
    x, w = _rand(8, 16), _rand(16, 30, seed=1)
    m = _same_as_jax(accuracy, [x, w, y], (P(), P(), P()), P(), mesh=mesh)
    reduces = [i for i in m.entry.instructions if i.opcode == "reduce" and i.shape.is_tuple]
    assert [r.operands[0].shape.dims for r in reduces] == [(4, 8), (4, 4)]
    assert collective_stats(m)["all-gather"][1] < 4 * 32 * 4  # less than the logits rows


# --- while loops ------------------------------------------------------------------------
def _scan_layers(x, ws):
    def body(h, w):
        return jnp.tanh(h @ w), None
    return jax.lax.scan(body, x, ws)[0]


def _loop(m):
    (w,) = [i for i in m.entry.instructions if i.opcode == "while"]
    return w


def test_scan_over_layers_keeps_the_batch_split_in_the_loop_state():
    x, ws = _rand(8, 16), _rand(3, 16, 16, seed=1)
    m = _same_as_jax(_scan_layers, [x, ws], (P("x"), P()), P("x"))
    w = _loop(m)
    assert [s.dims for s in w.shape.elements] == [(3, 16, 16), (), (2, 16)]
    assert collective_stats(m) == {}          # data parallel: no communication at all


def test_scan_over_layers_with_model_parallel_weights_communicates_inside_the_body():
    x, ws = _rand(8, 16), _rand(3, 16, 16, seed=1)
    m = _same_as_jax(_scan_layers, [x, ws], (P(), P(None, None, "x")), P())
    w = _loop(m)
    assert [s.dims for s in w.shape.elements] == [(3, 16, 4), (), (8, 4)]
    body = w.attrs["body"]
    assert "all-gather-start" in _ops(m, body)    # one layer's collective, every iteration


# --- gather / scatter -------------------------------------------------------------------
def _lookup(table, ids):
    return table[ids] * 2.0


@pytest.mark.parametrize("table_spec,ids_spec,out_spec,collectives", [
    (P("x"), P(), P(), {"all-reduce"}),            # vocab-parallel: masked rows, summed
    (P(None, "x"), P(), P(None, None, "x"), set()),  # operand passthrough (embedding dim)
    (P(), P("x"), P("x"), set()),                  # index parallel (batch of ids)
])
def test_embedding_lookup_partitioned_on_table_or_indices(table_spec, ids_spec, out_spec,
                                                          collectives):
    """A table bigger than the looked-up rows (as embeddings are): the table never moves."""
    ids = np.random.default_rng(4).integers(0, 64, (8, 5)).astype(np.int32)
    m = _same_as_jax(_lookup, [_rand(64, 16), ids], (table_spec, ids_spec), out_spec)
    assert set(collective_stats(m)) == collectives
    gather = next(i for i in m.entry.instructions if i.opcode == "gather")
    assert gather.operands[0].shape.dims != (64, 16) or gather.shape.dims != (8, 5, 16)


def test_vocab_parallel_lookup_clamps_out_of_range_ids_as_gather_does():
    """30 rows split unevenly; ids below 0 and above 29 clamp to the first/last row."""
    def lookup(table, ids):
        return _wsc(table * 1.0, "x")[ids]
    ids = np.array([[-3, 0, 7, 8], [29, 33, 15, 16]], np.int32)
    m = _same_as_jax(lookup, [_rand(30, 8), ids], (P(), P()), P())
    assert set(collective_stats(m)) == {"all-reduce"}


@pytest.mark.parametrize("specs,collectives", [
    ((P(None, "x"), P(), P(None, "x")), set()),          # operand passthrough
    ((P("x"), P(), P()), set()),                         # rows: indices moved per device
    ((P(), P("x"), P("x")), {"all-reduce"}),             # index parallel: partial sums
])
def test_scatter_add_partitioned(specs, collectives):
    def scatter_add(x, i, u):
        return x.at[i].add(u)
    n_up = 12 if specs[1] != P() else 3
    i = np.random.default_rng(5).integers(0, 8, n_up).astype(np.int32)
    out_spec = specs[0]
    m = _same_as_jax(scatter_add, [_rand(8, 8), i, _rand(n_up, 8, seed=2)], specs, out_spec)
    assert set(collective_stats(m)) == collectives


# --- sort and top-k ---------------------------------------------------------------------
def test_top_k_and_argsort_per_row_stay_local():
    def f(x):
        v, i = jax.lax.top_k(x, 3)
        return v, i, jnp.argsort(x, axis=1), jnp.sort(x, axis=1)
    m = _same_as_jax(f, [_rand(8, 10)], (P("x"),), (P("x"),) * 4)
    assert collective_stats(m) == {}
    sorts = [i for i in m.entry.instructions if i.opcode == "sort"]
    assert sorts and all(s.shape.elements[0].dims == (2, 10) for s in sorts if s.shape.is_tuple)


# --- shard_map --------------------------------------------------------------------------
def test_shard_map_ring_and_psum_are_kept_per_device():
    from jax import shard_map

    def ring(x):
        def body(b):
            s = jax.lax.psum(b, "x")
            r = jax.lax.ppermute(b, "x", [(i, (i + 1) % 4) for i in range(4)])
            return s + r * jax.lax.axis_index("x").astype(b.dtype)
        return shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x"))(x) * 2.0
    m = _same_as_jax(ring, [_rand(8, 2)], (P("x"),), P("x"))
    # Exactly the body's two collectives, on the body's per-device shapes.
    assert {k: v[0] for k, v in collective_stats(m).items()} == {"all-reduce": 1,
                                                                 "collective-permute": 1}
    cp = next(i for i in m.entry.instructions if i.opcode == "collective-permute-start")
    assert cp.attrs["source_target_pairs"] == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert cp.operands[0].shape.dims == (2, 2)


def test_shard_map_in_the_older_custom_call_form():
    """Without Shardy JAX emits the body between Sharding / SPMDFullToShardShape and
    SPMDShardToFullShape custom-calls (mhlo.sharding attributes): the same result."""
    from jax import shard_map

    def twice_psum(x):
        body = lambda b: jax.lax.psum(b, "x") * 2.0  # noqa: E731
        return shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P())(x)
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        f = jax.jit(twice_psum, in_shardings=NamedSharding(MESH, P("x")),
                    out_shardings=NamedSharding(MESH, P()))
        x = _rand(8, 2)
        module = hlo.from_jax(f, x)
        want = np.asarray(f(x))
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
    targets = [i.attrs.get("custom_call_target") for i in module.entry.instructions
               if i.opcode == "custom-call"]
    assert "SPMDFullToShardShape" in targets and "SPMDShardToFullShape" in targets
    exe = compile_spmd(module)
    np.testing.assert_allclose(exe.execute_arrays([x])[0], want, rtol=1e-6)
    assert {k: v[0] for k, v in collective_stats(exe.module).items()} == {"all-reduce": 1}


def test_shard_map_on_a_2d_mesh_reduces_over_one_axis():
    from jax import shard_map
    mesh = _mesh((2, 4), ("d", "m"))

    def f(x, w):
        def body(xb, wb):
            return jax.lax.psum(xb @ wb, "m")
        return shard_map(body, mesh=mesh, in_specs=(P("d", "m"), P("m")),
                         out_specs=P("d"))(x, w)
    _same_as_jax(f, [_rand(4, 16), _rand(16, 8, seed=1)], (P("d", "m"), P("m")), P("d"),
                 mesh=mesh)


def test_shard_map_manual_over_one_axis_of_two():
    """axis_names={"d"}: the body is per-device along "d" and whole along the automatic
    "m" (every device of an "m" group runs it on the same piece: correct, not split)."""
    from jax import shard_map
    mesh = jax.make_mesh((2, 4), ("d", "m"), axis_types=(jax.sharding.AxisType.Explicit,) * 2,
                         devices=jax.devices("cpu")[:8])

    def f(x):
        return shard_map(lambda b: jax.lax.psum(jnp.sin(b), "d"), mesh=mesh, in_specs=P("d"),
                         out_specs=P(), axis_names={"d"})(x)
    _same_as_jax(f, [_rand(8, 4)], (P("d"),), P(), mesh=mesh)


def test_a_manual_value_read_outside_its_manual_computation_is_an_error():
    text = """
HloModule bad, num_partitions=2
ENTRY %main (x: f32[4]) -> f32[2] {
  %x = f32[4] parameter(0), sharding={devices=[2]<=[2]}
  %s = f32[4] custom-call(%x), custom_call_target="Sharding", sharding={devices=[2]<=[2]}
  %local = f32[2] custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  ROOT %n = f32[2] negate(%local), sharding={replicated}
}
"""
    with pytest.raises(SpmdError, match="manual computation"):
        passes.run_pipeline(hlo.parse_hlo(text), "sharding-propagation,spmd-partitioner")
