"""The linear-algebra custom calls JAX emits when it lowers for an NVIDIA GPU
(``cusolver_potrf_ffi``, ``cusolver_getrf_ffi``, ``cu_lu_pivots_to_permutation``,
``cusolver_geqrf_ffi``/``orgqr``, ``cusolver_syevd_ffi``, ``cusolver_gesvdj_ffi``/``gesvd``,
``cusolver_sytrd_ffi``):

* in the interpreter, on hand-written HLO (the conventions pinned down independently of
  JAX's version) and on the MLIR JAX really emits (``jax.export`` for ``cuda`` lowers on
  this CPU-only machine), against ``jax.jit`` on the CPU (the LAPACK program);
* their torch.linalg functions (the CUDA backend's) against the interpreter, on CPU tensors
  where torch is installed;
* on the CUDA backend against ``jax.jit`` on the GPU (marked ``gpu``).
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import export  # noqa: E402
from jax.lax.linalg import SvdAlgorithm  # noqa: E402

import hlo  # noqa: E402

RNG = np.random.RandomState(0)
A43 = RNG.randn(4, 3).astype(np.float32)
SQ = RNG.randn(3, 3).astype(np.float32)
SPD = (SQ @ SQ.T + 3 * np.eye(3)).astype(np.float32)
BATCH = np.stack([SPD, 2 * SPD + np.eye(3, dtype=np.float32)])


def _reconstruct(u, s, vt):
    """Sign-free checks of an SVD: the product, |U| and |V^T| (columns' signs are free)."""
    k = s.shape[-1]
    return (u[:, :k] * s) @ vt[:k, :], jnp.abs(u[:, :k]), jnp.abs(vt[:k])


def _eigh_signless(x):
    w, v = jnp.linalg.eigh(x)
    return w, jnp.abs(v)


# name -> (function, argument, custom-call targets its cuda lowering must contain)
PROGRAMS = {
    "cholesky": (jnp.linalg.cholesky, SPD, {"cusolver_potrf_ffi"}),
    "cholesky_batched_c64": (lambda x: jnp.linalg.cholesky(x.astype(jnp.complex64)), BATCH,
                             {"cusolver_potrf_ffi"}),
    "lu_tall": (jax.lax.linalg.lu, A43, {"cusolver_getrf_ffi", "cu_lu_pivots_to_permutation"}),
    "inv_batched": (jnp.linalg.inv, BATCH, {"cusolver_getrf_ffi"}),
    "qr_complete": (lambda x: jnp.linalg.qr(x, mode="complete"), A43,
                    {"cusolver_geqrf_ffi", "cusolver_orgqr_ffi"}),
    "eigh": (_eigh_signless, SPD, {"cusolver_syevd_ffi"}),
    "eigvalsh_upper": (lambda x: jnp.linalg.eigvalsh(x, UPLO="U"), SPD, {"cusolver_syevd_ffi"}),
    "svd_jacobi": (lambda x: _reconstruct(*jax.lax.linalg.svd(x, full_matrices=True)), A43,
                   {"cusolver_gesvdj_ffi"}),
    "svd_qr_wide_econ": (lambda x: _reconstruct(*jax.lax.linalg.svd(
        x, full_matrices=False, algorithm=SvdAlgorithm.QR)), A43.T, {"cusolver_gesvd_ffi"}),
    "svd_qr_c64": (lambda x: _reconstruct(*jax.lax.linalg.svd(
        x.astype(jnp.complex64) * (1 + 1j), full_matrices=True, algorithm=SvdAlgorithm.QR)),
        A43, {"cusolver_gesvd_ffi"}),
    "svdvals": (lambda x: jnp.linalg.svd(x, compute_uv=False), A43, {"cusolver_gesvdj_ffi"}),
    "tridiagonal": (lambda x: jax.lax.linalg.tridiagonal(x)[1:3], SPD, {"cusolver_sytrd_ffi"}),
}


def _assert_close(got, want) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = jax.tree.leaves(want)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, f"result {k}"
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4, err_msg=f"result {k}")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cuda_lowering_runs_in_the_interpreter(name: str) -> None:
    fn, x, targets = PROGRAMS[name]
    exported = export.export(jax.jit(fn), platforms=["cuda"])(x)
    text = exported.mlir_module()
    for t in targets:
        assert f"@{t}(" in text, f"the cuda lowering has no {t} any more"
    module = hlo.from_exported(exported)
    _assert_close(hlo.evaluate(module, [x]), jax.jit(fn)(x))


HAND_WRITTEN = """
HloModule gpu_linalg, entry_computation_layout={(f32[3,3]{1,0}, f32[3,4]{1,0})->(f32[3,3]{1,0}, s32[], f32[3,3]{1,0}, s32[3]{0}, s32[3]{0}, f32[3]{0}, f32[3]{0}, f32[4,4]{1,0})}

ENTRY main {
  spd = f32[3,3]{1,0} parameter(0)
  wide = f32[3,4]{1,0} parameter(1)
  chol = (f32[3,3]{1,0}, s32[]) custom-call(spd), custom_call_target="cusolver_potrf_ffi", backend_config={lower = false}
  factor = f32[3,3]{1,0} get-tuple-element(chol), index=0
  chol_info = s32[] get-tuple-element(chol), index=1
  lu = (f32[3,3]{1,0}, s32[3]{0}, s32[]) custom-call(spd), custom_call_target="cusolver_getrf_ffi", backend_config={}
  lu_factors = f32[3,3]{1,0} get-tuple-element(lu), index=0
  pivots = s32[3]{0} get-tuple-element(lu), index=1
  one = s32[] constant(1)
  ones = s32[3]{0} broadcast(one), dimensions={}
  pivots0 = s32[3]{0} subtract(pivots, ones)
  perm = s32[3]{0} custom-call(pivots0), custom_call_target="cu_lu_pivots_to_permutation", backend_config={}
  eig = (f32[3,3]{1,0}, f32[3]{0}, s32[]) custom-call(spd), custom_call_target="cusolver_syevd_ffi", backend_config={algorithm = 2 : ui8, lower = true}
  w = f32[3]{0} get-tuple-element(eig), index=1
  svd = (f32[3,4]{1,0}, f32[3]{0}, f32[4,4]{1,0}, f32[3,3]{1,0}, s32[]) custom-call(wide), custom_call_target="cusolver_gesvd_ffi", backend_config={compute_uv = true, full_matrices = true, transposed = true}
  s = f32[3]{0} get-tuple-element(svd), index=1
  vt = f32[4,4]{1,0} get-tuple-element(svd), index=2
  ROOT out = (f32[3,3]{1,0}, s32[], f32[3,3]{1,0}, s32[3]{0}, s32[3]{0}, f32[3]{0}, f32[3]{0}, f32[4,4]{1,0}) tuple(factor, chol_info, lu_factors, pivots, perm, w, s, vt)
}
"""


def test_hand_written_cusolver_calls() -> None:
    """Upper Cholesky (the lower triangle keeps a's values), LU with 1-based pivots and the
    permutation, Jacobi eigenvalues, and a transposed gesvd (m < n: V^T comes third)."""
    wide = RNG.randn(3, 4).astype(np.float32)
    (factor, info, lu, pivots, perm, w, s, vt) = hlo.evaluate(hlo.parse_hlo(HAND_WRITTEN),
                                                               [SPD, wide])
    upper = np.linalg.cholesky(SPD.astype(np.float64)).T
    np.testing.assert_allclose(np.triu(factor), upper, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.tril(factor, -1), np.tril(SPD, -1))
    assert info == 0
    want_lu, want_pivots, want_perm = jax.jit(jax.lax.linalg.lu)(SPD)
    np.testing.assert_allclose(lu, want_lu, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pivots, np.asarray(want_pivots) + 1)
    np.testing.assert_array_equal(perm, want_perm)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(SPD), rtol=1e-5)
    np.testing.assert_allclose(s, np.linalg.svd(wide, compute_uv=False), rtol=1e-5)
    # Rows of V^T span the row space: wide @ vt[k] = s[k] * u[:, k], so |wide @ vt[k]| = s[k].
    np.testing.assert_allclose(np.linalg.norm(wide @ vt[:3].T, axis=0), s, rtol=1e-4)
    np.testing.assert_allclose(vt @ vt.T, np.eye(4), atol=1e-5)


@pytest.mark.parametrize("name", ["cholesky", "cholesky_batched_c64", "lu_tall", "inv_batched",
                                  "qr_complete", "eigh", "svd_jacobi", "svd_qr_wide_econ",
                                  "svd_qr_c64", "svdvals"])
def test_torch_linalg_functions_match_the_interpreter(name: str) -> None:
    """What the CUDA backend runs (runtime/cuda/linalg_calls.py), on CPU tensors."""
    torch = pytest.importorskip("torch")
    from runtime.cuda.linalg_calls import linalg_call_fn
    fn, x, _ = PROGRAMS[name]
    from passes import run_pipeline
    module = hlo.from_exported(export.export(jax.jit(fn), platforms=["cuda"])(x))
    run_pipeline(module, "inline")      # every call in the entry, operands traced
    calls = []
    values: dict[int, object] = {id(module.entry.parameters[0]): x}

    def trace(inst, value):
        values[id(inst)] = value
        if inst.opcode == "custom-call":
            calls.append(inst)
    evaluator = hlo.evaluator.Evaluator(trace=trace)
    evaluator.run_computation(module.entry, [x], hlo.evaluator.EvalContext(evaluator))
    assert calls
    for inst in calls:
        torch_fn = linalg_call_fn(inst)
        assert torch_fn is not None, inst.attrs["custom_call_target"]
        args = [torch.from_numpy(np.ascontiguousarray(values[id(o)])) for o in inst.operands]
        got = torch_fn(*args)
        got = got if isinstance(got, tuple) else (got,)
        want = values[id(inst)]
        want = want if isinstance(want, tuple) else (want,)
        target = inst.attrs["custom_call_target"]
        for k, (g, e) in enumerate(zip(got, want)):
            g = g.numpy()
            assert g.shape == e.shape and g.dtype == e.dtype, f"{target} result {k}"
            if "syevd" in target or "gesvd" in target:
                g, e = np.abs(g), np.abs(e)      # eigen/singular vectors: signs are free
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{target} result {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cuda_backend_matches_jax_on_the_gpu(name: str) -> None:
    import runtime
    fn, x, _ = PROGRAMS[name]
    # The reconstructions' dots at full f32 on both sides: at the default precision XLA and
    # cuBLAS may each use TF32 (measured 4e-4 relative on the H200), in different places.
    with jax.default_matmul_precision("highest"):
        with jax.default_device(jax.devices("gpu")[0]):
            want = jax.jit(fn)(x)
        got = runtime.jit(fn, backend="cuda")(x)
    _assert_close(tuple(jax.tree.leaves(got)), want)
