"""custom-call: the LAPACK FFI targets jax emits on the CPU, identity targets, the parser."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo import Builder, Raw
from hlo.errors import EvaluationError
from hlo.evaluator import evaluate
from hlo.evaluator.custom_calls import parse_mlir_dict
from hlo.shape import array, scalar, tuple_shape

RNG = np.random.default_rng(2)


@pytest.fixture(autouse=True, scope="module")
def x64():
    """f64/c128 LAPACK calls need jax's x64 mode; restored so other test files are unaffected."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def call(target, operands, out_shape, config="{}"):
    b = Builder("main")
    ps = [b.parameter(array(dt, x.shape)) for x, dt in operands]
    b.custom_call(*ps, custom_call_target=target, backend_config=Raw(config),
                  api_version="API_VERSION_TYPED_FFI", shape=out_shape)
    return evaluate(b.module(), [x for x, _ in operands])


def test_parse_mlir_dict():
    assert parse_mlir_dict(Raw("{mode = 86 : ui8, uplo = 76 : ui8}")) == {"mode": 86, "uplo": 76}
    assert parse_mlir_dict(Raw("{}")) == {} and parse_mlir_dict(Raw('""')) == {}
    d = parse_mlir_dict('{a = "x,y", b = true, c = 1.5 : f32, d = [1, 2], '
                        'e = array<i64: 3, 4>, f}')
    assert d == {"a": "x,y", "b": True, "c": 1.5, "d": (1, 2), "e": (3, 4), "f": True}
    with pytest.raises(EvaluationError):
        parse_mlir_dict("{a = ")


def test_unknown_target_is_named():
    with pytest.raises(EvaluationError, match="my_kernel"):
        call("my_kernel", [(np.zeros(2, np.float32), "f32")], array("f32", (2,)))


def test_sharding_targets_are_identity():
    x = np.arange(4, dtype=np.float32)
    for t in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
              "annotate_device_placement"):
        np.testing.assert_array_equal(call(t, [(x, "f32")], array("f32", (4,)), ""), x)


def spd(n, dtype, batch=()):
    a = RNG.standard_normal(batch + (n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * RNG.standard_normal(batch + (n, n))
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


@pytest.mark.parametrize("p,dtype,name", [("s", np.float32, "f32"), ("d", np.float64, "f64"),
                                          ("c", np.complex64, "c64")])
def test_potrf_matches_jax_cholesky(p, dtype, name):
    a = spd(4, dtype, (2,))
    factor, info = call(f"lapack_{p}potrf_ffi", [(a, name)],
                        tuple_shape(array(name, a.shape), array("s32", (2,))),
                        "{uplo = 76 : ui8}")
    assert (info == 0).all()
    want = jax.jit(jnp.linalg.cholesky)(a)
    np.testing.assert_array_equal(np.tril(factor), want)     # same LAPACK, same bits


def test_getrf_matches_jax_lu():
    a = RNG.standard_normal((5, 5)).astype(np.float32)
    lu, piv, info = call("lapack_sgetrf_ffi", [(a, "f32")],
                         tuple_shape(array("f32", (5, 5)), array("s32", (5,)), scalar("s32")))
    wlu, wpiv, _ = jax.jit(jax.lax.linalg.lu)(a)
    np.testing.assert_array_equal(lu, wlu)
    np.testing.assert_array_equal(piv - 1, wpiv)    # LAPACK pivots are 1-based
    assert info == 0


def test_geqrf_orgqr_match_jax_qr():
    a = RNG.standard_normal((6, 4)).astype(np.float32)
    qr, tau = call("lapack_sgeqrf_ffi", [(a, "f32")],
                   tuple_shape(array("f32", (6, 4)), array("f32", (4,))))
    q = call("lapack_sorgqr_ffi", [(qr, "f32"), (tau, "f32")], array("f32", (6, 4)))
    wq, wr = jax.jit(jnp.linalg.qr)(a)
    np.testing.assert_allclose(q, wq, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.triu(qr[:4]), wr, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(q @ np.triu(qr[:4]), a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p,dtype,name,target", [("s", np.float32, "f32", "syevd"),
                                                 ("c", np.complex64, "c64", "heevd")])
def test_syevd_matches_jax_eigh(p, dtype, name, target):
    a = spd(5, dtype)
    real = "f32"
    v, w, info = call(f"lapack_{p}{target}_ffi", [(a, name)],
                      tuple_shape(array(name, (5, 5)), array(real, (5,)), scalar("s32")),
                      "{mode = 86 : ui8, uplo = 76 : ui8}")
    ww, wv = jax.jit(jnp.linalg.eigh)(a)
    np.testing.assert_allclose(w, ww, rtol=1e-5)
    np.testing.assert_allclose(v, wv, rtol=1e-4, atol=1e-4)   # same signs/phases as LAPACK
    np.testing.assert_allclose(a @ v, v * w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("full", [True, False])
def test_gesdd_matches_jax_svd(full):
    a = RNG.standard_normal((5, 3)).astype(np.float32)
    ushape = (5, 5) if full else (5, 3)
    outs = call("lapack_sgesdd_ffi", [(a, "f32")],
                tuple_shape(array("f32", (5, 3)), array("f32", (3,)), array("f32", ushape),
                            array("f32", (3, 3)), scalar("s32")),
                "{mode = 65 : ui8}" if full else "{mode = 83 : ui8}")
    _, s, u, vt, info = outs
    wu, ws, wvt = jax.jit(lambda m: jnp.linalg.svd(m, full_matrices=full))(a)
    np.testing.assert_allclose(s, ws, rtol=1e-5)
    np.testing.assert_allclose(u, wu, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(vt, wvt, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((u[:, :3] * s) @ vt, a, rtol=1e-4, atol=1e-4)
    assert info == 0


def test_trsm_matches_jax_triangular_solve():
    a = (RNG.standard_normal((4, 4)) + 4 * np.eye(4)).astype(np.float32)
    b = RNG.standard_normal((4, 3)).astype(np.float32)
    x = call("lapack_strsm_ffi", [(a, "f32"), (b, "f32")], array("f32", (4, 3)),
             "{diag = 78 : ui8, side = 76 : ui8, trans_x = 84 : ui8, uplo = 76 : ui8}")
    want = jax.jit(lambda m, r: jax.lax.linalg.triangular_solve(
        m, r, left_side=True, lower=True, transpose_a=True))(a, b)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)


def test_geev_unpacks_complex_pairs():
    a = np.array([[0, -1, 0], [1, 0, 0], [0, 0, 2]], np.float32)   # eigenvalues +-i, 2
    wr, wi, vl, vr, info = call(
        "lapack_sgeev_ffi", [(a, "f32")],
        tuple_shape(array("f32", (3,)), array("f32", (3,)), array("c64", (3, 3)),
                    array("c64", (3, 3)), scalar("s32")),
        "{compute_left = 78 : ui8, compute_right = 86 : ui8}")
    w = wr + 1j * wi
    np.testing.assert_allclose(a @ vr, vr * w, rtol=1e-5, atol=1e-5)
    ww, wv = jax.jit(jnp.linalg.eig)(a)
    np.testing.assert_allclose(w, ww, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vr, wv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [jnp.linalg.cholesky, jnp.linalg.qr, jnp.linalg.eigh,
                                jax.scipy.linalg.lu], ids=["cholesky", "qr", "eigh", "lu"])
def test_jax_hlo_text_end_to_end(fn):
    """jax's own HLO text (custom calls, backend_config dictionaries) parsed and evaluated."""
    import hlo
    a = spd(4, np.float32)
    module = hlo.parse_hlo(jax.jit(fn).lower(a).as_text(dialect="hlo"))
    got = hlo.evaluate(module, [a])
    want = jax.jit(fn)(a)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
