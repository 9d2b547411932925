"""hlo.from_jax / from_stablehlo: the imported HLO has XLA's opcodes and attributes, and the
reference interpreter on it returns what jax.jit returns."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hlo
from hlo.attrs import ConvDimLabels, Metadata, Raw, SliceSpec, Window

jax.config.update("jax_enable_x64", False)
RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def opcodes(m: hlo.Module) -> set[str]:
    return {i.opcode for i in m.all_instructions()}


def find(m: hlo.Module, opcode: str) -> hlo.Instruction:
    for i in m.all_instructions():
        if i.opcode == opcode:
            return i
    raise AssertionError(f"no {opcode} in module")


def check_matches_jax(fn, *args, rtol=1e-5, atol=1e-5):
    m = hlo.from_jax(fn, *args)
    got = hlo.evaluate(m, [np.asarray(a) for a in jax.tree_util.tree_leaves(args)])
    want = jax.jit(fn)(*args)
    want_leaves = jax.tree_util.tree_leaves(want)
    got_leaves = list(got) if isinstance(got, tuple) else [got]
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "fc" or w.dtype == ml_dtypes.bfloat16:
            np.testing.assert_allclose(g.astype(np.complex128 if w.dtype.kind == "c" else
                                                np.float64),
                                       w.astype(np.complex128 if w.dtype.kind == "c" else
                                                np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return m


# --- (function, args, opcodes that must appear) -------------------------------------------
def mlp(x, w1, b1, w2):
    return jnp.tanh(jax.nn.relu(x @ w1 + b1) @ w2)


def conv_pool(x, k):
    y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def scan_cumsum(x):
    return jax.lax.scan(lambda c, v: (c + v, c * v), jnp.zeros(x.shape[1:], x.dtype), x)


def while_count(x):
    return jax.lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[1] * 1.5 + x), (0, x))[1]


def cond_fn(p, x):
    return jax.lax.cond(p > 0, lambda v: jnp.sin(v), lambda v: jnp.cos(v) * x.sum(), x)


def switch_fn(i, x):
    return jax.lax.switch(i, [lambda v: v + 1, lambda v: v * 2, lambda v: -v], x)


def gather_fn(x, idx):
    return x[idx], x[:, idx[0]]


def scatter_fn(x, idx, u):
    return x.at[idx].add(u), x.at[idx].set(u)


def sort_fn(x):
    return jnp.sort(x, axis=-1), jnp.argsort(x[0], stable=True)


def top_k_fn(x):
    return jax.lax.top_k(x, 3)


def rng_fn(key):
    return jax.random.uniform(key, (4, 3)), jax.random.bits(key, (5,))


def complex_fft(x):
    c = jnp.fft.fft(x.astype(jnp.complex64))
    return jnp.real(c), jnp.imag(c), jnp.abs(jnp.fft.ifft(c))


def rfft_fn(x):
    return jnp.fft.irfft(jnp.fft.rfft(x), n=x.shape[-1])


def bf16_fn(x, y):
    return (x.astype(jnp.bfloat16) * y.astype(jnp.bfloat16) + 1).astype(jnp.bfloat16)


def int8_dot(a, b):
    return jax.lax.dot(a, b, preferred_element_type=jnp.int32)


@jax.jit
def inner(x):
    return x * 2 + 1


def nested_jit(x):
    return inner(x) + inner(x * 3)


def grad_fn(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


def reductions(x):
    return x.max(axis=1), jnp.argmax(x, axis=0), x.prod(), jnp.mean(x, axis=(0, 1))


def layout_ops(x):
    return (jnp.transpose(x, (1, 0)), jnp.flip(x, 0), jnp.pad(x, ((1, 2), (0, 1))),
            jnp.concatenate([x, x], axis=1), x[1:3, ::2], x.reshape(-1))


def elementwise(x, y):
    return (jnp.exp(x) - jnp.log1p(jnp.abs(y)), jnp.maximum(x, y), jnp.where(x > y, x, y),
            jnp.clip(x, -0.5, 0.5), jnp.round(x), jnp.sign(y), jnp.arctan2(x, y),
            jax.lax.rsqrt(jnp.abs(x) + 1), jnp.isfinite(x / y))


def integer_ops(a, b):
    return (a & b, a | b, a ^ b, a << 2, a >> 1, jax.lax.population_count(a),
            jax.lax.clz(a), a // (b | 1), a % (b | 1))


def dynamic_ops(x, i):
    s = jax.lax.dynamic_slice(x, (i, 0), (2, 3))
    return jax.lax.dynamic_update_slice(x, s * 10, (0, i))


def special_fns(x):
    return (jax.lax.erf(x), jnp.arcsin(x * 0.5), jnp.arccosh(jnp.abs(x) + 1), jnp.sinh(x),
            jnp.cosh(x), jnp.arctanh(x * 0.5), jnp.tan(x), jax.scipy.special.erfinv(x * 0.5))


def cumsum_fn(x):
    return jnp.cumsum(x, axis=0), jax.nn.logsumexp(x)


def iota_broadcast(x):
    return x + jnp.arange(x.shape[1], dtype=x.dtype)[None, :]


key = jax.random.key(0) if False else jax.random.PRNGKey(0)

CASES = [
    ("mlp", mlp, (f32(4, 8), f32(8, 16), f32(16), f32(16, 3)), {"dot", "maximum", "tanh", "broadcast"}),
    ("conv_pool", conv_pool, (f32(1, 6, 6, 2), f32(3, 3, 2, 4)), {"convolution", "reduce-window"}),
    ("scan", scan_cumsum, (f32(5, 3),), {"while"}),
    ("while", while_count, (f32(3),), {"while", "compare"}),
    ("cond", cond_fn, (np.float32(1.0), f32(4)), {"conditional"}),
    ("cond_false", cond_fn, (np.float32(-1.0), f32(4)), {"conditional"}),
    ("switch", switch_fn, (np.int32(2), f32(3)), {"conditional", "clamp"}),
    ("gather", gather_fn, (f32(5, 4), np.array([3, 1], np.int32)), {"gather"}),
    ("scatter", scatter_fn, (f32(6), np.array([1, 4], np.int32), f32(2)), {"scatter"}),
    ("sort", sort_fn, (f32(3, 6),), {"sort"}),
    ("top_k", top_k_fn, (f32(2, 7),), {"sort", "slice"}),  # jax lowers top_k to sort on CPU
    ("rng", rng_fn, (np.asarray(key),), {"shift-right-logical", "xor"}),
    ("complex_fft", complex_fft, (f32(8),), {"fft", "real", "imag"}),
    ("rfft", rfft_fn, (f32(2, 8),), {"fft"}),
    ("bf16", bf16_fn, (f32(4), f32(4)), {"convert", "multiply"}),
    ("int8_dot", int8_dot, (RNG.integers(-100, 100, (3, 4)).astype(np.int8),
                            RNG.integers(-100, 100, (4, 2)).astype(np.int8)), {"dot"}),
    ("nested_jit", nested_jit, (f32(3),), {"call"}),
    ("grad", grad_fn, (f32(4, 3), f32(2, 4)), {"dot", "transpose"}),
    ("reductions", reductions, (f32(3, 4),), {"reduce"}),
    ("layout_ops", layout_ops, (f32(4, 6),), {"transpose", "reverse", "pad", "concatenate",
                                              "slice", "reshape"}),
    ("elementwise", elementwise, (f32(5), f32(5)), {"exponential", "log-plus-one", "select",
                                                    "atan2", "rsqrt", "is-finite"}),
    ("integer_ops", integer_ops, (RNG.integers(0, 1000, 6).astype(np.int32),
                                  RNG.integers(0, 1000, 6).astype(np.int32)),
     {"and", "or", "xor", "shift-left", "popcnt", "count-leading-zeros"}),
    ("dynamic_ops", dynamic_ops, (f32(4, 6), np.int32(1)), {"dynamic-slice",
                                                            "dynamic-update-slice"}),
    ("special", special_fns, (f32(6) * 0.5,), {"atan2", "tan", "log-plus-one"}),
    ("cumsum", cumsum_fn, (f32(5, 2),), {"reduce-window"}),
    ("iota", iota_broadcast, (f32(2, 5),), {"iota", "broadcast"}),
]


@pytest.mark.parametrize("name,fn,args,ops", CASES, ids=[c[0] for c in CASES])
def test_from_jax_opcodes(name, fn, args, ops):
    m = hlo.from_jax(fn, *args)
    hlo.verify(m)
    missing = ops - opcodes(m)
    assert not missing, f"{name}: missing opcodes {missing}; have {sorted(opcodes(m))}"
    assert m.entry.name.startswith("main.")
    assert m.computations[-1] is m.entry
    for inst in m.all_instructions():
        for leaf in inst.shape.leaves():
            if leaf.is_array and leaf.rank:
                assert leaf.layout is not None and leaf.layout.is_row_major


@pytest.mark.parametrize("name,fn,args,ops", CASES, ids=[c[0] for c in CASES])
def test_from_jax_evaluates_like_jax(name, fn, args, ops):
    tol = 2e-2 if name == "bf16" else 1e-4
    check_matches_jax(fn, *args, rtol=tol, atol=tol)


# --- attributes ---------------------------------------------------------------------------
def test_dot_and_params_attrs():
    def f(x, w):
        return jax.lax.dot_general(x, w, (((2,), (1,)), ((0,), (0,))),
                                   precision=jax.lax.Precision.HIGHEST)
    m = hlo.from_jax(f, jax.ShapeDtypeStruct((2, 3, 4), jnp.float32),
                     jax.ShapeDtypeStruct((2, 4, 5), jnp.float32))
    d = find(m, "dot")
    assert d.attrs["lhs_batch_dims"] == (0,) and d.attrs["rhs_batch_dims"] == (0,)
    assert d.attrs["lhs_contracting_dims"] == (2,) and d.attrs["rhs_contracting_dims"] == (1,)
    assert d.attrs["operand_precision"] == ("highest", "highest")
    assert str(d.shape) == "f32[2,3,5]{2,1,0}"
    assert [p.name.split(".")[0] for p in m.entry.parameters] == ["x", "w"]
    assert str(m.config["entry_computation_layout"]) == \
        "{(f32[2,3,4]{2,1,0}, f32[2,4,5]{2,1,0})->f32[2,3,5]{2,1,0}}"
    md = d.attrs["metadata"]
    assert isinstance(md, Metadata) and md.get("op_name").endswith("dot_general")
    assert md.get("source_file").endswith("test_import.py") and md.get("source_line") > 0


def test_conv_attrs():
    m = hlo.from_jax(conv_pool, f32(1, 6, 6, 2), f32(3, 3, 2, 4))
    c = find(m, "convolution")
    assert str(c.attrs["dim_labels"]) == "b01f_01io->b01f"
    assert isinstance(c.attrs["dim_labels"], ConvDimLabels)
    assert str(c.attrs["window"]) == "{size=3x3 pad=1_1x1_1}"
    rw = find(m, "reduce-window")
    assert str(rw.attrs["window"]) == "{size=1x2x2x1 stride=1x2x2x1}"
    assert rw.attrs["to_apply"].root.opcode == "maximum"


def test_while_tuple_and_gte():
    m = hlo.from_jax(while_count, f32(3))
    w = find(m, "while")
    assert w.shape.is_tuple and len(w.shape.elements) >= 2
    assert w.attrs["condition"].root.opcode == "compare"
    assert w.attrs["body"].root.opcode == "tuple"
    assert any(u.opcode == "get-tuple-element" for u in w.users)


def test_nested_jit_shares_one_computation():
    m = hlo.from_jax(nested_jit, f32(3))
    calls = [i for i in m.entry.instructions if i.opcode == "call"]
    assert len(calls) == 2 and calls[0].attrs["to_apply"] is calls[1].attrs["to_apply"]


def test_sort_and_compare_attrs():
    m = hlo.from_jax(sort_fn, f32(3, 6))
    s = [i for i in m.all_instructions() if i.opcode == "sort"]
    assert any(i.attrs.get("is_stable") for i in s)
    assert s[0].attrs["dimensions"] in ((1,), (0,))
    cmps = [i for i in s[0].attrs["to_apply"].instructions if i.opcode == "compare"]
    assert any(c.attrs["direction"] == "LT" for c in cmps)
    assert all(c.attrs["type"] in ("TOTALORDER", "FLOAT", "SIGNED") for c in cmps)


def test_slice_pad_gather_attrs():
    m = hlo.from_jax(layout_ops, f32(4, 6))
    sl = [i for i in m.all_instructions() if i.opcode == "slice"][0]
    assert isinstance(sl.attrs["slice"], SliceSpec) and str(sl.attrs["slice"]) == "{[1:3], [0:6:2]}"
    assert str(find(m, "pad").attrs["padding"]) == "1_2x0_1"
    g = find(hlo.from_jax(gather_fn, f32(5, 4), np.array([3, 1], np.int32)), "gather")
    assert g.attrs["slice_sizes"] == (1, 4) and g.attrs["start_index_map"] == (0,)


def test_rng_bit_generator_and_custom_call():
    src = """
    func.func @main(%s: tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>, tensor<3xf32>) {
      %0:2 = stablehlo.rng_bit_generator %s, algorithm = THREE_FRY : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)
      %c = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
      %1 = stablehlo.custom_call @my_ffi(%c) {api_version = 4 : i32, backend_config = {uplo = 76 : ui8}, has_side_effect = true} : (tensor<3xf32>) -> tensor<3xf32>
      return %0#0, %0#1, %1 : tensor<2xui64>, tensor<4xui32>, tensor<3xf32>
    }"""
    m = hlo.from_stablehlo(src)
    r = find(m, "rng-bit-generator")
    assert r.attrs["algorithm"] == "rng_three_fry" and r.shape.is_tuple
    cc = find(m, "custom-call")
    assert cc.attrs["custom_call_target"] == "my_ffi"
    assert cc.attrs["backend_config"] == Raw("{uplo = 76 : ui8}")
    assert cc.attrs["api_version"] == "API_VERSION_TYPED_FFI"
    assert cc.attrs["custom_call_has_side_effect"] is True
    assert m.entry.root.opcode == "tuple" and len(m.entry.root.operands) == 3


def test_constants_of_many_dtypes():
    src = """
    func.func @main() -> (tensor<2xbf16>, tensor<3xi4>, tensor<2xui2>, tensor<2xcomplex<f32>>, tensor<2x2xi1>, tensor<2xf8E4M3FN>, tensor<3xf32>) {
      %a = stablehlo.constant dense<[1.5, 0x7FC0]> : tensor<2xbf16>
      %b = stablehlo.constant dense<[-8, 0, 7]> : tensor<3xi4>
      %c = stablehlo.constant dense<[0, 3]> : tensor<2xui2>
      %d = stablehlo.constant dense<[(1.0, -2.0), (0.5, 0x7F800000)]> : tensor<2xcomplex<f32>>
      %e = stablehlo.constant dense<true> : tensor<2x2xi1>
      %f = stablehlo.constant dense<[0.5, -448.0]> : tensor<2xf8E4M3FN>
      %g = stablehlo.constant dense<"0x0000803F00000040000040C0"> : tensor<3xf32>
      return %a, %b, %c, %d, %e, %f, %g : tensor<2xbf16>, tensor<3xi4>, tensor<2xui2>, tensor<2xcomplex<f32>>, tensor<2x2xi1>, tensor<2xf8E4M3FN>, tensor<3xf32>
    }"""
    m = hlo.from_stablehlo(src)
    lits = [o.literal for o in m.entry.root.operands]
    assert lits[0].dtype == ml_dtypes.bfloat16 and lits[0][0] == 1.5 and np.isnan(lits[0][1])
    assert lits[1].dtype == ml_dtypes.int4 and lits[1].tolist() == [-8, 0, 7]
    assert lits[2].dtype == ml_dtypes.uint2 and lits[2].tolist() == [0, 3]
    assert lits[3].dtype == np.complex64 and lits[3][0] == 1 - 2j and np.isinf(lits[3][1].imag)
    assert lits[4].dtype == np.bool_ and lits[4].shape == (2, 2) and lits[4].all()
    assert lits[5].dtype == ml_dtypes.float8_e4m3fn and lits[5].astype(float).tolist() == [0.5, -448]
    assert lits[6].tolist() == [1.0, 2.0, -3.0]


def test_serialized_and_bytecode_inputs():
    exp = jax.export.export(jax.jit(mlp))(f32(4, 8), f32(8, 16), f32(16), f32(16, 3))
    m1 = hlo.from_stablehlo(exp.serialize())
    m2 = hlo.from_stablehlo(exp.mlir_module())
    m3 = hlo.from_exported(exp)
    assert opcodes(m1) == opcodes(m2) == opcodes(m3)
    assert m1.name == "jit_mlp"


def test_mhlo_sharding_and_replicas_config():
    src = """
    module @m attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) -> (tensor<4xf32> {mhlo.sharding = "{replicated}"}) {
        %0 = stablehlo.custom_call @Sharding(%a) {mhlo.sharding = "{devices=[2]0,1}"} : (tensor<4xf32>) -> tensor<4xf32>
        %1 = stablehlo.negate %0 : tensor<4xf32>
        return %1 : tensor<4xf32>
      }
    }"""
    m = hlo.from_stablehlo(src)
    assert m.config["num_partitions"] == 2 and "replica_count" not in m.config
    assert m.entry.parameters[0].sharding is not None
    assert "devices=[2]0,1" in str(m.entry.parameters[0].sharding)
    assert find(m, "custom-call").sharding is not None


def test_chlo_ops():
    src = """
    func.func @main(%x: tensor<2x5xf32>) -> (tensor<2x5xf32>, tensor<2x2xf32>, tensor<2x2xi32>, tensor<2x5xf32>) {
      %0 = chlo.erf %x : tensor<2x5xf32> -> tensor<2x5xf32>
      %1:2 = chlo.top_k(%x, k = 2) : tensor<2x5xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)
      %2 = chlo.asin %x : tensor<2x5xf32> -> tensor<2x5xf32>
      return %0, %1#0, %1#1, %2 : tensor<2x5xf32>, tensor<2x2xf32>, tensor<2x2xi32>, tensor<2x5xf32>
    }"""
    m = hlo.from_stablehlo(src)
    assert find(m, "erf").shape == hlo.array("f32", (2, 5), (1, 0))
    tk = find(m, "topk")
    assert tk.attrs["k"] == 2 and tk.attrs["largest"] is True and tk.shape.is_tuple
    x = np.array([[0.1, -0.5, 0.9, 0.3, -0.2], [0.7, 0.0, -0.9, 0.4, 0.2]], np.float32)
    erf, vals, idx, asin = hlo.evaluate(m, [x])
    np.testing.assert_allclose(erf, np.asarray(jax.lax.erf(x)), rtol=1e-5)
    np.testing.assert_array_equal(idx, [[2, 3], [0, 3]])
    np.testing.assert_allclose(vals, [[0.9, 0.3], [0.7, 0.4]], rtol=1e-6)
    np.testing.assert_allclose(asin, np.arcsin(x), rtol=1e-5)


# --- errors -------------------------------------------------------------------------------
def test_quantized_round_trip_and_unsupported_op_named_with_location():
    src = """
    func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.uniform_quantize %a : (tensor<4xf32>) -> tensor<4x!quant.uniform<i8:f32, 0.1>>
      %1 = stablehlo.uniform_dequantize %0 : (tensor<4x!quant.uniform<i8:f32, 0.1>>) -> tensor<4xf32>
      return %1 : tensor<4xf32>
    }"""
    # Quantized types are rewritten to their storage types (hlo/stablehlo/quant.py):
    # round(x / 0.1) to nearest even, clamped to i8, then scaled back.
    m = hlo.from_stablehlo(src)
    got = hlo.evaluate(m, [np.array([0.0, 0.14, -0.26, 20.0], np.float32)])
    np.testing.assert_allclose(got, [0.0, 0.1, -0.3, 12.7], rtol=1e-6)
    src2 = """
    func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.einsum %a, %a, config = "i,i->i" : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    with pytest.raises(hlo.ImportError, match=r"-:3:\d+: stablehlo.einsum: unsupported operation"):
        hlo.from_stablehlo(src2)


def test_dynamic_shape_rejected():
    src = """
    func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
      %0 = stablehlo.negate %a : tensor<?xf32>
      return %0 : tensor<?xf32>
    }"""
    with pytest.raises(hlo.ImportError, match="dynamic shapes are not supported"):
        hlo.from_stablehlo(src)


def test_garbage_input():
    with pytest.raises(hlo.ImportError, match="neither MLIR text"):
        hlo.from_stablehlo(b"\x00\xff\xfe garbage \x80")
    with pytest.raises(hlo.ImportError, match="cannot parse MLIR"):
        hlo.from_stablehlo("this is not mlir {")


# --- decompositions and ops added for the conformance suite ---------------------------------
def _mulhi_ref(a: int, b: int, bits: int = 64, signed: bool = True) -> int:
    """High half of the exact (Python big-int) product, wrapped to the type."""
    hi = (a * b) >> bits
    hi &= (1 << bits) - 1
    return hi - (1 << bits) if signed and hi >> (bits - 1) else hi


@pytest.mark.parametrize("ty,signed", [("i64", True), ("ui64", False)])
def test_chlo_mulhi_64_bit(ty, signed):
    src = f"""
    func.func @main(%a: tensor<5x{ty}>, %b: tensor<5x{ty}>) -> tensor<5x{ty}> {{
      %0 = chlo.mulhi %a, %b : tensor<5x{ty}>, tensor<5x{ty}> -> tensor<5x{ty}>
      return %0 : tensor<5x{ty}>
    }}"""
    m = hlo.from_stablehlo(src)
    assert "multiply" in opcodes(m) and "shift-right-logical" in opcodes(m)
    if signed:
        a = [-1, 2**62 + 12345, -(2**63), 7, 2**63 - 1]
        b = [-1, -(2**61) - 3, -(2**63), -9, 2**63 - 1]
        dtype = np.int64
    else:
        a = [2**64 - 1, 2**63 + 12345, 2**32, 7, 0xDEADBEEFCAFEBABE]
        b = [2**64 - 1, 2**62 + 3, 2**32, 9, 0x123456789ABCDEF0]
        dtype = np.uint64
    got = hlo.evaluate(m, [np.array(a, dtype), np.array(b, dtype)])
    want = [_mulhi_ref(x, y, signed=signed) for x, y in zip(a, b)]
    assert [int(v) for v in got] == want


def test_chlo_scan_is_a_while_loop():
    src = """
    func.func @main(%x: tensor<2x3xi32>, %init: tensor<2xi32>) -> (tensor<2x3xi32>, tensor<2xi32>) {
      %0:2 = chlo.scan(%x) inits(%init) dimension=1 attributes {is_reverse = true} {
      ^bb0(%e: tensor<2xi32>, %c: tensor<2xi32>):
        %1 = stablehlo.add %e, %c : tensor<2xi32>
        stablehlo.return %1, %1 : tensor<2xi32>, tensor<2xi32>
      } : (tensor<2x3xi32>, tensor<2xi32>) -> (tensor<2x3xi32>, tensor<2xi32>)
      return %0#0, %0#1 : tensor<2x3xi32>, tensor<2xi32>
    }"""
    m = hlo.from_stablehlo(src)
    assert "while" in opcodes(m) and "dynamic-update-slice" in opcodes(m)
    outs, carry = hlo.evaluate(m, [np.array([[1, 2, 3], [4, 5, 6]], np.int32),
                                   np.array([10, 0], np.int32)])
    # Suffix sums along dim 1, starting from the init carry.
    np.testing.assert_array_equal(outs, [[16, 15, 13], [15, 11, 6]])
    np.testing.assert_array_equal(carry, [16, 15])


def test_dynamic_ops_with_constant_shape_operands_become_static():
    src = """
    func.func @main(%x: tensor<2x3xi32>, %v: tensor<i32>) -> (tensor<4x5xi32>, tensor<2x2xi32>) {
      %lo = stablehlo.constant dense<[1, 0]> : tensor<2xi64>
      %hi = stablehlo.constant dense<[1, 0]> : tensor<2xi64>
      %in = stablehlo.constant dense<[0, 1]> : tensor<2xi64>
      %p = stablehlo.dynamic_pad %x, %v, %lo, %hi, %in
        : (tensor<2x3xi32>, tensor<i32>, tensor<2xi64>, tensor<2xi64>, tensor<2xi64>) -> tensor<4x5xi32>
      %idx = stablehlo.constant dense<[[0], [1]]> : tensor<2x1xi64>
      %sizes = stablehlo.constant dense<[1, 2]> : tensor<2xi64>
      %g = "stablehlo.dynamic_gather"(%x, %idx, %sizes) {
        dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0],
                                              start_index_map = [0], index_vector_dim = 1>
      } : (tensor<2x3xi32>, tensor<2x1xi64>, tensor<2xi64>) -> tensor<2x2xi32>
      return %p, %g : tensor<4x5xi32>, tensor<2x2xi32>
    }"""
    m = hlo.from_stablehlo(src)
    pad = find(m, "pad")
    assert [(d.low, d.high, d.interior) for d in pad.attrs["padding"].dims] == \
        [(1, 1, 0), (0, 0, 1)]
    assert find(m, "gather").attrs["slice_sizes"] == (1, 2)
    p, g = hlo.evaluate(m, [np.array([[1, 2, 3], [4, 5, 6]], np.int32), np.int32(-1)])
    np.testing.assert_array_equal(p, [[-1] * 5, [1, -1, 2, -1, 3], [4, -1, 5, -1, 6], [-1] * 5])
    np.testing.assert_array_equal(g, [[1, 2], [4, 5]])
    dynamic = """
    func.func @main(%x: tensor<2xi32>, %v: tensor<i32>, %lo: tensor<1xi64>) -> tensor<4xi32> {
      %p = stablehlo.dynamic_pad %x, %v, %lo, %lo, %lo
        : (tensor<2xi32>, tensor<i32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<4xi32>
      return %p : tensor<4xi32>
    }"""
    with pytest.raises(hlo.ImportError, match="edge_padding_low must be a constant"):
        hlo.from_stablehlo(dynamic)


def test_all_to_all_split_and_concat_dims_differ():
    from hlo.evaluator.collectives import simulate
    src = """
    module @m attributes {mhlo.num_replicas = 2 : i32} {
    func.func @main(%x: tensor<2x4xi64>) -> tensor<4x2xi64> {
      %0 = "stablehlo.all_to_all"(%x) {split_dimension = 1 : i64, concat_dimension = 0 : i64,
          split_count = 2 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>
      } : (tensor<2x4xi64>) -> tensor<4x2xi64>
      return %0 : tensor<4x2xi64>
    }}"""
    m = hlo.from_stablehlo(src)
    a2a = find(m, "all-to-all")
    assert a2a.attrs["dimensions"] == (0,) and a2a.shape.dims == (2, 2, 2)
    x0 = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int64)
    x1 = x0 + 8
    r0, r1 = simulate(m, [[x0], [x1]], num_replicas=2)
    # Replica r gets column block r of every replica, stacked along dim 0.
    np.testing.assert_array_equal(r0, [[1, 2], [5, 6], [9, 10], [13, 14]])
    np.testing.assert_array_equal(r1, [[3, 4], [7, 8], [11, 12], [15, 16]])


def test_send_recv_and_entry_option():
    from hlo.evaluator.collectives import simulate_programs
    src = """
    func.func @send(%x: tensor<2xi32>, %t: !stablehlo.token) -> !stablehlo.token {
      %0 = "stablehlo.send"(%x, %t) {channel_handle = #stablehlo.channel_handle<handle = 5, type = 2>,
                                     is_host_transfer = true} : (tensor<2xi32>, !stablehlo.token) -> !stablehlo.token
      return %0 : !stablehlo.token
    }
    func.func @recv(%t: !stablehlo.token) -> (tensor<2xi32>, !stablehlo.token) {
      %0:2 = "stablehlo.recv"(%t) {channel_handle = #stablehlo.channel_handle<handle = 5, type = 3>,
                                   is_host_transfer = true} : (!stablehlo.token) -> (tensor<2xi32>, !stablehlo.token)
      return %0#0, %0#1 : tensor<2xi32>, !stablehlo.token
    }"""
    ms = hlo.from_stablehlo(src, entry="send")
    mr = hlo.from_stablehlo(src, entry="recv")
    send = find(ms, "send")
    assert send.attrs["channel_id"] == 5 and send.attrs["is_host_transfer"] is True
    assert send.shape.to_text().startswith("(s32[2]") and "send-done" in opcodes(ms)
    assert {"recv", "recv-done"} <= opcodes(mr)
    from hlo.evaluator import TOKEN
    results, outfeed = simulate_programs([ms, mr], [[np.array([7, 8]), TOKEN], [TOKEN]], 2)
    np.testing.assert_array_equal(results[1][0], [7, 8])
    assert outfeed == []
    with pytest.raises(hlo.ImportError, match="@nope"):
        hlo.from_stablehlo(src, entry="nope")


def test_custom_call_keeps_called_computations():
    src = """
    func.func private @double(%x: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.add %x, %x : tensor<2xf32>
      return %0 : tensor<2xf32>
    }
    func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.custom_call @apply(%x) {called_computations = [@double]}
        : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    }"""
    m = hlo.from_stablehlo(src)
    cc = find(m, "custom-call")
    (callee,) = cc.attrs["called_computations"]
    assert callee in m.computations and callee.root.opcode == "add"
    assert "called_computations={%" in m.to_text()
    got = hlo.evaluate(m, [np.array([1.5, -2], np.float32)], custom_calls={
        "apply": lambda inst, ops, ctx: ctx.call(inst.attrs["called_computations"][0], ops)})
    np.testing.assert_array_equal(got, [3.0, -4.0])


def test_chlo_and_shardy_rules_load_on_the_first_such_op():
    """A program without chlo or sdy ops imports neither module (issue 13: their import is
    part of a process's first lower); the first chlo op loads chlo's rules (a new process,
    so that no other test has loaded them)."""
    import subprocess
    import sys
    code = (
        "import sys, numpy as np, jax, jax.numpy as jnp, hlo\n"
        "from hlo.stablehlo.importer import _late_rule\n"
        "x = np.linspace(-2, 2, 8).astype(np.float32)\n"
        "m = hlo.from_jax(lambda v: jnp.sqrt(v * v + 1.0), x)\n"
        "late = ('hlo.stablehlo.chlo', 'hlo.stablehlo.shardy')\n"
        "print(sorted(k for k in late if k in sys.modules))\n"
        "assert _late_rule('nope.op') is None\n"
        "m = hlo.from_stablehlo('func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {\\n'\n"
        "    '  %0 = chlo.sinh %a : tensor<8xf32> -> tensor<8xf32>\\n'\n"
        "    '  return %0 : tensor<8xf32>\\n}\\n')\n"
        "print(np.allclose(hlo.evaluate(m, [x]), np.sinh(x), rtol=1e-5))\n"
        "print('hlo.stablehlo.chlo' in sys.modules, callable(_late_rule('sdy.reshard')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["[]", "True", "True True"], out.stdout
