"""Elementwise chains merged before priority fusion ranks (passes/fusion/chains.py): the
same kernels as priority fusion on single instructions, on programs where the pre-pass
merges, and no pre-merge where the argument for it does not hold (issue 13)."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runtime
from passes.fusion import chains
from passes.fusion.explain import report_for
from passes.fusion.pass_ import with_target
from passes.pipelines import pipeline_spec
from runtime.tools import compile_module

sys.path.insert(0, str(Path(__file__).parent))
from zoo import by_name  # noqa: E402
from test_fusion_caches import _adam, _adam_args, _mlp_args, _mlp_train  # noqa: E402

SPEC = with_target(pipeline_spec("default", "cuda"), "h200")


def _fused(fn, args, chains_on: bool, **fusion_opts) -> tuple[str, list]:
    """(optimized module text, fusion decisions) through the CUDA pipeline, with the fusion
    pass's chains option (and others) set."""
    module = runtime.jit(fn, pipeline="none").lower(*args).module
    opts = "".join(f",{k}={v}" for k, v in fusion_opts.items())
    spec = SPEC.replace("fusion{", f"fusion{{chains={str(chains_on).lower()}{opts},", 1)
    compile_module(module, spec, backend="cuda")
    report = report_for(module)
    return module.to_text(), list(report.decisions)


def _premerged(decisions: list) -> list[tuple[str, str, str]]:
    return [(d.producer, d.consumer, d.action) for d in decisions if "chains.py" in d.reason]


def _same_kernels(fn, args, **opts) -> list:
    on, log_on = _fused(fn, args, True, **opts)
    off, log_off = _fused(fn, args, False, **opts)
    assert on == off
    assert not _premerged(log_off)
    # Every edge fused in one is fused in the other (the final edges agree).
    return _premerged(log_on)


def _steps(n_shapes: int) -> tuple:
    r = np.random.RandomState(1)
    shapes = {f"p{k}": (64 * (k + 1), 32) for k in range(n_shapes)}
    shapes.update({f"q{k}": (64 * (k + 1), 32) for k in range(n_shapes)})
    tree = lambda s: {k: r.standard_normal(v).astype(np.float32) * s for k, v in shapes.items()}
    return tree(0.02), tree(1e-3), tree(1e-4), {k: np.abs(a) for k, a in tree(1e-6).items()}, \
        np.float32(3.0)


def _lion(params, grads, m, _v, step):
    """Lion's update (sign of an interpolation, decoupled weight decay): other trees."""
    out = {}
    for k in params:
        u = jnp.sign(0.9 * m[k] + 0.1 * grads[k])
        out[k] = (params[k] - 1e-4 * (u + 0.01 * params[k]), 0.99 * m[k] + 0.01 * grads[k])
    return out


@pytest.mark.parametrize("fn,args,copies", [
    (_adam, _adam_args(), True), (_adam, _adam_args(big=True), False),
    (_adam, _steps(3), True), (_lion, _steps(2), True)],
    ids=["adam", "adam_big", "adam_pairs", "lion"])
def test_optimizer_steps_premerge_and_keep_the_kernels(fn, args, copies):
    merged = _same_kernels(fn, args)
    assert len(merged) > 20
    assert ("duplicate" in {a for _, _, a in merged}) == copies


@pytest.mark.parametrize("name", ["giou_boxes", "elementwise_math", "rng_threefry_exact",
                                  "int_overflow_bitwise", "where_clip_select", "dropout",
                                  "unsigned_and_convert", "gelu_exact_erf", "softmax_f32"])
def test_zoo_programs_keep_their_kernels(name):
    prog = by_name(name)
    _same_kernels(prog.fn, prog.args())


def test_a_program_with_dots_is_left_to_the_loop():
    """Split-GEMM pricing (and the halved merges into a GEMM) are not estimate_kernel's:
    the argument for profitable merges does not hold, nothing is pre-merged."""
    assert _same_kernels(_mlp_train, _mlp_args()) == []


def test_a_reduction_anywhere_turns_it_off():
    def f(x, y):
        z = jnp.exp(x * 2.0 + y) * 3.0
        return z - 1.0, jnp.sum(z)
    x = np.ones((64, 128), np.float32)
    assert _same_kernels(f, (x, x)) == []


def _chain(x, y):
    a = x * 2.0          # read by b only: a tree edge
    b = a + y            # read by c and by the output tuple: a tree edge, b stays an output
    c = jnp.tanh(b)
    return c, b


def test_tree_edges_and_an_output_inside_a_tree():
    x = np.ones((64, 128), np.float32)
    merged = _same_kernels(_chain, (x, x))
    assert {(p.split(".")[0], c.split(".")[0]) for p, c, _ in merged} >= {
        ("multiply", "add"), ("add", "tanh")}


def test_trees_that_read_each_other_turn_it_off():
    """exp(x) is read by two trees: a path from one tree through it into another could
    make the cycle rule refuse a tree edge in some order of the loop's merges."""
    def f(x):
        a = jnp.exp(x)
        return jnp.sin(a) * 2.0, jnp.cos(a) + 1.0
    x = np.ones((256, 256), np.float32)
    assert _same_kernels(f, (x,)) == []


def test_a_reader_outside_the_component_turns_it_off():
    """A sort (never fused) reads a tree node and feeds the component again."""
    def f(x, y):
        a = x * 2.0 + 1.0
        return jnp.sort(a, axis=-1) * y - 1.0, a
    x = np.ones((64, 128), np.float32)
    assert _same_kernels(f, (x, x)) == []


def test_other_dims_in_the_component_turn_it_off():
    """A reshape joins values of two dims: the multi-output argument needs one dims."""
    def f(x, y):
        a = (x * 2.0 + 1.0).reshape(128, 64)
        return a * y
    x = np.ones((64, 128), np.float32)
    y = np.ones((128, 64), np.float32)
    assert _same_kernels(f, (x, y)) == []


def test_a_broadcast_of_a_computed_scalar_keeps_the_kernels():
    """A scalar kernel's value broadcast to two trees: copied only where the broadcast
    reads no kernel's value (the simplifier may move the broadcast before the exp)."""
    def f(x, y, s):
        t = jnp.exp(s)
        return x * t + 1.0, y * t - 1.0
    x = np.ones((64, 128), np.float32)
    _same_kernels(f, (x, x, np.float32(0.5)))


def test_scalars_made_of_arrays_turn_it_off():
    """A slice's element as a scalar (threefry's keys): the loop copies such views into
    readers in an order the trees would change."""
    def f(x, k):
        return (x * k[0] + 1.0) * 2.0, (x - k[1]) * 3.0
    x = np.ones((64, 128), np.float32)
    assert _same_kernels(f, (x, np.arange(4, dtype=np.float32))) == []


def test_a_broadcast_read_within_one_tree_is_not_copied():
    """Read twice in one tree, the loop sees one reader and merges it (no copy)."""
    def f(x, y):
        c = jnp.full(x.shape, 3.0, np.float32) + 0.0 * jnp.zeros_like(x)
        return (x * 3.0) + (y * 3.0) + c
    x = np.ones((64, 128), np.float32)
    merged = _same_kernels(f, (x, x))
    assert not any(a == "duplicate" for _, _, a in merged)


@pytest.mark.parametrize("opts", [{"max_size": 6}, {"max_operands": 5}])
def test_limits_that_could_bind_turn_it_off(opts):
    """Where a group of the component could reach max_size or max_operands, the loop may
    refuse a tree edge that the pre-pass would have merged: no pre-merge there, and the
    kernels are the loop's."""
    merged = _same_kernels(_adam, _adam_args(), **opts)
    assert merged == []


def test_the_log_names_each_premerged_edge_and_the_report_counts_it_fused():
    x = np.ones((64, 128), np.float32)
    module = runtime.jit(_chain, pipeline="none").lower(x, x).module
    compile_module(module, SPEC, backend="cuda")
    report = report_for(module)
    pre = [d for d in report.decisions if d.reason == chains.REASON]
    assert pre and all(d.fused and d.action == "merge" for d in pre)
    final = {(d.producer, d.consumer): d for d in report.final_edges()}
    assert all(final[(d.producer, d.consumer)].fused for d in pre)


def test_a_user_policy_is_not_premerged():
    from passes.fusion.priority import PriorityPolicy

    class Mine(PriorityPolicy):
        pass
    from passes.fusion.rewrite import FusionState
    x = np.ones((64, 128), np.float32)
    module = runtime.jit(_chain, pipeline="none").lower(x, x).module
    from passes.fusion.cost_model import get_device
    from passes.fusion.legality import fusible
    state = FusionState(module.entry, get_device("h200"), fusible=lambda i: bool(fusible(i)))
    assert not chains.applicable(state, Mine(min_benefit_us=0.0))
    assert not chains.applicable(state, PriorityPolicy(min_benefit_us=1.0))
    assert chains.applicable(state, PriorityPolicy())


def test_duplicate_all_makes_what_one_duplicate_per_consumer_makes():
    """The same groups (contents, in the same order) and the same groups marked changed."""
    from passes.fusion.cost_model import get_device
    from passes.fusion.legality import fusible
    from passes.fusion.rewrite import FusionState
    module = runtime.jit(_adam, pipeline="none").lower(*_adam_args()).module
    compile_module(module, "inline,fixpoint(simplify,cse,dce)", backend="cuda")

    def fresh():
        return FusionState(module.entry, get_device("h200"), fusible=lambda i: bool(fusible(i)))

    def contents(state, gids=None):
        groups = state.groups.values() if gids is None else [state.groups[g] for g in gids
                                                              if g in state.groups]
        return [(tuple(i.name for i in g.members), tuple(i.name for i in g.copies))
                for g in groups]

    one, many = fresh(), fresh()
    bcast = next(i for i in module.entry.instructions if i.opcode == "broadcast"
                 and len({id(u) for u in i.users}) > 1)
    for state in (one, many):
        state.take_changed()
    readers = [one.group_of(u) for u in {id(u): u for u in bcast.users}.values()]
    producer = one.group_of(bcast)
    for g in readers:
        one.duplicate(producer, g)
    readers2 = [many.group_of(u) for u in {id(u): u for u in bcast.users}.values()]
    many.duplicate_all(many.group_of(bcast), readers2)
    assert len(readers) > 1
    assert contents(one) == contents(many)
    assert contents(one, sorted(one.take_changed())) == contents(many, sorted(many.take_changed()))
    assert bcast.name not in {i.name for g in many.groups.values() for i in g.members}
