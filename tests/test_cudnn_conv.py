"""The ``convolution`` library call of target ``cuda`` (codegen/library/cudnn.py).

Torch's CPU convolutions run the same functional API as cuDNN, so every case here runs on
the CPU: each HLO convolution goes through the call on torch tensors (operands and result
as strided, non-contiguous views, as the runtime's arena hands them) and is checked against
the reference interpreter (``hlo.evaluate`` on a one-instruction module) and against
``jax.jit`` of the same convolution. The last tests run whole programs through
``runtime.jit(backend="cuda")`` with Triton's interpreter, as tests/test_cuda_runtime.py does.

With a GPU, the call runs on CUDA tensors (cuDNN itself); there f32 convs at DEFAULT
precision use TF32, as XLA:GPU's do, and are held to 2e-3 in norm. Torch's CPU f32 conv
is full f32, so on the CPU (and at HIGHEST precision) f32 is held to ~1e-5 relative.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
HAS_CUDA = bool(torch.cuda.is_available())
if not HAS_CUDA:
    # Before triton is imported: it reads the switch once.
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if HAS_CUDA else "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from jax import lax  # noqa: E402

import hlo  # noqa: E402
from codegen.library import lookup  # noqa: E402
from codegen.library.cudnn import cudnn_convolution, plan, supports  # noqa: E402
from hlo import Builder, ConvDimLabels, Window, WindowDim  # noqa: E402
from hlo.shape import array  # noqa: E402

RNG = np.random.default_rng(7)
NP = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}
JNP = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16, "f64": jnp.float64}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "float64": torch.float64}


# --- the three ways of computing one convolution ----------------------------------------------
def strided(a: np.ndarray, seed: int) -> "torch.Tensor":
    """``a`` as a torch tensor with its logical dims but a shuffled physical order (what an
    arena view with a non-default layout looks like)."""
    perm = np.random.default_rng(seed).permutation(a.ndim)
    phys = np.ascontiguousarray(np.transpose(a, perm))
    # torch has no numpy bfloat16: through f32, which holds every bf16 value exactly
    wide = phys.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else phys
    t = torch.from_numpy(wide).to(DEVICE).to(TORCH[a.dtype.name])
    t = t.permute(*np.argsort(perm).tolist())
    assert tuple(t.shape) == a.shape
    return t


def via_call(inst, x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The library call writing a strided output view (the runtime's arena case)."""
    dims = inst.shape.dims
    perm = list(reversed(range(len(dims))))
    phys = torch.full([dims[d] for d in perm], float("nan"),
                      dtype=TORCH[np.dtype(inst.shape.dtype.np_dtype).name], device=DEVICE)
    out = phys.permute(*np.argsort(perm).tolist())
    cudnn_convolution(inst, [strided(x, 1), strided(k, 2)], out=out)
    out = out.cpu()
    if out.dtype == torch.bfloat16:
        out = out.float()
    return out.numpy().astype(inst.shape.dtype.np_dtype)


def via_jax(inst, x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """jax.jit of the same convolution, its attributes spelled as lax arguments."""
    dl, dims = inst.attrs["dim_labels"], inst.attrs["window"].dims
    dn = lax.ConvDimensionNumbers((dl.input_batch, dl.input_feature, *dl.input_spatial),
                                  (dl.kernel_output_feature, dl.kernel_input_feature,
                                   *dl.kernel_spatial),
                                  (dl.output_batch, dl.output_feature, *dl.output_spatial))
    flips = [dl.kernel_spatial[i] for i, d in enumerate(dims) if d.window_reversal]
    out_t = JNP[inst.shape.dtype.name]

    def f(a, b):
        return lax.conv_general_dilated(
            a, lax.rev(b, flips) if flips else b, [d.stride for d in dims],
            [(d.padding_low, d.padding_high) for d in dims], [d.base_dilation for d in dims],
            [d.window_dilation for d in dims], dn,
            feature_group_count=inst.attrs.get("feature_group_count", 1),
            batch_group_count=inst.attrs.get("batch_group_count", 1),
            precision=lax.Precision.HIGHEST, preferred_element_type=out_t)
    return np.asarray(jax.jit(f)(x, k))


def alone(inst):
    """``inst`` as the root of a module of its own (its operands become parameters)."""
    b = Builder("main")
    p, q = (b.parameter(o.shape) for o in inst.operands)
    root = b.op("convolution", p, q, shape=inst.shape, **inst.attrs)
    return b.module(), root


def check(inst, seed: int = 0) -> None:
    """The call on random operands == hlo.evaluate == jax.jit."""
    mod, conv = alone(inst)
    rng = np.random.default_rng(seed)
    x, k = (rng.standard_normal(o.shape.dims).astype(o.shape.dtype.np_dtype)
            for o in conv.operands)
    got = via_call(conv, x, k)
    ref = np.asarray(hlo.evaluate(mod, [x, k]))
    want = via_jax(conv, x, k)
    assert got.shape == ref.shape == want.shape and got.dtype == want.dtype
    for name, other in (("interpreter", ref), ("jax.jit", want)):
        g, w = got.astype(np.float64), other.astype(np.float64)
        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
        if inst.shape.dtype.name in ("bf16", "f16"):
            assert err < 1e-2, (name, err, conv.to_text())
        elif HAS_CUDA and plan(conv).tf32:
            assert err < 2e-3, (name, err, conv.to_text())
        else:
            tol = 1e-5 if inst.shape.dtype.name == "f32" else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(np.abs(w).max(), 1.0),
                                       err_msg=f"vs {name}: {conv.to_text()}")


def convs(module) -> list:
    return [i for c in module.computations for i in c.instructions if i.opcode == "convolution"]


def conv_of(x_shape, k_shape, specs, strides, padding, lhs_dil=None, rhs_dil=None, fgc=1,
            bgc=1, dtype="f32", out_dtype=None):
    """The convolution instruction hlo.from_jax makes of lax.conv_general_dilated."""
    nsp = len(strides)
    dn = lax.conv_dimension_numbers(x_shape, k_shape, specs)
    pet = JNP[out_dtype] if out_dtype else None
    f = lambda a, b: lax.conv_general_dilated(  # noqa: E731
        a, b, strides, padding, lhs_dil or (1,) * nsp, rhs_dil or (1,) * nsp, dn,
        feature_group_count=fgc, batch_group_count=bgc, preferred_element_type=pet)
    m = hlo.from_jax(f, np.zeros(x_shape, NP[dtype]), np.zeros(k_shape, NP[dtype]))
    (inst,) = convs(m)
    return inst


# --- the table ------------------------------------------------------------------------------
CASES = {
    "nhwc_hwio": dict(x_shape=(2, 9, 8, 3), k_shape=(3, 3, 3, 4),
                      specs=("NHWC", "HWIO", "NHWC"), strides=(1, 1), padding=[(1, 1), (1, 1)]),
    "nchw_oihw_stride": dict(x_shape=(2, 3, 11, 10), k_shape=(5, 3, 3, 2),
                             specs=("NCHW", "OIHW", "NCHW"), strides=(2, 3),
                             padding=[(1, 1), (0, 0)]),
    "nhwc_in_nchw_out": dict(x_shape=(2, 7, 6, 4), k_shape=(3, 4, 2, 2),
                             specs=("NHWC", "OIHW", "NCHW"), strides=(1, 1),
                             padding=[(0, 0), (0, 0)]),
    "conv1d": dict(x_shape=(3, 4, 17), k_shape=(6, 4, 5), specs=("NCH", "OIH", "NCH"),
                   strides=(2,), padding=[(2, 2)]),
    "conv1d_nwc": dict(x_shape=(2, 13, 3), k_shape=(4, 3, 5), specs=("NWC", "WIO", "NWC"),
                       strides=(1,), padding=[(0, 3)]),
    "conv3d": dict(x_shape=(1, 2, 6, 5, 7), k_shape=(3, 2, 2, 3, 2),
                   specs=("NCDHW", "OIDHW", "NCDHW"), strides=(1, 2, 1),
                   padding=[(1, 0), (1, 1), (0, 1)]),
    "asymmetric_padding": dict(x_shape=(2, 3, 8, 9), k_shape=(4, 3, 3, 3),
                               specs=("NCHW", "OIHW", "NCHW"), strides=(1, 2),
                               padding=[(0, 2), (3, 1)]),
    "negative_padding": dict(x_shape=(2, 3, 10, 9), k_shape=(4, 3, 3, 2),
                             specs=("NCHW", "OIHW", "NCHW"), strides=(1, 1),
                             padding=[(-2, 1), (2, -3)]),
    "rhs_dilation": dict(x_shape=(2, 12, 11, 3), k_shape=(3, 2, 3, 5),
                         specs=("NHWC", "HWIO", "NHWC"), strides=(1, 1),
                         padding=[(2, 2), (1, 0)], rhs_dil=(2, 3)),
    "lhs_dilation": dict(x_shape=(2, 3, 5, 6), k_shape=(4, 3, 3, 3),
                         specs=("NCHW", "OIHW", "NCHW"), strides=(1, 1),
                         padding=[(2, 2), (2, 3)], lhs_dil=(2, 2)),
    "lhs_dilation_strided": dict(x_shape=(2, 3, 5, 6), k_shape=(4, 3, 3, 2),
                                 specs=("NCHW", "OIHW", "NCHW"), strides=(2, 1),
                                 padding=[(1, 2), (0, 1)], lhs_dil=(2, 3)),
    "lhs_dilation_negative_pad": dict(x_shape=(1, 2, 7), k_shape=(3, 2, 3),
                                      specs=("NCH", "OIH", "NCH"), strides=(1,),
                                      padding=[(-1, 4)], lhs_dil=(3,)),
    "lhs_and_rhs_dilation": dict(x_shape=(2, 2, 6, 5), k_shape=(2, 2, 2, 3),
                                 specs=("NCHW", "OIHW", "NCHW"), strides=(1, 1),
                                 padding=[(2, 1), (4, 4)], lhs_dil=(2, 2), rhs_dil=(2, 2)),
    "depthwise": dict(x_shape=(2, 9, 8, 6), k_shape=(3, 3, 1, 6), specs=("NHWC", "HWIO", "NHWC"),
                      strides=(1, 1), padding=[(1, 1), (1, 1)], fgc=6),
    "feature_groups": dict(x_shape=(2, 6, 10, 9), k_shape=(9, 2, 3, 2),
                           specs=("NCHW", "OIHW", "NCHW"), strides=(1, 2),
                           padding=[(2, 0), (1, -1)], lhs_dil=(2, 1), rhs_dil=(1, 3), fgc=3),
    "batch_groups": dict(x_shape=(4, 5, 7, 3), k_shape=(2, 2, 3, 6),
                         specs=("NHWC", "HWIO", "NCHW"), strides=(1, 1),
                         padding=[(0, 0), (1, 0)], rhs_dil=(1, 2), bgc=2),
    "batch_groups_1d": dict(x_shape=(6, 2, 9), k_shape=(9, 2, 3), specs=("NCH", "OIH", "NCH"),
                            strides=(2,), padding=[(1, 1)], bgc=3),
    "bf16": dict(x_shape=(2, 8, 8, 16), k_shape=(3, 3, 16, 8), specs=("NHWC", "HWIO", "NHWC"),
                 strides=(1, 1), padding=[(1, 1), (1, 1)], dtype="bf16"),
    "bf16_to_f32": dict(x_shape=(2, 8, 8, 16), k_shape=(3, 3, 16, 8),
                        specs=("NHWC", "HWIO", "NHWC"), strides=(2, 2),
                        padding=[(1, 1), (1, 1)], dtype="bf16", out_dtype="f32"),
    "f16_grouped": dict(x_shape=(2, 8, 7, 8), k_shape=(8, 2, 3, 3), specs=("NCHW", "OIHW", "NCHW"),
                        strides=(1, 1), padding=[(1, 1), (0, 2)], fgc=4, dtype="f16"),
    "f64": dict(x_shape=(2, 3, 9), k_shape=(2, 3, 4), specs=("NCH", "OIH", "NCH"),
                strides=(1,), padding=[(1, 2)], rhs_dil=(2,), dtype="f64"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_convolution_matches_interpreter_and_jax(name):
    case = dict(CASES[name])
    if case.get("dtype") == "f64" or case.get("out_dtype") == "f64":
        with jax.enable_x64(True):
            inst = conv_of(**case)
            assert supports(inst)
            check(inst)
        return
    inst = conv_of(**case)
    assert supports(inst) and lookup("cuda", inst) is cudnn_convolution
    check(inst)


def _labelled(labels: str, x_shape, k_shape, window, dtype="f32", out_dtype=None, **attrs):
    """A convolution made with the Builder (attributes jax cannot spell: window reversal)."""
    b = Builder("main")
    p, q = b.parameter(array(dtype, x_shape)), b.parameter(array(dtype, k_shape))
    inst = b.op("convolution", p, q, window=Window(tuple(window)),
                dim_labels=ConvDimLabels.parse(labels), **attrs)
    if out_dtype:
        inst = b.op("convolution", p, q, shape=array(out_dtype, inst.shape.dims),
                    window=Window(tuple(window)), dim_labels=ConvDimLabels.parse(labels), **attrs)
    return inst


def test_window_reversal_flips_the_kernel():
    inst = _labelled("b01f_01io->b01f", (2, 7, 6, 3), (3, 2, 3, 4),
                     [WindowDim(3, padding_low=1, padding_high=1, window_reversal=True),
                      WindowDim(2, stride=2)])
    check(inst)
    # and by hand, 1-d: a reversed window is np.convolve's true convolution
    one = _labelled("bf0_oi0->bf0", (1, 1, 6), (1, 1, 3), [WindowDim(3, window_reversal=True)])
    x, k = RNG.standard_normal((1, 1, 6)), RNG.standard_normal((1, 1, 3))
    got = via_call(one, x.astype(np.float32), k.astype(np.float32))
    np.testing.assert_allclose(got[0, 0], np.convolve(x[0, 0], k[0, 0], "valid"), rtol=1e-5)


def test_window_reversal_with_lhs_dilation_takes_the_transposed_path():
    inst = _labelled("bf01_oi01->bf01", (2, 3, 5, 4), (4, 3, 3, 2),
                     [WindowDim(3, padding_low=2, padding_high=3, base_dilation=2,
                                window_reversal=True),
                      WindowDim(2, padding_low=1, padding_high=1, base_dilation=3)])
    assert plan(inst).transposed
    check(inst)


def test_no_spatial_dims_is_a_dot():
    inst = _labelled("bf_oi->bf", (5, 6), (4, 6), [])
    check(inst)
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    k = RNG.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(via_call(inst, x, k), x @ k.T, rtol=1e-5, atol=1e-5)


def test_lhs_dilation_paths():
    # Stride 1 maps onto conv_transpose (cuDNN's backward-data kernel) ...
    assert plan(conv_of(**CASES["lhs_dilation"])).transposed
    assert plan(conv_of(**CASES["lhs_and_rhs_dilation"])).transposed
    # ... a strided one, or low padding past the dilated kernel's reach, inserts zeros.
    assert not plan(conv_of(**CASES["lhs_dilation_strided"])).transposed
    far = _labelled("bf0_oi0->bf0", (1, 2, 7), (3, 2, 3),
                    [WindowDim(3, padding_low=4, padding_high=0, base_dilation=2)])
    assert not plan(far).transposed
    check(far)
    # output_padding past torch's limit (hi - lo >= max(d, r)) also inserts zeros
    wide = _labelled("bf0_oi0->bf0", (1, 2, 7), (3, 2, 3),
                     [WindowDim(3, padding_low=0, padding_high=4, base_dilation=2)])
    assert not plan(wide).transposed
    check(wide)


def test_weight_gradient_as_backward_filter():
    # out[c, o, k] = sum_n,w X[c, n, k*stride + w*r] * DY[o, n, w]: a window as large as the
    # image, a kernel-sized output; negative and asymmetric padding on the way.
    inst = _labelled("fb01_io01->fb01", (3, 2, 13, 11), (3, 4, 5, 4),
                     [WindowDim(5, stride=2, padding_low=-1, padding_high=1, window_dilation=2),
                      WindowDim(4, padding_low=2, padding_high=0, window_dilation=3)])
    p = plan(inst)
    assert p.kind == "filter_grad" and p.name == "cudnn.conv_backward_filter2d f32"
    check(inst)
    # A window that torch's size formula does not give back (a row of input past the last
    # window) stays a plain conv.
    odd = _labelled("fb0_io0->fb0", (3, 2, 12), (3, 4, 5), [WindowDim(5, stride=3)])
    assert odd.shape.dims == (4, 2, 3) and plan(odd).kind == "conv"
    check(odd)


def test_highest_precision_and_names():
    inst = conv_of(**CASES["nhwc_hwio"])
    p = plan(inst)
    assert p.tf32 and p.compute == "f32" and p.name == "cudnn.conv2d f32"
    hi = _labelled("b01f_01io->b01f", (2, 9, 8, 3), (3, 3, 3, 4),
                   [WindowDim(3, padding_low=1, padding_high=1)] * 2,
                   operand_precision=("highest", "highest"))
    assert not plan(hi).tf32
    assert plan(conv_of(**CASES["bf16"])).tf32 is False          # bf16 has no TF32 switch
    up = plan(conv_of(**CASES["bf16_to_f32"]))
    assert up.compute == "f32" and up.tf32
    assert "bg=2" in plan(conv_of(**CASES["batch_groups"])).name


def test_precision_switch_is_restored():
    inst = conv_of(**CASES["nhwc_hwio"])
    before = (torch.backends.cudnn.conv.fp32_precision, torch.get_float32_matmul_precision())
    check(inst)
    assert (torch.backends.cudnn.conv.fp32_precision,
            torch.get_float32_matmul_precision()) == before


def test_integer_and_complex_convs_are_not_taken():
    s8 = _labelled("bf0_oi0->bf0", (2, 3, 11), (4, 3, 3), [WindowDim(3)], dtype="s8",
                   out_dtype="s32")
    assert not supports(s8) and lookup("cuda", s8) is None
    f32_to_s32 = _labelled("bf0_oi0->bf0", (2, 3, 11), (4, 3, 3), [WindowDim(3)],
                           out_dtype="s32")
    assert not supports(f32_to_s32)
    c64 = _labelled("bf0_oi0->bf0", (2, 3, 11), (4, 3, 3), [WindowDim(3)], dtype="c64")
    assert not supports(c64)
    with pytest.raises(ValueError, match="not one this call takes"):
        cudnn_convolution(s8, [torch.zeros(2, 3, 11, dtype=torch.int8)] * 2)


def test_returns_a_fresh_result_without_out():
    # The runtime's aliased case: the output shares bytes with an operand.
    inst = conv_of(**CASES["batch_groups"])
    x = RNG.standard_normal((4, 5, 7, 3)).astype(np.float32)
    k = RNG.standard_normal((2, 2, 3, 6)).astype(np.float32)
    got = cudnn_convolution(inst, [strided(x, 3), strided(k, 4)])
    assert tuple(got.shape) == inst.shape.dims
    want = via_jax(inst, x, k)
    tol = 2e-3 if HAS_CUDA else 1e-5            # TF32 on a GPU
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=tol,
                               atol=tol * np.abs(want).max())


def test_empty_contraction_gives_zeros():
    inst = _labelled("bf0_oi0->bf0", (2, 0, 5), (3, 0, 2), [WindowDim(2)])
    out = torch.full((2, 3, 4), 7.0)
    cudnn_convolution(inst, [torch.zeros(2, 0, 5), torch.zeros(3, 0, 2)], out=out)
    assert torch.equal(out, torch.zeros(2, 3, 4))


# --- the convolutions jax.grad writes -----------------------------------------------------------
def _loss(specs, strides, padding, rhs_dil=(1, 1), fgc=1):
    def f(x, k):
        dn = lax.conv_dimension_numbers(x.shape, k.shape, specs)
        y = lax.conv_general_dilated(x, k, strides, padding, (1, 1), rhs_dil, dn,
                                     feature_group_count=fgc)
        return jnp.sum(jnp.tanh(y))
    return f


GRADS = {
    "strided_nhwc": ((2, 9, 10, 3), (3, 3, 3, 4), ("NHWC", "HWIO", "NHWC"), (2, 2),
                     [(1, 1), (0, 1)], (1, 1), 1),
    "dilated_nchw": ((2, 3, 10, 9), (4, 3, 3, 2), ("NCHW", "OIHW", "NCHW"), (1, 2),
                     [(2, 2), (1, 0)], (2, 1), 1),
    "grouped_strided": ((2, 8, 9, 6), (3, 3, 2, 6), ("NHWC", "HWIO", "NHWC"), (2, 1),
                        "SAME", (1, 1), 3),
}


@pytest.mark.parametrize("name", list(GRADS))
def test_every_gradient_convolution(name):
    xs, ks, specs, strides, padding, rhs_dil, fgc = GRADS[name]
    f = _loss(specs, strides, padding, rhs_dil, fgc)
    x, k = np.zeros(xs, np.float32), np.zeros(ks, np.float32)
    m = hlo.from_jax(jax.grad(f, argnums=(0, 1)), x, k)
    found = convs(m)
    assert len(found) == 3, m.to_text()                 # forward, d/dinput, d/dkernel
    for i, inst in enumerate(found):
        assert supports(inst), inst.to_text()
        check(inst, seed=i)
    kinds = sorted(plan(i).kind for i in found)
    # forward; d/dkernel as cuDNN's backward-filter (grouped ones fold batch groups);
    # d/dinput as conv_transpose where strided (a plain conv otherwise)
    assert kinds == sorted(["conv", "conv" if fgc > 1 else "filter_grad",
                            "transposed" if strides != (1, 1) else "conv"]), kinds
    window = [i.attrs["window"].dims for i in found]
    if strides != (1, 1):   # the input gradient of a strided conv dilates its input
        assert any(any(d.base_dilation > 1 for d in w) for w in window)
    if fgc > 1:             # the kernel gradient of a grouped conv groups the batch
        assert any(i.attrs.get("batch_group_count", 1) > 1 for i in found)


# --- through the CUDA runtime (Triton's interpreter on CPU torch tensors) ------------------------
interpret = pytest.mark.skipif(HAS_CUDA or os.environ.get("TRITON_INTERPRET") != "1",
                               reason="CPU-mode tests run Triton's interpreter (no GPU here)")


@pytest.fixture
def cache_dir(tmp_path_factory, monkeypatch):
    if not os.environ.get("HLOTK_CACHE_DIR"):
        monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _compiled(fn, *args):
    pytest.importorskip("triton")
    import runtime
    from runtime.cuda import executable_of
    c = runtime.jit(fn, backend="cuda").lower(*args).compile()
    return c, executable_of(c)


def _conv_thunks(exe) -> list:
    return [t for t in exe.thunks() if t.inst.opcode == "convolution"]


@interpret
def test_runtime_runs_a_conv_layer_as_a_library_call(cache_dir):
    def layer(x, k, b):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y + b)
    x = RNG.standard_normal((2, 8, 8, 4)).astype(np.float32)
    k = RNG.standard_normal((3, 3, 4, 8)).astype(np.float32)
    b = RNG.standard_normal((8,)).astype(np.float32)
    c, exe = _compiled(layer, x, k, b)
    assert exe.kernel_count().get("library-call", 0) >= 1
    (t,) = _conv_thunks(exe)
    assert t.kind == "library-call" and "cudnn.conv2d f32" in exe.describe()
    assert not exe.host_fallbacks()
    want = np.asarray(jax.jit(layer)(x, k, b))
    np.testing.assert_allclose(np.asarray(c(x, k, b)), want, rtol=1e-5, atol=1e-5)


@interpret
def test_runtime_bf16_conv_keeps_channels_last(cache_dir):
    # Layout assignment gives 16-bit GPU convs NHWC operands (cuDNN's tensor-core format);
    # an NCHW program then reaches the call as channels-last strided views.
    def f(x, k):
        return lax.conv_general_dilated(x, k, (2, 2), [(1, 1), (1, 1)],
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))
    x = RNG.standard_normal((2, 8, 10, 10)).astype(ml_dtypes.bfloat16)
    k = RNG.standard_normal((16, 8, 3, 3)).astype(ml_dtypes.bfloat16)
    c, exe = _compiled(f, x, k)
    (t,) = _conv_thunks(exe)
    assert t.kind == "library-call" and "cudnn.conv2d bf16" in exe.describe()
    assert t.inst.operands[0].shape.layout.minor_to_major[0] == 1      # C is minor-most
    got = np.asarray(c(x, k)).astype(np.float64)
    want = np.asarray(jax.jit(f)(x, k)).astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


@interpret
def test_runtime_runs_the_gradient_convolutions(cache_dir):
    f = jax.grad(_loss(("NHWC", "HWIO", "NHWC"), (2, 2), [(1, 1), (0, 1)]), argnums=(0, 1))
    x = RNG.standard_normal((2, 9, 10, 3)).astype(np.float32)
    k = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32) * 0.3
    c, exe = _compiled(f, x, k)
    ts = _conv_thunks(exe)
    assert len(ts) == 3 and all(t.kind == "library-call" for t in ts), exe.describe()
    for got, want in zip(c(x, k), jax.jit(f)(x, k)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                                   atol=1e-5 * float(np.abs(want).max()))


def _zoo_convs() -> list[str]:
    from tests.zoo import ZOO
    return [p.name for p in ZOO if "conv" in p.tags]


@interpret
@pytest.mark.parametrize("name", _zoo_convs())
def test_zoo_conv_programs(cache_dir, name):
    from tests.zoo import by_name
    prog = by_name(name)
    args = prog.args()
    c, exe = _compiled(prog.fn, *args)
    ts = _conv_thunks(exe)
    assert ts and all(t.kind == "library-call" for t in ts), exe.describe()
    want = jax.tree_util.tree_leaves(jax.jit(prog.fn)(*args))
    got = jax.tree_util.tree_leaves(c(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                                   atol=1e-5 * max(float(np.abs(np.asarray(w)).max()), 1.0))


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_weight_gradient_reads_the_activations_in_their_own_layout(dtype):
    """For the GPU, the weight gradient's operands (the activations and the output gradient,
    labelled f01b / i01o by jax.grad) keep their own NHWC (16-bit) or NCHW order: the
    forward conv and the batch norm around it use the same, and no fusion writes or
    reduces them with the image batch minor (a ResNet block's batch norm had)."""
    import runtime
    from hlo.layout_util import major_to_minor
    from passes.pipelines import PIPELINES
    dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 16)).astype(dt)
    k = (np.random.default_rng(1).standard_normal((3, 3, 16, 16)) * 0.1).astype(dt)
    specs = ("NHWC", "HWIO", "NHWC") if dtype == "bf16" else ("NCHW", "OIHW", "NCHW")
    if dtype == "f32":
        x, k = x.transpose(0, 3, 1, 2).copy(), k.transpose(3, 2, 0, 1).copy()

    def loss(k):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=specs)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))
    c = runtime.jit(jax.grad(loss), target="h200", pipeline=PIPELINES["default"]["cuda"]) \
        .lower(k).compile()
    grads = [i for comp in c.module.computations for i in comp.instructions
             if i.opcode == "convolution" and plan(i) is not None and plan(i).kind == "filter_grad"]
    assert len(grads) == 1, c.as_text()
    for operand in grads[0].operands:
        assert major_to_minor(operand.shape.layout, 4) == (0, 1, 2, 3), operand.to_text()
    want = np.asarray(jax.jit(jax.grad(loss))(k), np.float32)
    got = np.asarray(c(k), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2 if dtype == "bf16" else 1e-4,
                               atol=2e-2 * np.abs(want).max())
