"""Attention variants whose gradient fuses since issue 14's variants branch: jax.nn's
grouped-query form (scores [b, kv, t, g, s] with the causal compare on t, dP and dS in
other row orders), checked against jax.jit deviceless (the CPU backend's reference kernels
on the CUDA pipeline), through the Triton kernels in the interpreter, and on a GPU.

Tolerances: f32 2e-5 (blocked online softmax against XLA's one-pass softmax), bf16 3e-2
relative (the kernels round P and dS to bf16 where the unfused program does, but in
another summation order).
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import runtime  # noqa: E402
from passes.fusion import fusion_kind, report_for  # noqa: E402
from tests.test_heldout_programs import _score_sized  # noqa: E402
from tests.test_fusion_attention import (_gpu_pipeline_grad, _loss_grad,  # noqa: E402,F401
                                         small_backward_blocks, triton_attention_on_cpu)


@pytest.fixture(autouse=True)
def small_forward_blocks(monkeypatch):
    # several key blocks, the last one partial, on small shapes
    from codegen.cpu import attention
    monkeypatch.setattr(attention, "BLOCK_K", 16)


def _jax_nn(causal: bool = True):
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
    return f


def _gqa_inputs(s: int, heads: int, kv: int, d: int = 16, batch: int = 1, dtype=np.float32):
    rng = np.random.default_rng(100 + heads + kv + s)
    q = rng.standard_normal((batch, s, heads, d)).astype(dtype)
    k, v = (rng.standard_normal((batch, s, kv, d)).astype(dtype) for _ in range(2))
    return q, k, v


def _kinds(c) -> list:
    return [fusion_kind(i) for i in c.module.entry.instructions if i.opcode == "fusion"]


def _assert_fused_gradient(g, args, tol: float, label="", backend: str = "cpu") -> None:
    """``g`` (a jax.grad) through runtime.jit on ``backend``: one forward and one backward
    attention fusion (on "cuda" both Triton kernels: no host fallback), gradients equal
    jax.jit's at full f32 precision (relative Frobenius error below ``tol``)."""
    jf = runtime.jit(g, backend=backend)
    c = jf.lower(*args).compile()
    kinds = _kinds(c)
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1, kinds
    if backend == "cuda":
        from runtime.cuda import executable_of
        assert not [t for t in executable_of(c).host_fallbacks() if "attention" in t.reason]
    with jax.default_matmul_precision("highest"):
        wants = jax.jit(g)(*args)
    for a, want in zip(jf(*args), wants):
        a, want = np.asarray(a, np.float32), np.asarray(want, np.float32)
        assert np.linalg.norm(a - want) / np.linalg.norm(want) < tol, label


def _assert_close(got, want, tol):
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol)


# --- jax.nn.dot_product_attention with grouped kv heads: the gradient -----------------------
@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("heads,kv,s,causal", [(6, 2, 37, True), (8, 2, 40, True),
                                               (4, 2, 33, False)])
def test_jax_nn_gqa_gradient_fuses_on_the_cuda_pipeline(heads, kv, s, causal):
    """jax.grad of jax.nn.dot_product_attention with fewer kv heads than q heads: one
    forward and one backward attention fusion (dP is written [b, kv, g, t, s] and dS
    [g, b, kv, t, s] against scores [b, kv, t, g, s]), no buffer as large as the f32
    B·H·S·S scores, gradients equal jax.jit's (keys in blocks of 16, the last partial)."""
    args = _gqa_inputs(s, heads, kv)
    g, jf, c = _gpu_pipeline_grad(_jax_nn(causal), args)
    assert max(bf.size for bf in c.buffer_assignment().buffers) < heads * s * s * 4
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
def test_jax_nn_gqa_gradient_fuses_on_the_cpu_pipeline_bf16():
    """The CPU backend's own pipeline (its layouts) fuses the same gradient; bf16 inputs
    (P and dS rounded to bf16 as jax.jit rounds them)."""
    import ml_dtypes
    args = _gqa_inputs(40, 6, 2, batch=2, dtype=ml_dtypes.bfloat16)
    _assert_fused_gradient(_loss_grad(_jax_nn(True), args), args, 3e-2)


def test_explain_fusion_names_the_grouped_rows_of_the_jax_nn_backward():
    """The report says what was fused: the backward with grouped-query heads (dK and dV
    summed over the group inside the kernel)."""
    args = _gqa_inputs(24, 6, 2)
    _g, _jf, c = _gpu_pipeline_grad(_jax_nn(True), args)
    reasons = [d.reason for d in report_for(c.module).decisions if d.fused]
    assert any("flash-attention backward" in r and "3 query heads share each K/V head" in r
               for r in reasons), reasons


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("heads,kv,s,causal", [(6, 2, 40, True), (8, 2, 70, True),
                                               (4, 2, 40, False)])
def test_jax_nn_gqa_gradient_triton_kernels(heads, kv, s, causal):
    """The forward and backward Triton kernels (TRITON_INTERPRET=1, f32) on jax.nn's grouped
    form: rows [t, g] per kv head, the causal test counting the query position every
    Q_DIV = g rows; gradients equal jax.jit's."""
    args = _gqa_inputs(s, heads, kv)
    g, jf, _ = _gpu_pipeline_grad(_jax_nn(causal), args)
    _assert_close(jf(*args), jax.jit(g)(*args), 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,s,heads,kv", [("bf16", 128, 200, 8, 2), ("f32", 32, 70, 6, 2),
                                                ("bf16", 64, 129, 16, 4)])
def test_jax_nn_gqa_gradient_cuda_kernels(dtype, d, s, heads, kv):
    """runtime.jit(jax.grad(loss), backend="cuda") of jax.nn's grouped form: both attention
    fusions run as Triton kernels (no host fallback), gradients equal jax.jit's (relative
    Frobenius error; jax.jit at full f32 precision)."""
    import ml_dtypes
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    args = _gqa_inputs(s, heads, kv, d=d, batch=2, dtype=dt)
    g = _loss_grad(_jax_nn(True), args)
    tol = 1e-4 if dtype == "f32" else 3e-2
    _assert_fused_gradient(g, args, tol, (dtype, heads, kv), "cuda")


# --- a sliding window (two iota compares): a band both fusions test themselves ---------------
def _window(width: int, dtype_softmax=jnp.float32):
    def f(q, k, v):
        pos = jnp.arange(q.shape[1])
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] < width)
        s = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.3, -jnp.inf)
        p = jax.nn.softmax(s.astype(dtype_softmax), axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return f


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_sliding_window_gradient_fuses(target):
    """jax.grad of attention over the last 16 keys: forward and backward fused, the window
    tested inside both (no mask operand, no B·H·S·S buffer); the gradients equal jax.jit's,
    on the CUDA pipeline and on the CPU backend's own."""
    args = [np.random.default_rng(s).standard_normal((2, 45, 2, 16)).astype(np.float32)
            for s in range(3)]
    if target == "cuda":
        g, jf, c = _gpu_pipeline_grad(_window(16), args)
        assert max(bf.size for bf in c.buffer_assignment().buffers) < 2 * 2 * 45 * 45 * 4
    else:
        g = _loss_grad(_window(16), args)
        jf = runtime.jit(g)
        c = jf.lower(*args).compile()
        kinds = _kinds(c)
        assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1, kinds
    bwd = [i for i in c.module.entry.instructions if i.opcode == "fusion"
           and fusion_kind(i) == "attention_backward"]
    assert not [o for o in bwd[0].operands if o.shape.dtype.name == "pred"], \
        "the window is the kernels' band test since i14-window, not a mask operand"
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
def test_sliding_window_gradient_bf16():
    import ml_dtypes
    args = [np.random.default_rng(s).standard_normal((1, 40, 2, 16)).astype(ml_dtypes.bfloat16)
            for s in range(3)]
    g, jf, _ = _gpu_pipeline_grad(_window(8), args)
    for a, b in zip(jf(*args), jax.jit(g)(*args)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 3e-2


@pytest.mark.usefixtures("triton_attention_on_cpu")
def test_sliding_window_gradient_triton_kernels():
    """The backward Triton kernels read the window mask as the forward's does (general
    path: P recomputed with the mask's -inf fill, dS zero outside the window); 70 keys,
    several blocks."""
    args = [np.random.default_rng(s).standard_normal((1, 70, 2, 16)).astype(np.float32)
            for s in range(3)]
    g, jf, _ = _gpu_pipeline_grad(_window(16), args)
    _assert_close(jf(*args), jax.jit(g)(*args), 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,s", [("bf16", 128, 300), ("f32", 32, 70)])
def test_sliding_window_gradient_cuda_kernels(dtype, d, s):
    import ml_dtypes
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    args = [np.random.default_rng(i).standard_normal((2, s, 4, d)).astype(dt) for i in range(3)]
    g = _loss_grad(_window(64), args)
    tol = 1e-4 if dtype == "f32" else 3e-2
    _assert_fused_gradient(g, args, tol, (dtype, s), "cuda")


# --- grouped-query attention written group-major: scores [b, g, kv, q, k] -------------------
def _group_major(group: int, causal: bool = True, scaled: bool = True, order: str = "bgkqs"):
    """q heads as [kv head, group] but the scores (and the output einsum) group-major: the
    batch dims (b, kv) of q·k sit on both sides of the group row dim (``order`` "bkgqs":
    kv-major instead). Unscaled, the softmax reads a transpose of q·k directly."""
    def f(q, k, v):
        b, s, h, d = q.shape
        qg = q.reshape(b, s, h // group, group, d)
        sc = jnp.einsum(f"bqkgd,bskd->{order}", qg, k).astype(jnp.float32)
        if scaled:
            sc = sc * (1 / np.sqrt(d))
        if causal:
            sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
        p = jax.nn.softmax(sc, axis=-1).astype(v.dtype)
        return jnp.einsum(f"{order},bskd->bqkgd", p, v).reshape(b, s, h, d)
    return f


@pytest.mark.parametrize("causal", [True, False])
def test_group_major_gqa_forward_fuses(causal):
    """One attention fusion for the group-major scores; the kernels see them as [b, kv,
    g, q, k] (the canonical order), the outputs equal jax.jit's, no score buffer."""
    args = _gqa_inputs(37, 6, 2, batch=2)
    f = _group_major(3, causal)
    jf = runtime.jit(f, target="h200")
    c = jf.lower(*args).compile()
    assert _kinds(c).count("attention") == 1, c.as_text()
    assert max(bf.size for bf in c.buffer_assignment().buffers) < 2 * 6 * 37 * 37 * 4
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=2e-5, atol=2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("causal,group", [(True, 3), (False, 2)])
def test_group_major_gqa_gradient_fuses(causal, group):
    """jax.grad of the group-major form: one forward and one backward fusion on the CUDA
    pipeline (CPU reference kernels), gradients equal jax.jit's."""
    args = _gqa_inputs(37, 2 * group, 2, batch=2)
    g, jf, c = _gpu_pipeline_grad(_group_major(group, causal), args)
    assert max(bf.size for bf in c.buffer_assignment().buffers) < 2 * 2 * group * 37 * 37 * 4
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("order", ["bgkqs", "bkgqs"])
def test_unscaled_grouped_scores_fuse(order):
    """softmax(q·k) with no scale and no mask on grouped scores: the softmax's input is the
    transposing view of q·k itself (it used to be refused as "does not subtract the row
    maximum of its input"); forward and gradient fuse and equal jax.jit's."""
    args = _gqa_inputs(37, 6, 2)
    g, jf, _ = _gpu_pipeline_grad(_group_major(3, causal=False, scaled=False, order=order),
                                  args)
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
def test_group_major_gqa_gradient_cpu_pipeline_bf16():
    import ml_dtypes
    args = _gqa_inputs(40, 8, 2, dtype=ml_dtypes.bfloat16)
    _assert_fused_gradient(_loss_grad(_group_major(4), args), args, 3e-2)


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("causal,scaled", [(True, True), (False, True), (False, False)])
def test_group_major_gqa_triton_kernels(causal, scaled):
    """The Triton kernels on the group-major form (interpreter, f32): q/k/v permuted into
    [z, h, rows, d] with the batch dims first, the row statistics written and read back
    through the same permutation; forward and gradient equal jax.jit's."""
    args = _gqa_inputs(70, 8, 2, batch=2)
    f = _group_major(4, causal, scaled)
    jf = runtime.jit(f, target="h200")
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-4)
    g, jg, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jg(*args), jax.jit(g)(*args), 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,s", [("bf16", 128, 200), ("f32", 32, 70)])
def test_group_major_gqa_gradient_cuda_kernels(dtype, d, s):
    import ml_dtypes
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    args = _gqa_inputs(s, 8, 2, d=d, batch=2, dtype=dt)
    g = _loss_grad(_group_major(4), args)
    tol = 1e-4 if dtype == "f32" else 3e-2
    _assert_fused_gradient(g, args, tol, (dtype, s), "cuda")


# --- jax.nn.dot_product_attention's other arguments -----------------------------------------
def _jax_nn_form(name: str, b: int, s: int, h: int):
    """(f, kv heads) for jax.nn's local window, key lengths, mask and bias arguments."""
    rng = np.random.default_rng(21)
    if name == "window":
        kw, kv = dict(is_causal=True, local_window_size=(16, 0)), h
    elif name == "gqa_window":
        kw, kv = dict(is_causal=True, local_window_size=(16, 0)), 2
    elif name == "kv_lengths":
        kw, kv = dict(key_value_seq_lengths=jnp.array([s, s // 2 + 3], jnp.int32)[:b]), h
    elif name == "mask":
        mask = (rng.random((b, 1, s, s)) > 0.2) | np.eye(s, dtype=bool)
        kw, kv = dict(mask=jnp.asarray(mask)), h
    else:   # gqa_bias
        kw, kv = dict(bias=jnp.asarray(rng.standard_normal((1, h, s, s)), jnp.float32)), 2
    return (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)), kv


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("name", ["window", "gqa_window", "kv_lengths", "mask", "gqa_bias"])
def test_jax_nn_arguments_gradient_fuses(name):
    """local_window_size (with and without grouped kv heads), key_value_seq_lengths, mask=
    and bias=: one forward and one backward fusion each (the generated or given masks read
    as operands), gradients equal jax.jit's."""
    f, kv = _jax_nn_form(name, 2, 45, 4)
    args = _gqa_inputs(45, 4, kv, batch=2)
    g, jf, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("name", ["gqa_window", "kv_lengths"])
def test_jax_nn_arguments_triton_kernels(name):
    f, kv = _jax_nn_form(name, 2, 70, 8)
    args = _gqa_inputs(70, 8, kv, batch=2)
    g, jf, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jf(*args), jax.jit(g)(*args), 1e-4)


def test_bf16_bias_is_read_narrow():
    """jax.nn casts a bf16 bias to the f32 scores: the attention fusion reads the bf16
    bias and widens it inside (no f32 copy of the [1, h, s, s] bias in memory)."""
    import ml_dtypes
    q, k, v = _gqa_inputs(40, 4, 2, dtype=ml_dtypes.bfloat16)
    bias = np.random.default_rng(3).standard_normal((1, 4, 40, 40)).astype(ml_dtypes.bfloat16)

    def f(q, k, v, b):
        return jax.nn.dot_product_attention(q, k, v, bias=b, implementation="xla")
    jf = runtime.jit(f, target="h200")
    c = jf.lower(q, k, v, bias).compile()
    (fa,) = [i for i in c.module.entry.instructions if i.opcode == "fusion"
             and fusion_kind(i) == "attention"]
    assert {o.shape.dtype.name for o in fa.operands} == {"bf16"}, c.as_text()   # q, k, v, bias
    assert not [i for i in c.module.entry.instructions if i.opcode == "convert"]
    a, b = (np.asarray(x, np.float32) for x in (jf(q, k, v, bias), jax.jit(f)(q, k, v, bias)))
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gqa_window", "kv_lengths", "mask", "gqa_bias"])
def test_jax_nn_arguments_cuda_kernels(name):
    """jax.nn's local window (grouped kv heads), key lengths, mask and bias arguments,
    bf16, through the Triton kernels (no host fallback); gradients equal jax.jit's."""
    import ml_dtypes
    f, kv = _jax_nn_form(name, 2, 200, 8)
    args = _gqa_inputs(200, 8, kv, d=64, batch=2, dtype=ml_dtypes.bfloat16)
    g = _loss_grad(f, args)
    _assert_fused_gradient(g, args, 3e-2, name, "cuda")


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("order,s", [("bkgqs", 64), ("bkgqs", 128), ("bgkqs", 128)])
def test_grouped_rows_causal_block_skipping(order, s):
    """Grouped scores with rows [g, q] (the query position innermost, wrapping every Q_LEN
    rows): with Q_LEN a multiple of the row blocks (64 or 128 here, f32 blocks of 32/64)
    each block lies in one group, so the kernels skip the blocks above the diagonal
    (ScorePlan.skip_for); forward and gradient through the Triton kernels equal jax.jit's."""
    from codegen.triton.attention import plan_for
    args = _gqa_inputs(s, 8, 2)
    f = _group_major(4, order=order)
    jf = runtime.jit(f, target="h200")
    c = jf.lower(*args).compile()
    (fa,) = [i for i in c.module.entry.instructions if i.opcode == "fusion"
             and fusion_kind(i) == "attention"]
    plan = plan_for(fa)
    assert not plan.skip and plan.skip_for(64) and not plan.skip_for(48)
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-4)
    g, jg, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jg(*args), jax.jit(g)(*args), 1e-4)


def test_linear_loss_gradient_without_forward_output_is_explained():
    """jax.grad of sum(o * dO) never computes o (the loss is linear in it): there is no
    forward P·V, so nothing fuses, and the note says exactly that instead of calling dV a
    misshapen P·V; with jax.value_and_grad (the loss needs o) both fuse."""
    args = _gqa_inputs(32, 4, 2)
    do = np.random.default_rng(4).standard_normal(args[0].shape).astype(np.float32)

    def loss(q, k, v, do):
        return jnp.sum(_jax_nn(True)(q, k, v) * do)
    g = jax.grad(loss, argnums=(0, 1, 2))
    jf = runtime.jit(g)
    c = jf.lower(*args, do).compile()
    assert "attention" not in _kinds(c)
    notes = [n for n in report_for(c.module).pattern_notes() if "flash-attention" in n]
    assert any("is jax.grad's dV = P^T.dO, but no dot computes the forward P·V" in n
               for n in notes), notes
    _assert_close(jf(*args, do), jax.jit(g)(*args, do), 2e-5)
    vg = runtime.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    kinds = _kinds(vg.lower(*args, do).compile())
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == 1, kinds


# --- sliding windows recognized as a band the kernels test (no mask operand) ----------------
def _window_form(name: str, width: int, dtype_softmax=jnp.float32):
    """An attention over a band of keys around the diagonal: "compares" the two iota
    compares (k <= q, q - k < width), "jax_nn" jax.nn's local_window_size=(width - 1, 0)
    (same keys), "symmetric" jax.nn's non-causal (width, width // 2) (keys q-width ..
    q+width//2)."""
    if name == "compares":
        return _window(width, dtype_softmax)
    lw = (width - 1, 0) if name == "jax_nn" else (width, width // 2)
    return lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=name == "jax_nn", local_window_size=lw, implementation="xla")


def _fusions(c, kind: str) -> list:
    return [i for i in c.module.entry.instructions if i.opcode == "fusion"
            and fusion_kind(i) == kind]


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("name,kv", [("compares", 4), ("jax_nn", 4), ("jax_nn", 2),
                                     ("symmetric", 2)])
def test_window_is_a_band_without_mask_operand(name, kv):
    """The window's compares become the kernels' own band test: neither fusion (forward,
    backward) reads a pred/mask operand, the backend config and explain-fusion name the
    window, and the gradient equals jax.jit's (CPU reference kernels)."""
    f = _window_form(name, 16)
    args = _gqa_inputs(45, 4, kv, batch=2)
    g, jf, c = _gpu_pipeline_grad(f, args)
    for kind in ("attention", "attention_backward"):
        (fa,) = _fusions(c, kind)
        assert not [o for o in fa.operands if o.shape.dtype.name == "pred"], c.as_text()
        assert len(fa.operands) == (3 if kind == "attention" else 7), [o.name for o in fa.operands]
    want = "causal, window 16 (keys q-15..q)" if name != "symmetric" else \
        "band of 25 keys (q-16..q+8)"
    assert want in str(_fusions(c, "attention")[0].attrs["backend_config"])
    reasons = [d.reason for d in report_for(c.module).decisions if d.fused]
    assert any(want in r and "skipping the key blocks outside it" in r for r in reasons)
    assert any("flash-attention backward" in r and want in r for r in reasons), reasons
    _assert_close(jf(*args), jax.jit(g)(*args), 2e-5)


def test_window_forward_has_no_mask_operand_cpu_pipeline():
    """On the CPU backend's own pipeline the forward of jax.nn's local window reads q, k
    and v only (the band test is inside the fusion), and equals jax.jit's."""
    f = _window_form("jax_nn", 20)
    args = _gqa_inputs(50, 4, 2, batch=2)
    jf = runtime.jit(f)
    c = jf.lower(*args).compile()
    (fa,) = _fusions(c, "attention")
    assert len(fa.operands) == 3 and "window 20" in str(fa.attrs["backend_config"])
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=2e-5, atol=2e-5)


def test_mask_that_is_not_a_band_stays_an_operand():
    """A window test on a sum of positions (q + k < w: not a band of q - k) stays a mask
    operand, and the result still equals jax.jit's."""
    def f(q, k, v):
        pos = jnp.arange(q.shape[1])
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] + pos[None, :] < 50)
        s = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.3, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    args = _gqa_inputs(40, 2, 2)
    jf = runtime.jit(f, target="h200")
    c = jf.lower(*args).compile()
    (fa,) = _fusions(c, "attention")
    assert [o for o in fa.operands if o.shape.dtype.name == "pred"]
    assert "window" not in str(fa.attrs["backend_config"])
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=2e-5, atol=2e-5)


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("name,kv,width,s", [("compares", 4, 16, 50), ("compares", 4, 20, 50),
                                             ("jax_nn", 2, 32, 45), ("jax_nn", 2, 21, 45)])
def test_window_gradient_bf16(name, kv, width, s):
    """bf16 window attention, forward and gradient on the CUDA pipeline (CPU reference
    kernels), windows that are (16, 32) and are not (20, 21) multiples of the key block
    of 16; relative Frobenius error against jax.jit < 3e-2."""
    import ml_dtypes
    args = _gqa_inputs(s, 4, kv, batch=2, dtype=ml_dtypes.bfloat16)
    f = _window_form(name, width)
    g, jf, _ = _gpu_pipeline_grad(f, args)
    jfwd = runtime.jit(f, target="h200")
    for got, want in [(jfwd(*args), jax.jit(f)(*args))] + list(zip(jf(*args), jax.jit(g)(*args))):
        a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 3e-2


@pytest.fixture
def tiny_triton_blocks(monkeypatch):
    """16×16 Triton blocks (forward and backward), so short sequences hold many query and
    key blocks: a window's lower-edge, inner and diagonal ranges all occur."""
    from codegen.triton import attention, attention_backward
    cfg = (16, 16, 4, 1)
    monkeypatch.setattr(attention, "_candidates", lambda b, d: [cfg])
    monkeypatch.setattr(attention_backward, "_CANDIDATES",
                        lambda b, d: {"delta": [cfg], "dq": [cfg], "dkdv": [cfg]})


@pytest.mark.usefixtures("triton_attention_on_cpu", "tiny_triton_blocks")
@pytest.mark.parametrize("name,heads,kv,width,s", [
    ("compares", 2, 2, 32, 100), ("compares", 2, 2, 37, 90), ("jax_nn", 4, 2, 40, 70),
    ("jax_nn", 4, 2, 16, 64), ("symmetric", 4, 2, 20, 70)])
def test_window_triton_kernels(name, heads, kv, width, s):
    """The Triton kernels (interpreter, f32, 16×16 blocks) with the band test and block
    skipping on both sides of the band: forward, dQ and dK/dV; MHA and grouped rows
    (jax.nn GQA, q = row // Q_DIV); widths that are and are not block multiples; the
    plan says the blocks are skipped; equal to jax.jit's within 1e-4."""
    from codegen.triton.attention import plan_for
    args = _gqa_inputs(s, heads, kv)
    f = _window_form(name, width)
    jf = runtime.jit(f, target="h200")
    c = jf.lower(*args).compile()
    (fa,) = _fusions(c, "attention")
    plan = plan_for(fa)
    assert plan.skip and plan.whi == (width - 1 if name != "symmetric" else width)
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-4)
    g, jg, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jg(*args), jax.jit(g)(*args), 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,d,s,heads,kv,width", [
    ("jax_nn", "bf16", 128, 700, 8, 2, 256), ("compares", "bf16", 64, 300, 4, 4, 100),
    ("jax_nn", "f32", 32, 200, 6, 2, 70), ("symmetric", "bf16", 128, 400, 4, 2, 130)])
def test_window_cuda_kernels(name, dtype, d, s, heads, kv, width):
    """Window attention through the Triton kernels on the GPU (no host fallback, no mask
    operand): forward and gradient equal jax.jit's (relative Frobenius error; jax.jit at
    full f32 precision)."""
    import ml_dtypes
    from runtime.cuda import executable_of
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    args = _gqa_inputs(s, heads, kv, d=d, batch=2, dtype=dt)
    f = _window_form(name, width)
    g = _loss_grad(f, args)
    tol = 1e-4 if dtype == "f32" else 3e-2
    for fn in (f, g):
        jf = runtime.jit(fn, backend="cuda")
        c = jf.lower(*args).compile()
        for fa in _fusions(c, "attention") + _fusions(c, "attention_backward"):
            assert not [o for o in fa.operands if o.shape.dtype.name == "pred"]
        assert not [t for t in executable_of(c).host_fallbacks() if "attention" in t.reason]
        with jax.default_matmul_precision("highest"):
            wants = jax.jit(fn)(*args)
        gots = jf(*args)
        if fn is f:
            gots, wants = [gots], [wants]
        for a, want in zip(gots, wants):
            a, want = np.asarray(a, np.float32), np.asarray(want, np.float32)
            assert np.linalg.norm(a - want) / np.linalg.norm(want) < tol, (name, dtype)


@pytest.mark.usefixtures("triton_attention_on_cpu")
@pytest.mark.parametrize("window", [False, True])
def test_jax_nn_gqa_forward_reads_q_and_writes_o_in_place(window):
    """jax.nn's grouped form has rows [t, g] of q [b, t, kv, g, d], which do not merge into
    one row stride: the forward kernel addresses them as two runs (row r at (r // g) and
    r % g) instead of copying q into [z, h, rows, d] and O back; outputs equal jax.jit's
    (interpreter, f32, with and without a window)."""
    import torch
    from codegen.triton.attention import FwdLaunch, flash_attention
    kw = dict(local_window_size=(20, 0)) if window else {}

    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla", **kw)
    args = _gqa_inputs(40, 8, 2, batch=2)
    jf = runtime.jit(f, target="h200")
    c = jf.lower(*args).compile()
    (fa,) = _fusions(c, "attention")
    ops = []
    for o in fa.operands:
        src = o.operands[0] if o.opcode == "bitcast" else o
        a = args[next(n for n, p in enumerate(c.module.entry.parameters) if p is src)]
        ops.append(torch.from_numpy(np.ascontiguousarray(a)).reshape(tuple(o.shape.dims)))
    run = FwdLaunch(fa, ops)
    assert run.q.data_ptr() == ops[run.plan.q].data_ptr()
    assert run.copies[0][1] is None, "O is written in place"
    out = flash_attention(fa, ops)
    want = np.asarray(jax.jit(f)(*args))
    np.testing.assert_allclose(out.numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(jf(*args), want, rtol=1e-4, atol=1e-4)


def _two_selects(width: int):
    """A causal jnp.where and then a window jnp.where (two selects, each one compare)."""
    def f(q, k, v):
        s = q.shape[1]
        pos = jnp.arange(s)
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
        sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -jnp.inf)
        sc = jnp.where(pos[:, None] - pos[None, :] < width, sc, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), v)
    return f


@pytest.mark.usefixtures("triton_attention_on_cpu", "tiny_triton_blocks")
def test_causal_and_window_in_two_selects_triton_kernels():
    """Two selects (a causal one, then a window one) are two causal steps: the kernels
    apply their intersection (one band, ``merge_bands``), not the last one only; forward
    and gradient equal jax.jit's."""
    from codegen.triton.attention import plan_for
    f = _two_selects(24)
    args = _gqa_inputs(70, 2, 2)
    jf = runtime.jit(f, target="h200")
    (fa,) = _fusions(jf.lower(*args).compile(), "attention")
    c = plan_for(fa).causal
    assert (c.direction, c.delta, c.window) == ("GE", 0, 23)
    # explain-fusion and the backend config name the band of both selects, not the first
    assert "causal, window 24 (keys q-23..q)" in str(fa.attrs["backend_config"])
    reasons = [d.reason for d in report_for(jf.lower(*args).compile().module).decisions
               if d.fused]
    assert any("causal, window 24" in r for r in reasons), reasons
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-4)
    g, jg, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jg(*args), jax.jit(g)(*args), 1e-4)


@pytest.mark.parametrize("name,kv", [("jax_nn", 4), ("jax_nn", 2), ("compares", 4)])
def test_cpu_reference_skips_key_blocks_outside_the_band(name, kv, monkeypatch):
    """The CPU reference kernel walks rows in blocks of 16 query positions and visits only
    the key blocks the band reaches (window 20: at most 3 key blocks of 16 per row block,
    against up to 8 under full causal); its result equals jax.jit's."""
    from codegen.cpu import attention as cpu_attention
    from passes.fusion.attention import attention_root, canonical, match_attention
    visited = []
    real = cpu_attention._band_blocks

    def spy(m, canon, scores, step):
        q_dim, blocks = real(m, canon, scores, step)
        visited.extend(-(-(hi - lo) // step) for _, _, lo, hi in blocks)
        return q_dim, blocks
    monkeypatch.setattr(cpu_attention, "_band_blocks", spy)
    f = _window_form(name, 20)
    args = _gqa_inputs(128, 4, kv, batch=2)
    jf = runtime.jit(f, target="h200")
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=2e-5, atol=2e-5)
    assert len(visited) == 8 and max(visited) <= 3 and visited[0] == 1, visited
    (fa,) = _fusions(jf.lower(*args).compile(), "attention")
    m = match_attention(attention_root(fa.attrs["calls"].root)[0])
    assert canonical(m.logits, m.qk)[m.n_batch] == m.causal.q_dim


def _group_major_window(group: int, width: int, order: str = "bkgqs"):
    """The grouped einsum (rows [g, q]: the query position innermost) with a sliding
    window of ``width`` keys as two compares."""
    def f(q, k, v):
        b, s, h, d = q.shape
        pos = jnp.arange(s)
        keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] < width)
        sc = jnp.einsum(f"bqkgd,bskd->{order}", q.reshape(b, s, h // group, group, d), k)
        sc = jnp.where(keep, sc.astype(jnp.float32) * (1 / np.sqrt(d)), -jnp.inf)
        p = jax.nn.softmax(sc, axis=-1).astype(v.dtype)
        return jnp.einsum(f"{order},bskd->bqkgd", p, v).reshape(b, s, h, d)
    return f


@pytest.mark.usefixtures("triton_attention_on_cpu", "tiny_triton_blocks")
@pytest.mark.parametrize("order,s", [("bkgqs", 64), ("bgkqs", 70)])
def test_grouped_rows_window_triton_kernels(order, s):
    """A window on grouped rows [g, q] (the query position wraps every Q_LEN rows): with
    16-row blocks dividing Q_LEN = 64 the kernels skip on both sides of the band in every
    group; with Q_LEN = 70 they do not skip and test the band in every block; forward and
    gradient equal jax.jit's."""
    from codegen.triton.attention import plan_for
    args = _gqa_inputs(s, 8, 2)
    f = _group_major_window(4, 20, order)
    jf = runtime.jit(f, target="h200")
    (fa,) = _fusions(jf.lower(*args).compile(), "attention")
    plan = plan_for(fa)
    assert plan.whi == 19 and plan.skip_for(16) == (s % 16 == 0)
    np.testing.assert_allclose(jf(*args), jax.jit(f)(*args), rtol=1e-4, atol=1e-4)
    g, jg, _ = _gpu_pipeline_grad(f, args)
    _assert_close(jg(*args), jax.jit(g)(*args), 1e-4)


def _layers_sharing_a_mask(form: str, layers: int = 2):
    """``layers`` attention layers written plainly, all reading one mask: a causal mask
    (``causal``) or a padding mask from an argument (``padding``, valid keys per batch
    row). CSE leaves one mask (and one fill) that every layer's attention reads."""
    def f(x, wq, wk, wv, valid):
        b, s, d = x.shape
        h, dh = 2, d // 2
        keep = jnp.tril(jnp.ones((s, s), bool)) if form == "causal" else \
            valid[:, None, None, :]
        for n in range(layers):
            q, k, v = ((x @ w[n]).reshape(b, s, h, dh) for w in (wq, wk, wv))
            sc = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) * dh ** -0.5, -1e9)
            o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), v)
            x = x + o.reshape(b, s, d)
        return x
    rng = np.random.default_rng(7)
    b, s, d = 2, 40, 32
    args = (rng.standard_normal((b, s, d)).astype(np.float32),
            *((rng.standard_normal((layers, d, d)) * 0.08).astype(np.float32) for _ in range(3)),
            rng.random((b, s)) > 0.3)
    return f, args, b * 2 * s * s


@pytest.mark.usefixtures("small_backward_blocks")
@pytest.mark.parametrize("form", ["causal", "padding"])
def test_layers_sharing_one_mask_each_fuse_with_their_own_copy(form):
    """Every layer's attention, forward and jax.grad's backward, is a flash-attention
    fusion with its own copy of the shared mask (and fill): no B·H·S·S mask operand, no
    scores in memory, results equal jax.jit's. Before, a shared causal mask left the -inf
    fill a fusion operand (the forward failed to run) and the gradient unfused; a shared
    padding mask was materialized as a [B, H, S, S] pred operand."""
    f, args, scores = _layers_sharing_a_mask(form)
    g = lambda *a: jax.grad(lambda x, *w: jnp.sum(f(x, *w) ** 2), argnums=(0, 1))(*a)  # noqa: E731
    for fn, backward in ((f, 0), (g, 2)):
        jf = runtime.jit(fn, target="h200")
        c = jf.lower(*args).compile()
        kinds = _kinds(c)
        assert kinds.count("attention") == 2 and kinds.count("attention_backward") == backward
        assert not _score_sized(c.module, scores), _score_sized(c.module, scores)
        with jax.default_matmul_precision("highest"):
            want = jax.jit(fn)(*args)
        for a, w in zip(jax.tree.leaves(jf(*args)), jax.tree.leaves(want)):
            _assert_close(a, w, 2e-5)


@pytest.mark.usefixtures("triton_attention_on_cpu", "tiny_triton_blocks")
def test_layers_sharing_a_padding_mask_triton_kernels():
    f, args, _ = _layers_sharing_a_mask("padding")
    g = lambda *a: jax.grad(lambda x, *w: jnp.sum(f(x, *w) ** 2), argnums=(0, 1))(*a)  # noqa: E731
    jf = runtime.jit(g, target="h200")
    for a, w in zip(jax.tree.leaves(jf(*args)), jax.tree.leaves(jax.jit(g)(*args))):
        _assert_close(a, w, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["causal", "padding"])
def test_layers_sharing_one_mask_cuda_kernels(form):
    from runtime.cuda import executable_of
    f, args, scores = _layers_sharing_a_mask(form, layers=3)
    g = lambda *a: jax.grad(lambda x, *w: jnp.sum(f(x, *w) ** 2), argnums=(0, 1))(*a)  # noqa: E731
    for fn in (f, g):
        # The projections at full f32 precision in both (hlotk's default runs them as TF32
        # on the GPU, as XLA's does): the comparison is of the attention kernels.
        with jax.default_matmul_precision("highest"):
            jf = runtime.jit(fn, backend="cuda")
            c = jf.lower(*args).compile()
            want = jax.jit(fn)(*args)
        assert _kinds(c).count("attention") == 3
        assert not _score_sized(c.module, scores)
        assert not [t for t in executable_of(c).host_fallbacks() if "attention" in t.reason]
        for a, w in zip(jax.tree.leaves(c(*args)), jax.tree.leaves(want)):
            a, w = np.asarray(a, np.float32), np.asarray(w, np.float32)
            assert np.linalg.norm(a - w) / np.linalg.norm(w) < 1e-4
