"""``dot-merger`` (passes/dot_merger.py): dots sharing an operand become one dot over the
others concatenated, then slices that their readers take in place (a loop fusion, a
flash-attention fusion). Results equal to jax.jit; the rule's refusals named by case."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
import runtime
from passes import run_pipeline
from passes.fusion import fusion_kind
from passes.pipelines import PIPELINES, with_dot_merger

# The default pipelines leave dot-merger out (it did not pay on the H200 yet,
# passes/pipelines.py); these are them with it.
CPU_MERGED = with_dot_merger(PIPELINES["default"]["cpu"])
CUDA_MERGED = with_dot_merger(PIPELINES["default"]["cuda"])

H, HD = 4, 16


def _w(r, *shape):
    return (r.standard_normal(shape) / 8).astype(np.float32)


def _block(p, x):
    """Causal self-attention with separate q, k, v projections (the suite's transformer's
    first half, small): q/k/v split into heads, softmax attention, output projection."""
    B, S, D = x.shape
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    split = lambda z: z.reshape(B, S, H, HD).transpose(0, 2, 1, 3)  # noqa: E731
    s = jnp.einsum("bhqd,bhkd->bhqk", split(q), split(k)) / math.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    o = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), split(v))
    return x + o.transpose(0, 2, 1, 3).reshape(B, S, H * HD) @ p["wo"]


def _gqa(p, x):
    """Grouped-query attention: q 4 heads, k and v 2 heads (weights of different widths)."""
    B, S, _ = x.shape
    q = (x @ p["wq"]).reshape(B, S, H, HD)
    k = (x @ p["wk"]).reshape(B, S, 2, HD)
    v = (x @ p["wv"]).reshape(B, S, 2, HD)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return o.reshape(B, S, H * HD) @ p["wo"]


def _cross(p, x, ctx):
    """Cross-attention: only k and v read the same activations (the context)."""
    B, S, _ = x.shape
    q = (x @ p["wq"]).reshape(B, S, H, HD)
    k = (ctx @ p["wk"]).reshape(B, -1, H, HD)
    v = (ctx @ p["wv"]).reshape(B, -1, H, HD)
    return jax.nn.dot_product_attention(q, k, v).reshape(B, S, H * HD) @ p["wo"]


def _params(kv_width=H * HD, d=64, seed=0):
    r = np.random.default_rng(seed)
    return {"wq": _w(r, d, H * HD), "wk": _w(r, d, kv_width), "wv": _w(r, d, kv_width),
            "wo": _w(r, H * HD, d)}


def _x(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _entry_ops(compiled) -> list[tuple[str, str, list[str]]]:
    """(name, opcode or fusion kind, operand names) of the entry's computing instructions."""
    return [(i.name, fusion_kind(i) if i.opcode == "fusion" else i.opcode,
             [o.name for o in i.operands]) for i in compiled.module.entry.instructions
            if i.opcode not in ("parameter", "constant", "bitcast", "get-tuple-element")]


def _check(f, args, target="h200", tol=2e-5, pipeline=CPU_MERGED):
    jf = runtime.jit(f, target=target, pipeline=pipeline)
    compiled = jf.lower(*args).compile()
    got = jax.tree.leaves(jf(*args))
    want = jax.tree.leaves(jax.jit(f)(*args))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
    return compiled


def test_qkv_projections_become_one_dot_read_by_the_attention_in_place():
    p, x = _params(), _x(2, 160, 64)
    c = _check(_block, (p, x))
    ops = _entry_ops(c)
    # one GEMM for q, k and v; the attention fusion reads its result itself (no slice copy)
    assert ops == [("concatenate", "concatenate", ["p__wq.4", "p__wk.2", "p__wv.5"]),
                   ("dot_merged", "dot", ["x.6", "concatenate"]),
                   ("fusion", "attention", ["dot_merged"]),
                   ("fusion.1", "gemm", ["fusion", "p__wo.3", "x.6"])], ops
    att = ops[2]
    fused = next(i for i in c.module.entry.instructions if i.name == att[0])
    slices = [i for i in fused.attrs["calls"].instructions if i.opcode == "slice"]
    assert sorted(i.attrs["slice"].dims[2].start for i in slices) == [0, 64, 128]


def test_concatenated_operand_and_slices_in_the_hlo_text():
    p, x = _params(), _x(2, 160, 64)
    m = hlo.from_jax(_block, p, x)
    run_pipeline(m, "inline,fixpoint(simplify,cse,dce),dot-merger", verify=True)
    text = m.to_text()
    assert "f32[64,192]{1,0} concatenate(" in text and "dimensions={1}" in text, text
    assert "f32[2,160,192]{2,1,0} dot(" in text, text
    assert text.count(" slice(%dot_merged)") == 3, text
    assert "slice={[0:2], [0:160], [128:192]}" in text, text


def test_grouped_query_weights_of_different_widths_merge():
    p, x = _params(kv_width=2 * HD), _x(2, 160, 64)
    c = _check(_gqa, (p, x))
    ops = _entry_ops(c)
    cat = [o for o in ops if o[1] == "concatenate"]
    assert len(cat) == 1 and len(cat[0][2]) == 3, ops
    assert next(o for o in ops if o[1] == "attention")[2] == ["dot_merged"], ops


def test_cross_attention_merges_only_k_and_v():
    p, x, ctx = _params(), _x(2, 160, 64), _x(2, 96, 64, seed=2)
    c = _check(_cross, (p, x, ctx))
    ops = _entry_ops(c)
    (cat,) = [o for o in ops if o[1] == "concatenate"]
    assert cat[2] == ["p__wk.2", "p__wv.5"], ops
    att = next(o for o in ops if o[1] == "attention")
    assert "dot_merged" in att[2] and len(att[2]) == 2, ops   # q from its own dot


def test_a_slice_read_by_a_loop_fusion_is_read_in_place():
    def f(x, w1, w2):
        return jnp.tanh(x @ w1) * jax.nn.sigmoid(x @ w2)     # a gated unit
    r = np.random.default_rng(3)
    args = (_x(512, 64), _w(r, 64, 32), _w(r, 64, 32))
    # the CUDA pipeline: f32 dots are cuBLAS calls, the gate a loop fusion after them
    c = _check(f, args, pipeline=CUDA_MERGED)
    ops = _entry_ops(c)
    assert [o[1] for o in ops] == ["concatenate", "dot", "loop"], ops
    loop = next(i for i in c.module.entry.instructions if i.name == ops[2][0])
    assert [o.name for o in loop.operands] == ["dot_merged"]
    assert sum(i.opcode == "slice" for i in loop.attrs["calls"].instructions) == 2


def _merged(f, *args) -> hlo.Module:
    m = hlo.from_jax(f, *args)
    run_pipeline(m, "inline,fixpoint(simplify,cse,dce),dot-merger", verify=True)
    return m


def test_refused_when_the_concatenated_operand_is_activations():
    """jax.grad's weight gradients of q/k/v projections share the input x but would
    concatenate three activations: the rule refuses (bytes 0.69 of the GEMM's > 1/4)."""
    def wgrads(x, dq, dk, dv):
        g = lambda d: jnp.tanh(jnp.einsum("bsd,bsn->dn", x, d))   # noqa: E731
        return g(dq) + g(dk) + g(dv)
    x, dq, dk, dv = (_x(4, 256, 64, seed=s) for s in range(4))
    m = _merged(wgrads, x, dq, dk, dv)
    assert sum(i.opcode == "dot" for i in m.entry.instructions) == 3, m.to_text()
    assert not any(i.opcode == "concatenate" for i in m.entry.instructions)
    np.testing.assert_allclose(runtime.jit(wgrads)(x, dq, dk, dv),
                               jax.jit(wgrads)(x, dq, dk, dv), rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("case", ["output", "gemm_reader", "dependent", "small"])
def test_refused(case):
    """Merging would add a copy (a slice returned, or read by a library GEMM), the second
    dot reads the first, or the GEMM is too small for its concatenate."""
    r = np.random.default_rng(4)
    x, w1, w2, w3 = _x(512, 64), _w(r, 64, 64), _w(r, 64, 64), _w(r, 64, 64)
    if case == "output":
        def f(x, w1, w2, w3):
            return x @ w1, jnp.tanh(x @ w2)
    elif case == "gemm_reader":
        def f(x, w1, w2, w3):
            return jnp.tanh((x @ w1) @ w3) + jnp.tanh(x @ w2)
    elif case == "dependent":
        def f(x, w1, w2, w3):
            a = x @ w1
            return jnp.tanh(x @ (w2 + a[:64])) + jnp.tanh(a)
    else:
        x = _x(16, 64)

        def f(x, w1, w2, w3):
            return jnp.tanh(x @ w1) + jnp.tanh(x @ w2)
    m = _merged(f, x, w1, w2, w3)
    assert not any(i.opcode == "concatenate" for i in m.entry.instructions), m.to_text()
    got = jax.tree.leaves(runtime.jit(f)(x, w1, w2, w3))
    for a, b in zip(got, jax.tree.leaves(jax.jit(f)(x, w1, w2, w3))):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_default_pipelines_leave_the_dots_apart():
    p, x = _params(), _x(2, 160, 64)
    c = _check(_block, (p, x), pipeline="default")
    ops = _entry_ops(c)
    assert sum(o[1] == "dot" for o in ops) == 3 and "concatenate" not in [o[1] for o in ops]


def _fused_qkv(p, x):
    """One projection to q|k|v sliced by the program itself (GPT-2 style)."""
    B, S, D = x.shape
    qkv = x @ jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1)
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, S, H, HD) for i in range(3))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return o.reshape(B, S, D) @ p["wo"]


def test_slices_of_a_fused_qkv_projection_are_read_in_place_by_default():
    """Without dot-merger too: a program's own slices of its q|k|v projection go into the
    attention fusion (no copy fusion writes q, k and v first)."""
    p, x = _params(), _x(2, 48, 64)
    c = _check(_fused_qkv, (p, x), pipeline="default")
    ops = _entry_ops(c)
    att = next(o for o in ops if o[1] == "attention")
    (proj,) = [o for o in ops if o[1] == "dot" and o[2][1].startswith("concatenate")]
    assert att[2] == [proj[0]], ops
    assert not [o for o in ops if o[1] == "loop"], ops


def test_compile_dump_shows_the_pass_before_and_after(tmp_path):
    """``hlotk compile --passes ...,dot-merger --dump``: the pass's diff like any other's."""
    from runtime.cli import main
    src = tmp_path / "block.hlo"
    src.write_text(hlo.from_jax(_block, _params(), _x(2, 160, 64)).to_text())
    dump = tmp_path / "dump"
    assert main(["compile", str(src), "--passes", "inline,fixpoint(simplify,cse,dce),dot-merger",
                 "--dump", str(dump), "--no-svg", "-q"]) == 0
    (diff,) = dump.glob("*.dot-merger.diff.txt")
    lines = diff.read_text().splitlines()
    added = [ln for ln in lines if ln.startswith("+ ")]
    removed = [ln for ln in lines if ln.startswith("- ")]
    assert sum(" dot(%x." in ln for ln in removed) == 3, lines
    assert any("f32[64,192]{1,0} concatenate(" in ln for ln in added), lines
    assert sum(" slice(%dot_merged)" in ln for ln in added) == 3, lines


def test_a_slice_also_read_outside_stays_outside_the_attention():
    """q's slice is also returned: the attention reads it as an operand (its copy is
    needed anyway), k's and v's slices are taken in; the result equals jax.jit's."""
    def f(p, x):
        B, S, D = x.shape
        qkv = x @ jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1)
        q, k, v = (qkv[..., i * D:(i + 1) * D] for i in range(3))
        heads = lambda z: z.reshape(B, S, H, HD)   # noqa: E731
        o = jax.nn.dot_product_attention(heads(q), heads(k), heads(v))
        return o.reshape(B, S, D), q
    p, x = _params(), _x(2, 48, 64)
    c = _check(f, (p, x), pipeline="default")
    att = next(i for i in c.module.entry.instructions if i.opcode == "fusion"
               and fusion_kind(i) == "attention")
    body_slices = [i for i in att.attrs["calls"].instructions if i.opcode == "slice"]
    assert sorted(i.attrs["slice"].dims[2].start for i in body_slices) == [64, 128]
    assert len(att.operands) == 2, c.as_text()


def test_with_dot_merger_refuses_a_spec_it_does_not_know():
    from passes.base import PassError
    assert with_dot_merger(CPU_MERGED) == CPU_MERGED
    with pytest.raises(PassError, match="with_dot_merger expects a spec starting with"):
        with_dot_merger("fusion,schedule")


def test_explain_fusion_names_the_slices_read_in_place():
    from passes.fusion.explain import EXPLAIN_PIPELINE, explain
    p, x = _params(), _x(2, 160, 64)
    _, report = explain(hlo.from_jax(_block, p, x), "h200",
                        prepare=EXPLAIN_PIPELINE + ",dot-merger")
    reasons = {d.reason for d in report.decisions if d.action == "attention" and d.fused}
    assert any("of %dot_merged are read in place through strides" in r for r in reasons), \
        reasons


@pytest.fixture
def triton_attention_on_cpu(monkeypatch):
    """The CPU backend runs attention fusions through the Triton kernel (interpreter)."""
    import os
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check runs without a GPU (the gpu test covers it)")
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton's first import
    pytest.importorskip("triton")
    from codegen.cpu import attention as cpu_attention
    from codegen.triton.attention import flash_attention

    def call(self, *operands):
        return flash_attention(self.fusion, [torch.from_numpy(np.array(a))
                                             for a in operands]).numpy()
    monkeypatch.setattr(cpu_attention.AttentionKernel, "__call__", call)


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("name", ["block", "gqa"])
def test_triton_kernel_reads_the_merged_projection_through_strides(name):
    from codegen.triton.attention import operand_view, plan_for
    p = _params(kv_width=2 * HD) if name == "gqa" else _params()
    f, x = (_gqa if name == "gqa" else _block), _x(2, 160, 64)
    c = _check(f, (p, x), tol=1e-4)
    att = next(i for i in c.module.entry.instructions if i.opcode == "fusion"
               and fusion_kind(i) == "attention")
    plan = plan_for(att)
    assert len(plan.views) == 3 and {k for k, _ in plan.views} == {0}
    import torch
    base = torch.zeros(tuple(att.operands[0].shape.dims))
    for _, chain in plan.views:      # column slices split into heads: views, no copies
        assert operand_view(base, chain).untyped_storage().data_ptr() == \
            base.untyped_storage().data_ptr()



@pytest.mark.gpu
@pytest.mark.parametrize("name", ["block", "gqa", "cross"])
def test_gpu_merged_projections_match_jax(name):
    from runtime.cuda import executable_of
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    p = _params(kv_width=2 * HD, d=256) if name == "gqa" else _params(d=256)
    p = {k: v.astype(bf) for k, v in p.items()}
    x = _x(2, 512, 256).astype(bf)
    f, args = {"block": (_block, (p, x)), "gqa": (_gqa, (p, x)),
               "cross": (_cross, (p, x, _x(2, 384, 256, seed=5).astype(bf)))}[name]
    compiled = runtime.jit(f, backend="cuda", pipeline=CUDA_MERGED).lower(*args).compile()
    assert any(i.name == "dot_merged" for i in compiled.module.entry.instructions)
    got = np.asarray(compiled(*args), np.float64)
    want = np.asarray(jax.jit(f)(*args), np.float64)
    # bf16 scores: XLA's softmax rounds them in bf16, the kernel keeps f32 (a few bf16
    # ulps apart in 0.1% of the outputs, the block case on the H200)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=0.15)
    # the attention kernel reads the merged result through strides: no host fallback
    assert not executable_of(compiled).host_fallbacks(), executable_of(compiled).describe()
