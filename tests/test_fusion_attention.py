"""Flash-attention fusion: plain JAX attention recognized in HLO and run blocked.

Every variant is checked against jax.jit on the same inputs; the fused module must hold one
``__flash_attention`` fusion (or, for a near miss, none and a reason in the report).
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import hlo  # noqa: E402
import runtime  # noqa: E402
from codegen.cpu import attention as cpu_attention  # noqa: E402
from passes.fusion import fusion_kind, report_for  # noqa: E402


def _attention(causal=False, bias=None, mask=None, upcast=True, heads_first=False,
               fill=-1e30, scale_on_scores=True):
    """Attention as people write it: einsum, where-mask, softmax, einsum."""
    def f(q, k, v, *extra):
        spec = "bhqd,bhkd->bhqk" if heads_first else "bqhd,bkhd->bhqk"
        d = q.shape[-1]
        if not scale_on_scores:
            q = q * (1.0 / np.sqrt(d)).astype(q.dtype)
        s = jnp.einsum(spec, q, k)
        if upcast:
            s = s.astype(jnp.float32)
        if scale_on_scores:
            s = s / np.sqrt(d).astype(s.dtype)
        it = iter(extra)
        if bias is not None:
            s = s + next(it)
        if causal:
            sq, sk = s.shape[-2:]
            s = jnp.where(jnp.tril(jnp.ones((sq, sk), bool)), s, fill)
        if mask is not None:
            s = jnp.where(next(it), s, fill)
        p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        out = "bhqk,bhkd->bhqd" if heads_first else "bhqk,bkhd->bqhd"
        return jnp.einsum(out, p, v)
    return f


def _inputs(shape, dtype=np.float32, n=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


def _bias_mask_case(batch: int, d: int):
    """Heads-first attention with an additive bias and a per-batch key mask (key 0 always
    kept, so no row is fully masked): (f, q, k, v, bias, mask), 2 heads, 24 positions."""
    q, k, v = _inputs((batch, 2, 24, d))
    bias = np.random.default_rng(1).standard_normal((1, 2, 24, 24)).astype(np.float32)
    mask = np.random.default_rng(2).random((batch, 1, 1, 24)) > 0.3
    mask[..., 0] = True
    return _attention(bias=True, mask=True, heads_first=True), q, k, v, bias, mask


def _attention_fusions(compiled) -> list:
    return [i for c in compiled.module.computations for i in c.instructions
            if i.opcode == "fusion" and fusion_kind(i) == "attention"]


def _check(f, args, tol=2e-5, target=None, expect=1):
    jf = runtime.jit(f, target=target) if target else runtime.jit(f)
    compiled = jf.lower(*args).compile()
    assert len(_attention_fusions(compiled)) == expect, compiled.as_text()
    got = np.asarray(jf(*args), np.float32)
    want = np.asarray(jax.jit(f)(*args), np.float32)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return compiled


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # Several key blocks, the last one partial, on small shapes.
    monkeypatch.setattr(cpu_attention, "BLOCK_K", 16)


def test_causal_iota_mask_f32_matches_jax():
    q, k, v = _inputs((2, 37, 3, 8))
    c = _check(_attention(causal=True), (q, k, v))
    (fa,) = _attention_fusions(c)
    assert '"causal":true' in str(fa.attrs["backend_config"])


def test_bf16_with_and_without_f32_upcast():
    import ml_dtypes
    q, k, v = _inputs((1, 40, 2, 16), ml_dtypes.bfloat16)
    _check(_attention(causal=True, upcast=True), (q, k, v), tol=2e-2)
    _check(_attention(causal=False, upcast=False), (q, k, v), tol=3e-2)


def test_bias_and_boolean_mask_arguments_heads_first():
    f, *args = _bias_mask_case(batch=2, d=8)
    c = _check(f, tuple(args))
    cfg = str(_attention_fusions(c)[0].attrs["backend_config"])
    assert '"bias":true' in cfg and '"mask":true' in cfg


def test_scale_folded_into_q_and_minus_inf_fill():
    q, k, v = _inputs((1, 33, 2, 8))
    _check(_attention(causal=True, fill=-jnp.inf, scale_on_scores=False), (q, k, v))


def test_gqa_repeated_kv_heads():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 20, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 20, 2, 8)).astype(np.float32) for _ in range(2))
    base = _attention(causal=True)

    def repeat(q, k, v):
        return base(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2))

    def grouped(q, k, v):      # q heads as [kv head, group]: no repeat materialized
        b, s, h, d = q.shape
        qg = q.reshape(b, s, 2, h // 2, d)
        sc = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k) / np.sqrt(d)
        sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
        p = jax.nn.softmax(sc, axis=-1)
        return jnp.einsum("bhgqk,bkhd->bqhgd", p, v).reshape(b, s, h, d)
    _check(repeat, (q, k, v))
    _check(grouped, (q, k, v))


def test_near_miss_returned_weights_is_explained():
    q, k, v = _inputs((1, 16, 2, 8))

    def with_weights(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v), p
    jf = runtime.jit(with_weights)
    compiled = jf.lower(q, k, v).compile()
    assert not _attention_fusions(compiled)
    report = report_for(compiled.module)
    notes = "\n".join(report.pattern_notes())
    assert "no flash-attention fusion" in notes and "outside" in notes, report.table()
    got, _ = jf(q, k, v)
    np.testing.assert_allclose(got, jax.jit(with_weights)(q, k, v)[0], rtol=2e-5, atol=2e-5)


def test_text_round_trip_runs_the_same():
    q, k, v = _inputs((1, 24, 2, 8))
    c = _check(_attention(causal=True), (q, k, v))
    parsed = hlo.parse_hlo(c.as_text())
    (fa,) = [i for comp in parsed.computations for i in comp.instructions
             if i.opcode == "fusion" and fusion_kind(i) == "attention"]
    got = cpu_attention.AttentionKernel(fa)(q, k, v)
    want = np.asarray(jax.jit(_attention(causal=True))(q, k, v))
    # the einsum's output transpose [b,h,d,q] -> [b,q,h,d] is inside the fusion
    assert fa.shape.dims == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_deviceless_h200_buffers_hold_no_score_tensor():
    b, s, h, d = 2, 64, 4, 16
    q, k, v = _inputs((b, s, h, d))
    c = _check(_attention(causal=True), (q, k, v), target="h200")
    scores = b * h * s * s * 4
    mem = c.memory_analysis()
    assert mem.temp_size_in_bytes < scores
    buffers = c.buffer_assignment().buffers
    assert buffers and max(bf.size for bf in buffers) < scores


def _grad_case(f, args, tol, target=None):
    """jax.grad of sum(o² · w) for q, k, v through hlotk (one forward and one backward
    attention fusion) against jax.jit."""
    w = np.random.default_rng(9).standard_normal(
        np.asarray(jax.eval_shape(f, *args).shape)).astype(np.float32)

    def loss(q, k, v, *extra):
        return jnp.sum(f(q, k, v, *extra).astype(jnp.float32) ** 2 * w)
    g = jax.grad(loss, argnums=(0, 1, 2))
    jf = runtime.jit(g, target=target) if target else runtime.jit(g)
    compiled = jf.lower(*args).compile()
    kinds = [fusion_kind(i) for c in compiled.module.computations for i in c.instructions
             if i.opcode == "fusion"]
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1, \
        compiled.as_text()
    for a, b in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol)
    return compiled


@pytest.fixture
def small_backward_blocks(monkeypatch):
    from codegen.cpu import attention_backward
    monkeypatch.setattr(attention_backward, "BLOCK_K", 16)


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("case", ["causal", "bias_mask", "gqa", "gqa_grouped2", "gqa_grouped4",
                                  "gqa_grouped4_bf16", "causal_bf16"])
def test_gradient_fused_forward_and_backward_match_jax(case):
    if case == "gqa_grouped4_bf16":
        import ml_dtypes
        args = tuple(a.astype(ml_dtypes.bfloat16) for a in _grouped_inputs(4, s=40))
        _grad_case(_grouped_gqa, args, 3e-2)
    elif case.startswith("gqa_grouped"):
        # the grouped einsum: dK and dV sum over the group inside the backward fusion;
        # 37 keys in blocks of 16 (the last one partial)
        _grad_case(_grouped_gqa, _grouped_inputs(int(case[-1]), s=37), 5e-5)
    elif case == "causal":
        _grad_case(_attention(causal=True), _inputs((1, 37, 2, 8)), 5e-5)
    elif case == "bias_mask":
        f, q, k, v, bias, mask = _bias_mask_case(batch=2, d=8)
        _grad_case(lambda q, k, v: f(q, k, v, bias, mask), (q, k, v), 5e-5)
    elif case == "gqa":
        rng = np.random.default_rng(3)
        q = rng.standard_normal((2, 20, 4, 8)).astype(np.float32)
        k, v = (rng.standard_normal((2, 20, 2, 8)).astype(np.float32) for _ in range(2))
        base = _attention(causal=True)
        _grad_case(lambda q, k, v: base(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)),
                   (q, k, v), 5e-5)
    else:
        import ml_dtypes
        _grad_case(_attention(causal=True), _inputs((1, 40, 2, 16), ml_dtypes.bfloat16), 3e-2)


def test_gradient_deviceless_h200_buffers_hold_no_score_tensor():
    b, s, h, d = 1, 256, 2, 16
    c = _grad_case(_attention(causal=True), _inputs((b, s, h, d)), 5e-5, target="h200")
    scores = b * h * s * s * 4
    buffers = c.buffer_assignment().buffers
    assert buffers and max(bf.size for bf in buffers) < scores
    assert c.memory_analysis().temp_size_in_bytes < scores


def test_gradient_with_bias_gradient_is_explained_not_fused():
    """A gradient w.r.t. the bias reads dS itself: the backward is not fused and the note
    says which instruction is read outside it."""
    q, k, v = _inputs((1, 2, 16, 8))
    bias = np.random.default_rng(1).standard_normal((1, 2, 16, 16)).astype(np.float32)
    f = _attention(bias=True, heads_first=True)
    g = jax.grad(lambda q, k, v, b: jnp.sum(f(q, k, v, b) ** 2), argnums=(0, 1, 2, 3))
    jf = runtime.jit(g)
    for a, b in zip(jf(q, k, v, bias), jax.jit(g)(q, k, v, bias)):
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=5e-5)
    report = report_for(jf.lower(q, k, v, bias).compile().module)
    (note,) = [n for n in report.pattern_notes() if "backward is not matched" in n]
    assert "outside it" in note, note


# --- the Triton kernel: TRITON_INTERPRET=1 on the CPU, the real thing on a GPU -------------
def _triton_case(f, args, tol):
    import os
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from codegen.triton.attention import flash_attention
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    c = runtime.jit(f, target="h200").lower(*args).compile()
    (fa,) = _attention_fusions(c)
    # The fusion's operand values, from the interpreter run of the compiled module.
    from hlo.evaluator.core import EvalContext, Evaluator
    by_name = {p.name: np.asarray(a) for p, a in zip(c.module.entry.parameters, args)}
    ev = Evaluator(trace=lambda i, val: by_name.__setitem__(i.name, val))
    ev.run_computation(c.module.entry, [np.asarray(a) for a in args], EvalContext(ev))
    ins = [torch.from_numpy(np.asarray(by_name[o.name]).astype(np.float32)).to(dev)
           .to(torch.bfloat16 if o.shape.dtype.name == "bf16" else
               torch.float16 if o.shape.dtype.name == "f16" else
               torch.bool if o.shape.dtype.name == "pred" else torch.float32)
           for o in fa.operands]
    got = flash_attention(fa, ins).float().cpu().numpy()
    want = cpu_attention.AttentionKernel(fa)(*[np.asarray(by_name[o.name]) for o in fa.operands])
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=tol, atol=tol)
    want_jax = np.asarray(jax.jit(f)(*args), np.float32)
    np.testing.assert_allclose(np.asarray(c(*args), np.float32), want_jax, rtol=tol, atol=tol)
    return fa


def _masked_rows_case():
    """Heads-first attention whose boolean mask drops every key of some query rows, filled
    with float32's lowest finite value: those rows average v uniformly (jax.nn.softmax
    over equal scores), which the kernel's log2-unit fill must keep finite to reproduce."""
    q, k, v = _inputs((1, 2, 70, 16), seed=7)
    mask = np.random.default_rng(8).random((1, 1, 70, 70)) > 0.5
    mask[..., 5, :] = False
    mask[..., 64:, :] = False
    return (_attention(mask=True, heads_first=True, fill=float(jnp.finfo(jnp.float32).min)),
            (q, k, v, mask))


def _sliding_window(q, k, v):
    """Causal attention over the last 16 keys: two iota compares (a band the kernels test)."""
    n = q.shape[1]
    i = jnp.arange(n)
    keep = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 16)
    s = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.25, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def _negative_scale(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * -0.3
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("case", ["causal_f32", "causal_long_f32", "bias_mask_f32", "gqa_f32",
                                  "plain_even_f32", "odd_head_dim_f32", "masked_rows_f32",
                                  "negative_scale_f32", "jax_nn_gqa_f32", "sliding_window_f32"])
def test_triton_flash_attention_kernel(case):
    if case == "jax_nn_gqa_f32":
        # jax.nn's grouped form: rows [t, g], its causal compare on t (the kernel counts the
        # query position every g rows)
        q = _inputs((1, 40, 8, 16), n=1)[0]
        k, v = _inputs((1, 40, 2, 16), n=2, seed=1)
        _triton_case(_jax_nn_attention(True), (q, k, v), 1e-4)
    elif case == "sliding_window_f32":
        _triton_case(_sliding_window, _inputs((1, 70, 2, 16)), 1e-4)
    elif case == "plain_even_f32":
        # keys a multiple of the key block: no edge block, no key bound (EVEN_N)
        _triton_case(_attention(), _inputs((1, 64, 2, 16)), 1e-4)
    elif case == "odd_head_dim_f32":
        # head dim 24 < its 32-wide block: the head-dim bounds stay (EVEN_D off)
        _triton_case(_attention(causal=True), _inputs((1, 100, 2, 24)), 1e-4)
    elif case == "masked_rows_f32":
        f, args = _masked_rows_case()
        _triton_case(f, args, 1e-4)
    elif case == "negative_scale_f32":
        # a negative scale takes the general path: the max of scaled scores is not the
        # scaled max, and scores spread over hundreds would overflow exp2 with the wrong one
        _triton_case(_negative_scale, [8 * x for x in _inputs((1, 80, 2, 16))], 1e-4)
    elif case == "causal_f32":
        _triton_case(_attention(causal=True), _inputs((1, 37, 2, 16)), 1e-4)
    elif case == "causal_long_f32":
        # query blocks past the first: key blocks below the diagonal run unmasked
        _triton_case(_attention(causal=True), _inputs((1, 150, 1, 16)), 1e-4)
    elif case == "bias_mask_f32":
        f, *args = _bias_mask_case(batch=1, d=16)
        _triton_case(f, tuple(args), 1e-4)
    else:
        rng = np.random.default_rng(4)
        q = rng.standard_normal((1, 40, 4, 32)).astype(np.float32)
        k, v = (rng.standard_normal((1, 40, 2, 32)).astype(np.float32) for _ in range(2))
        base = _attention(causal=True)
        fa = _triton_case(lambda q, k, v: base(q, jnp.repeat(k, 2, axis=2),
                                               jnp.repeat(v, 2, axis=2)), (q, k, v), 1e-4)
        # the kernel reads the two shared heads in place: no repeated copy is an operand
        assert sorted(tuple(o.shape.dims) for o in fa.operands) == \
            [(1, 40, 2, 32), (1, 40, 2, 32), (1, 40, 4, 32)], [o.shape for o in fa.operands]


def _growing_scores(seed: int = 9, s: int = 150, d: int = 16) -> list:
    """q, k, v whose scores climb by ~1 per key: each later key block raises the row max
    by far more than 2^8 in the kernel's log2 units, 2^200 over the row (past f32 unless the
    running sums are rescaled)."""
    rng = np.random.default_rng(seed)
    q = np.ones((1, s, 2, d), np.float32) + 0.1 * rng.standard_normal((1, s, 2, d))
    ramp = (np.arange(s) / np.sqrt(d)).astype(np.float32)[None, :, None, None]
    k = ramp * np.ones((1, s, 2, d), np.float32) + 0.1 * rng.standard_normal((1, s, 2, d))
    return [q.astype(np.float32), k.astype(np.float32),
            rng.standard_normal((1, s, 2, d)).astype(np.float32)]


@pytest.mark.parametrize("case", ["causal_long", "growing", "falling"])
def test_triton_flash_attention_running_max(case):
    """The online softmax's rescaling: scores that stay level, climb block after block past
    f32's range (wrong without the rescale), or fall."""
    if case == "causal_long":
        args = _inputs((1, 150, 1, 16), seed=10)
    else:
        args = _growing_scores()
        if case == "falling":
            args[1] = args[1][:, ::-1].copy()
    _triton_case(_attention(causal=True), args, 1e-4)


# Triton's interpreter (3.9) miscomputes bf16 tl.dot (a 16x16 product is off by 1e10), so
# the half-precision kernels are checked on a GPU only.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,s", [("bf16", 128, 200), ("f16", 64, 129), ("bf16", 256, 70)])
def test_triton_flash_attention_half_precision_gpu(dtype, d, s):
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, s, 3, d)).astype(dt) for _ in range(3))
    _triton_case(_attention(causal=True), (q, k, v), 2e-2)


@pytest.mark.gpu
def test_flash_attention_end_to_end_cuda():
    import ml_dtypes
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 300, 4, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
    f = _attention(causal=True)
    jf = runtime.jit(f, backend="cuda")
    assert len(_attention_fusions(jf.lower(q, k, v).compile())) == 1
    got = np.asarray(jf(q, k, v), np.float32)
    np.testing.assert_allclose(got, np.asarray(jax.jit(f)(q, k, v), np.float32),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_repeated_kv_heads_are_read_in_place():
    """K and V heads jnp.repeat'ed for query groups (8 query heads, 2 K/V heads, bf16, keys
    not a multiple of the block): the attention fusion takes the 2-head tensors, and the
    executable writes no repeated copy, with jax.jit's result."""
    import ml_dtypes
    from runtime.cuda import executable_of
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 300, 8, 64)).astype(ml_dtypes.bfloat16)
    k, v = (rng.standard_normal((2, 300, 2, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    base = _attention(causal=True)

    def f(q, k, v):
        return base(q, jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2))
    compiled = runtime.jit(f, backend="cuda").lower(q, k, v).compile()
    (fa,) = _attention_fusions(compiled)
    assert sorted(tuple(o.shape.dims) for o in fa.operands) == \
        [(2, 300, 2, 64), (2, 300, 2, 64), (2, 300, 8, 64)]
    exe = executable_of(compiled)
    assert exe.kernel_count().get("kernel", 0) + exe.kernel_count().get("copy", 0) == 0, \
        exe.describe()
    got = np.asarray(compiled(q, k, v), np.float32)
    np.testing.assert_allclose(got, np.asarray(jax.jit(f)(q, k, v), np.float32),
                               rtol=2e-2, atol=2e-2)


def test_gpu_layouts_read_qkv_in_place_and_write_the_consumer_layout():
    """With the CUDA pipeline's layout assignment, the attention dots are kernel dots, not
    cuBLAS GEMMs: q, k, v keep their [b,s,h,d] layouts (no copies) and the einsum's output
    transpose is inside the fusion, so the program is one kernel with no temp buffer."""
    from passes.pipelines import PIPELINES
    q, k, v = _inputs((1, 40, 2, 16))
    f = _attention(causal=True)
    jf = runtime.jit(f, target="h200", pipeline=PIPELINES["default"]["cuda"])
    c = jf.lower(q, k, v).compile()
    assert [i.opcode for i in c.module.entry.instructions] == ["parameter"] * 3 + ["fusion"]
    assert c.memory_analysis().temp_size_in_bytes == 0
    np.testing.assert_allclose(jf(q, k, v), jax.jit(f)(q, k, v), rtol=2e-5, atol=2e-5)



# --- the backward on the GPU pipeline and its Triton kernels ------------------------------------
def _loss_grad(f, args):
    """jax.grad w.r.t. q, k, v of sum(o² · w) (a fixed random w), extra args not
    differentiated."""
    w = np.random.default_rng(9).standard_normal(
        np.asarray(jax.eval_shape(f, *args).shape)).astype(np.float32)
    return jax.grad(lambda q, k, v, *e: jnp.sum(f(q, k, v, *e).astype(jnp.float32) ** 2 * w),
                    argnums=(0, 1, 2))


def _grouped_gqa(q, k, v):
    """Causal attention with q heads as [kv head, group] (no repeat materialized)."""
    b, s, h, d = q.shape
    qg = q.reshape(b, s, k.shape[2], h // k.shape[2], d)
    sc = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k) / np.sqrt(d)
    sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
    p = jax.nn.softmax(sc, axis=-1)
    return jnp.einsum("bhgqk,bkhd->bqhgd", p, v).reshape(b, s, h, d)


def _grouped_variant(scale_q=False, group_major=False):
    """The grouped form with the scale folded into q (the CUDA layout assignment puts a
    layout copy after the scores' transpose) or with q heads as [group, kv head]."""
    def f(q, k, v):
        b, s, h, d = q.shape
        kv = k.shape[2]
        qg = q.reshape(b, s, h // kv, kv, d) if group_major else q.reshape(b, s, kv, h // kv, d)
        spec = "bqghd" if group_major else "bqhgd"
        if scale_q:
            qg = qg * (1.0 / np.sqrt(d)).astype(q.dtype)
        sc = jnp.einsum(f"{spec},bkhd->bhgqk", qg, k)
        if not scale_q:
            sc = sc / np.sqrt(d)
        sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
        p = jax.nn.softmax(sc, axis=-1)
        return jnp.einsum(f"bhgqk,bkhd->{spec}", p, v).reshape(b, s, h, d)
    return f


def _grouped_inputs(group: int, s: int, d: int = 16, kv_heads: int = 2, batch: int = 1):
    """(q, k, v) with ``group`` query heads per K/V head."""
    rng = np.random.default_rng(13 + group)
    q = rng.standard_normal((batch, s, kv_heads * group, d)).astype(np.float32)
    k, v = (rng.standard_normal((batch, s, kv_heads, d)).astype(np.float32) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("group", [2, 4])
def test_grouped_gqa_gradient_deviceless_h200_has_no_score_tensor(group):
    """jax.grad of the grouped einsum form compiles to one forward and one backward
    attention fusion (the group folded into the rows of each K/V head): no buffer holds
    the B·H·G·S·S scores, the backward outputs dK and dV in K/V's shape (summed over the
    group), and the CPU backend's gradients equal jax.jit's."""
    b, s, kv, d = 1, 128, 2, 16
    args = _grouped_inputs(group, s=s, d=d, kv_heads=kv, batch=b)
    c = _grad_case(_grouped_gqa, args, 5e-5, target="h200")
    scores = b * kv * group * s * s * 4
    assert max(bf.size for bf in c.buffer_assignment().buffers) < scores
    assert c.memory_analysis().temp_size_in_bytes < scores
    (bwd,) = [i for comp in c.module.computations for i in comp.instructions
              if i.opcode == "fusion" and fusion_kind(i) == "attention_backward"]
    # dQ has every query head; dK and dV one per K/V head (summed over the group inside)
    sizes = sorted(int(np.prod(e.dims)) for e in bwd.shape.elements)
    assert sizes == [b * s * kv * d, b * s * kv * d, b * s * kv * group * d], bwd.shape


def test_explain_fusion_names_the_grouped_gqa_backward(tmp_path, capsys):
    """``hlotk explain-fusion`` on jax.grad of the grouped form: the forward and backward
    fusions' reasons say what was matched, the group size and that dK/dV sum over it."""
    from runtime.cli import main
    args = _grouped_inputs(4, s=24)
    src = tmp_path / "gqa_grad.mlir"
    src.write_text(jax.jit(_loss_grad(_grouped_gqa, args)).lower(*args).as_text())
    assert main(["explain-fusion", str(src), "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "flash attention: q·k, softmax and ·v in one kernel" in out, out
    assert "grouped-query heads: 4 query heads share each K/V head" in out, out
    bwd = [line for line in out.splitlines() if "flash-attention backward" in line]
    assert bwd and all("dK and dV sum over the group inside the kernel" in line
                       for line in bwd), out
    assert all("reads the forward's output" in line for line in bwd), out
    assert "no flash-attention fusion" not in out, out


@pytest.mark.parametrize("argnums,missing,wrt", [((0, 2), "dK = dS^T.Q", "k"),
                                                 ((1, 2), "dQ = dS.K", "q"),
                                                 ((0, 1), "dV = P^T.dO", "v")])
def test_grouped_gqa_partial_gradient_says_which_part_is_missing(tmp_path, capsys, argnums,
                                                                 missing, wrt):
    """A gradient that skips one of q, k, v has no dK (or dQ, dV) dot: the fused backward
    computes all three, so nothing is fused, and explain-fusion says which part is missing
    and why; the unfused program still equals jax.jit."""
    from runtime.cli import main
    args = _grouped_inputs(2, s=24)
    g = jax.grad(lambda q, k, v: jnp.sum(_grouped_gqa(q, k, v) ** 2), argnums=argnums)
    src = tmp_path / "partial.mlir"
    src.write_text(jax.jit(g).lower(*args).as_text())
    assert main(["explain-fusion", str(src), "--target", "h200"]) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if "the backward is not matched" in line]
    assert f"{missing} is not in this gradient" in note, note
    assert f"not taken with respect to {wrt}" in note, note
    jf = runtime.jit(g)
    assert not _attention_fusions(jf.lower(*args).compile())
    for a, b in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=5e-5)


def _backward_case(name: str):
    """(f, args) of the gradient cases: masks, bias, repeated KV heads, ragged lengths."""
    rng = np.random.default_rng(11)
    if name == "causal":
        return _attention(causal=True), _inputs((1, 37, 2, 16))
    if name == "causal_long":      # several query/key blocks, some below the diagonal
        return _attention(causal=True), _inputs((1, 150, 1, 16))
    if name == "plain":
        return _attention(), _inputs((2, 45, 2, 16))
    if name == "bias_mask":
        f, q, k, v, bias, mask = _bias_mask_case(batch=2, d=16)
        return f, (q, k, v, bias, mask)
    if name == "gqa_grouped_scale_q":
        return _grouped_variant(scale_q=True), _grouped_inputs(2, s=70)
    if name == "gqa_grouped_group_major":
        return _grouped_variant(group_major=True), _grouped_inputs(4, s=70)
    if name.startswith("gqa_grouped"):     # 70 keys: two or three key blocks per kernel
        return _grouped_gqa, _grouped_inputs(int(name[-1]), s=70)
    q = rng.standard_normal((2, 20, 4, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 20, 2, 16)).astype(np.float32) for _ in range(2))
    base = _attention(causal=True)
    return (lambda q, k, v: base(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2))), \
        (q, k, v)


def _gpu_pipeline_grad(f, args):
    from passes.pipelines import PIPELINES
    g = _loss_grad(f, args)
    jf = runtime.jit(g, target="h200", pipeline=PIPELINES["default"]["cuda"])
    c = jf.lower(*args).compile()
    kinds = [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1, \
        c.as_text()
    return g, jf, c


@pytest.mark.usefixtures("small_backward_blocks")
def test_gradient_cuda_pipeline_fuses_forward_and_backward():
    """The CUDA pipeline's layout assignment leaves the backward dots' operands in place
    (no `%q.copy` between the forward's q·k and dK = dS^T.Q), so both fuse; no buffer
    holds the B·H·S·S scores; the CPU backend's run equals jax.jit."""
    b, s, h, d = 1, 256, 2, 16
    args = _inputs((b, s, h, d))
    g, jf, c = _gpu_pipeline_grad(_attention(causal=True), args)
    scores = b * h * s * s * 4
    assert max(bf.size for bf in c.buffer_assignment().buffers) < scores
    assert not [i for i in c.module.entry.instructions if i.opcode == "copy"
                and i.operands[0].opcode == "parameter"], c.as_text()
    for a, want in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(a, want, rtol=5e-5, atol=5e-5)


@pytest.fixture
def triton_attention_on_cpu(monkeypatch):
    """The CPU backend runs attention fusions through the Triton kernels (interpreter)."""
    import os
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check runs without a GPU (the gpu tests cover it)")
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton's first import
    pytest.importorskip("triton")
    from codegen.cpu import attention_backward as cpu_backward
    from codegen.triton.attention import flash_attention
    from codegen.triton.attention_backward import flash_attention_backward

    def on_cpu(run):
        def call(self, *operands):
            out = run(self.fusion, [torch.from_numpy(np.array(a))
                                    for a in operands])
            return tuple(t.numpy() for t in out) if isinstance(out, tuple) else out.numpy()
        return call
    monkeypatch.setattr(cpu_attention.AttentionKernel, "__call__", on_cpu(flash_attention))
    monkeypatch.setattr(cpu_backward.AttentionBackwardKernel, "__call__",
                        on_cpu(flash_attention_backward))


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("case,use_o", [
    ("causal", True), ("causal_long", True), ("plain", True), ("bias_mask", True),
    ("gqa", True), ("gqa_grouped2", True), ("gqa_grouped4", True),
    ("gqa_grouped_scale_q", True), ("gqa_grouped_group_major", True),
    ("causal_long", False), ("bias_mask", False), ("gqa_grouped2", False),
    ("gqa_grouped_group_major", False)])
def test_triton_attention_backward_kernels_match_jax_grad(case, use_o, monkeypatch):
    """jax.grad through the CUDA pipeline with the forward-with-row-stats and the backward
    Triton kernels (TRITON_INTERPRET=1, f32) equals jax.jit's gradient: the exp2 path
    (causal, plain, grouped heads) and the general one (bias and mask); delta from the
    forward's output O (the fusion reads it) and, with use_o off, by the rowsum(P∘dP)
    kernel."""
    from codegen.triton import attention_backward as tri_backward
    monkeypatch.setattr(tri_backward, "_USE_O", use_o)
    f, args = _backward_case(case)
    g, jf, _ = _gpu_pipeline_grad(f, args)
    for a, want in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["causal", "gqa_grouped2", "gqa_grouped_group_major",
                                  "bias_mask"])
def test_backward_fusion_reads_forward_output(case):
    """The backward fusion's last operand is the forward fusion's output O, and its backend
    config maps O's dims onto dO's (as [batch, rows in the scores' order, dv]): delta =
    rowsum(dO*O) computed from them equals rowsum(P*dP) of the unfused program, i.e. the
    o_perm permutes O exactly as dO is read."""
    from passes.fusion.attention_grad import forward_output_perm
    f, args = _backward_case(case)
    _g, _jf, c = _gpu_pipeline_grad(f, args)
    entry = c.module.entry.instructions
    bwd = [i for i in entry if i.opcode == "fusion" and fusion_kind(i) == "attention_backward"]
    fwd = [i for i in entry if i.opcode == "fusion" and fusion_kind(i) == "attention"]
    assert len(bwd) == 1 and len(fwd) == 1
    o = bwd[0].operands[-1]
    assert o.opcode == "get-tuple-element" and o.operands[0] is fwd[0], o
    perm = forward_output_perm(bwd[0])
    assert perm is not None and sorted(perm) == list(range(o.shape.rank))
    # O's dims in that order are [batch..., rows..., dv]: the batch and row sizes of q's
    # scores and v's head dim
    dims = [o.shape.dims[d] for d in perm]
    assert dims[-1] == args[2].shape[-1]
    assert int(np.prod(dims[:-1])) == int(np.prod(args[0].shape[:-1]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,s,case", [
    ("bf16", 128, 200, "causal"), ("f16", 64, 129, "causal"), ("bf16", 256, 70, "causal"),
    ("f32", 64, 100, "causal"), ("bf16", 64, 300, "plain"), ("f32", 32, 24, "bias_mask"),
    ("f32", 16, 20, "gqa"), ("f32", 16, 70, "gqa_grouped2"), ("f32", 16, 70, "gqa_grouped4"),
    ("bf16", 64, 200, "gqa_grouped4"), ("bf16", 128, 129, "gqa_grouped2"),
    ("bf16", 64, 200, "jax_nn"), ("f32", 32, 70, "jax_nn"), ("f32", 32, 70, "hand_softmax")])
def test_attention_gradient_cuda_kernels(dtype, d, s, case):
    """runtime.jit(jax.grad(loss), backend="cuda"): both attention fusions run as Triton
    kernels (no host fallback) and the gradients equal jax.jit's."""
    import ml_dtypes
    from runtime.cuda import executable_of
    dt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[dtype]
    if case.startswith("gqa_grouped"):
        f = _grouped_gqa
        args = tuple(a.astype(dt) for a in _grouped_inputs(int(case[-1]), s=s, d=d, batch=2))
    elif case in ("bias_mask", "gqa"):
        f, args = _backward_case(case)
    else:
        rng = np.random.default_rng(12)
        f = {"jax_nn": _jax_nn_attention(True), "hand_softmax": _hand_softmax_attention}.get(
            case) or _attention(causal=case == "causal")
        args = tuple(rng.standard_normal((2, s, 3, d)).astype(dt) for _ in range(3))
    g = _loss_grad(f, args)
    jf = runtime.jit(g, backend="cuda")
    c = jf.lower(*args).compile()
    kinds = [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1
    assert not [t for t in executable_of(c).host_fallbacks() if "attention" in t.reason]
    tol = 1e-4 if dtype == "f32" else 3e-2
    # jax.jit's f32 dots on a GPU default to TF32 (~7e-4 relative error here, measured on
    # an H200); the kernels' f32 dots are IEEE, so the reference asks for full precision.
    with jax.default_matmul_precision("highest"):
        wants = jax.jit(g)(*args)
    for a, want in zip(jf(*args), wants):
        a, want = np.asarray(a, np.float32), np.asarray(want, np.float32)
        err = np.linalg.norm(a - want) / np.linalg.norm(want)
        assert err < tol, (case, dtype, err)


# --- jax.nn.dot_product_attention (implementation="xla"): its size-1 query-group axis is
# removed by the simplifier's size-1-dim rules (passes/degenerate_dims.py) ---
def _jax_nn_attention(causal: bool, scale=None, with_bias=False):
    def f(q, k, v, *bias):
        return jax.nn.dot_product_attention(q, k, v, bias=bias[0] if bias else None,
                                            scale=scale, is_causal=causal,
                                            implementation="xla")
    return f


@pytest.mark.parametrize("causal,scale,with_bias", [(True, None, False), (False, 0.3, False),
                                                    (True, None, True)])
def test_jax_nn_dot_product_attention_fuses(causal, scale, with_bias):
    args = _inputs((2, 40, 3, 16))
    if with_bias:
        args.append(np.random.default_rng(5).standard_normal((1, 3, 40, 40)).astype(np.float32))
    _check(_jax_nn_attention(causal, scale, with_bias), args, tol=2e-5, target="h200")


def test_jax_nn_dot_product_attention_grouped_kv_heads_fuses():
    """With 4 query heads per kv head jax.nn writes the scores [b,kv,t,g,s] and transposes
    them to [g,b,kv,t,s]; the simplifier moves that transpose below the softmax into the
    second dot (passes/transpose_sinking.py) and the forward fuses."""
    q = _inputs((2, 40, 8, 16), n=1)[0]
    k, v = _inputs((2, 40, 2, 16), n=2, seed=1)
    _check(_jax_nn_attention(True), (q, k, v), tol=2e-5, target="h200")


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("causal", [True, False])
def test_jax_nn_dot_product_attention_gradient_fuses(causal):
    """jax.grad of jax.nn.dot_product_attention: forward and backward fused on the CUDA
    pipeline (run here by the CPU backend), gradients equal jax.jit's, no score buffer."""
    b, s, h, d = 1, 64, 2, 16
    args = _inputs((b, s, h, d))
    g, jf, c = _gpu_pipeline_grad(_jax_nn_attention(causal), args)
    assert max(bf.size for bf in c.buffer_assignment().buffers) < b * h * s * s * 4
    for a, want in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(a, want, rtol=5e-5, atol=5e-5)


def _hand_softmax_attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.25
    s = jnp.where(jnp.tril(jnp.ones((s.shape[-1],) * 2, bool)), s, -1e30)
    e = jnp.exp(s - s.max(-1, keepdims=True))
    return jnp.einsum("bhqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), v)


@pytest.mark.usefixtures("small_backward_blocks")
def test_hand_written_softmax_gradient_through_its_max_fuses():
    """exp(s - s.max()) / sum without stop_gradient: jax.grad also differentiates the max
    (a compare with the row max, an argmax indicator times rowsum(dX) = 0); the backward
    still fuses and equals jax.jit."""
    args = _inputs((1, 48, 2, 16))
    g, jf, c = _gpu_pipeline_grad(_hand_softmax_attention, args)
    for a, want in zip(jf(*args), jax.jit(g)(*args)):
        np.testing.assert_allclose(a, want, rtol=5e-5, atol=5e-5)


def test_attention_forms_benchmark_reports_the_jax_nn_form_fused():
    """benchmarks/attention_forms.py (deviceless): jax.nn.dot_product_attention's forward is
    one attention fusion with no buffer as large as the bf16 scores."""
    from benchmarks.attention_forms import _forms, measure
    fn, qs, kvs = _forms()["jax.nn.dot_product_attention causal"]
    r = measure(fn, qs, kvs, grad=False)
    assert r["fwd"] == 1 and r["scores_in_memory"] is False, r
