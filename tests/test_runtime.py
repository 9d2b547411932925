"""The PJRT-shaped runtime (client, devices, buffers, executables) and ``runtime.jit``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hlo
import runtime

MATMUL_ADD = """\
HloModule matmul_add

ENTRY main {
  x = f32[4,8] parameter(0)
  w = f32[8,3] parameter(1)
  b = f32[3] parameter(2)
  d = f32[4,3] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[4,3] broadcast(b), dimensions={1}
  ROOT a = f32[4,3] add(d, bb)
}
"""

TUPLE_OUT = """\
HloModule tuple_out

ENTRY main {
  x = f32[2,3] parameter(0)
  one = f32[] constant(1)
  ones = f32[2,3] broadcast(one), dimensions={}
  y = f32[2,3] add(x, ones)
  n = s32[] constant(7)
  inner = (s32[], f32[2,3]) tuple(n, x)
  ROOT t = (f32[2,3], (s32[], f32[2,3])) tuple(y, inner)
}
"""


def _arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((4, 8)).astype(np.float32),
            rng.standard_normal((8, 3)).astype(np.float32),
            rng.standard_normal(3).astype(np.float32))


# --- client, devices, buffers --------------------------------------------------------------
def test_client_devices():
    c = runtime.client("cpu", num_devices=2)
    assert c.platform == "cpu"
    devs = c.devices()
    assert [d.id for d in devs] == [0, 1]
    assert all(d.platform == "cpu" and "cpu" in d.device_kind for d in devs)


def test_buffer_roundtrip_and_delete():
    c = runtime.client("cpu")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = c.buffer_from_pyval(x)
    assert buf.shape == (2, 3) and buf.dtype == np.float32
    assert buf.device is c.devices()[0]
    np.testing.assert_array_equal(np.asarray(buf), x)
    x[0, 0] = 100.0  # the buffer holds its own copy
    assert buf.to_numpy()[0, 0] == 0.0
    buf.delete()
    assert buf.is_deleted()
    with pytest.raises(hlo.HlotkError, match="deleted"):
        buf.to_numpy()


def test_bf16_buffer():
    c = runtime.client("cpu")
    buf = c.buffer_from_pyval(np.array([1.5, 2.0], dtype=ml_dtypes.bfloat16))
    assert buf.dtype == ml_dtypes.bfloat16
    assert str(buf.hlo_shape) == "bf16[2]"


def test_execute_matmul_add():
    c = runtime.client("cpu")
    exe = c.compile(hlo.parse_hlo(MATMUL_ADD))
    x, w, b = _arrays()
    (out,) = exe.execute([c.buffer_from_pyval(v) for v in (x, w, b)])
    assert out.shape == (4, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out.to_numpy(), x @ w + b, rtol=1e-5, atol=1e-5)
    assert exe.hlo_modules()[0].name == "matmul_add"
    assert "dot(" in exe.as_text()


def test_execute_flattens_nested_tuples():
    c = runtime.client("cpu")
    exe = c.compile(hlo.parse_hlo(TUPLE_OUT))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = exe.execute([c.buffer_from_pyval(x)])
    assert len(outs) == 3
    np.testing.assert_array_equal(outs[0].to_numpy(), x + 1)
    assert outs[1].to_numpy() == 7 and outs[1].dtype == np.int32
    np.testing.assert_array_equal(outs[2].to_numpy(), x)


def test_execute_argument_errors():
    c = runtime.client("cpu")
    exe = c.compile(hlo.parse_hlo(MATMUL_ADD))
    x, w, b = (c.buffer_from_pyval(v) for v in _arrays())
    with pytest.raises(hlo.InvalidArgumentError, match=r"takes 3 arguments .* got 2"):
        exe.execute([x, w])
    bad = c.buffer_from_pyval(np.zeros((8, 4), np.float32))
    with pytest.raises(hlo.InvalidArgumentError,
                       match=r"argument 1: expected f32\[8,3\], got f32\[8,4\]"):
        exe.execute([x, bad, b])
    bad = c.buffer_from_pyval(np.zeros(3, np.int32))
    with pytest.raises(hlo.InvalidArgumentError,
                       match=r"argument 2: expected f32\[3\], got s32\[3\]"):
        exe.execute([x, w, bad])
    b.delete()
    with pytest.raises(hlo.InvalidArgumentError, match="argument 2: the buffer was deleted"):
        exe.execute([x, w, b])
    with pytest.raises(hlo.InvalidArgumentError, match="argument 0: expected a Buffer"):
        exe.execute([np.zeros((4, 8), np.float32), w, w])


def test_backend_and_pipeline_errors():
    with pytest.raises(hlo.HlotkError, match=r"unknown backend 'tpu'; known backends: cpu, cuda"):
        runtime.client("tpu")
    import os
    from runtime.cuda.errors import NoCudaDeviceError
    cuda_usable = False
    try:
        import torch
        cuda_usable = torch.cuda.is_available() or bool(os.environ.get("TRITON_INTERPRET"))
    except ImportError:
        pass
    if not cuda_usable:   # CI: no torch, or no GPU and no Triton interpreter
        with pytest.raises(NoCudaDeviceError, match="backend 'cuda'"):
            runtime.client("cuda")
    c = runtime.client("cpu")
    from passes import PassError
    with pytest.raises(PassError, match=r"unknown pass 'fast'; known passes: .*cse.*dce"):
        c.compile(hlo.parse_hlo(MATMUL_ADD), pipeline="fast")
    with pytest.raises(PassError, match="unknown pass 'O3'"):
        runtime.jit(lambda x: x, pipeline="O3")
    with pytest.raises(PassError, match="no option 'bogus'"):
        runtime.jit(lambda x: x, pipeline="simplify{bogus=1}")


def test_pipelines_run_and_leave_the_callers_module_alone():
    c = runtime.client("cpu")
    m = hlo.parse_hlo(MATMUL_ADD)
    before = m.to_text()
    exe = c.compile(m, pipeline="default")
    assert m.to_text() == before
    assert exe.pass_records and exe.pass_records[0].name == "inline"
    exe2 = c.compile(m, pipeline="cse,dce")
    # The arena executor's mandatory lowering (schedule) runs after any spec, recorded so.
    assert [(r.name, r.mandatory) for r in exe2.pass_records] == [
        ("cse", False), ("dce", False), ("schedule", True)]

    def f(x, y):
        z = jnp.transpose(jnp.transpose(x)) * 1.0 + 0.0
        return jnp.tanh(z @ y) - jnp.tanh(z @ y) * 0.5
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    y = np.ones((4, 2), np.float32)
    want = np.asarray(jax.jit(f)(x, y))
    got = runtime.jit(f, pipeline="default")(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    lowered = runtime.jit(f, pipeline="default").lower(x, y).compile().as_text()
    assert "transpose" not in lowered and lowered.count("tanh(") == 1


def test_foreign_device_rejected():
    a, b = runtime.client("cpu"), runtime.client("cpu")
    with pytest.raises(hlo.HlotkError, match="not a device of this cpu client"):
        a.buffer_from_pyval(np.zeros(2), device=b.devices()[0])


# --- analyses on a hand-written module -------------------------------------------------------
def test_memory_and_cost_analysis_by_hand():
    from runtime import analysis
    m = hlo.parse_hlo(MATMUL_ADD)
    mem = analysis.memory_analysis(m)
    assert mem.argument_size_in_bytes == (4 * 8 + 8 * 3 + 3) * 4    # 236
    assert mem.output_size_in_bytes == 4 * 3 * 4                    # 48
    # Buffer assignment: the add writes its result over the dot's buffer (it dies there),
    # so the dot lives in the output allocation; only the broadcast (48 B, aligned to 64)
    # is a temporary.
    assert mem.temp_size_in_bytes == 64
    assert mem.alias_size_in_bytes == 0
    assert mem.generated_code_size_in_bytes == 0 and mem.host_temp_size_in_bytes == 0
    cost = analysis.cost_analysis(m)
    assert cost["flops"] == 2 * 4 * 8 * 3 + 4 * 3                   # dot MACs x2 + add
    assert cost["transcendentals"] == 0
    # dot reads x, w and writes d; broadcast reads b, writes bb; add reads d, bb, writes a.
    assert cost["bytes accessed"] == (32 + 24 + 12) * 4 + (3 + 12) * 4 + 3 * 12 * 4


def test_cost_transcendentals_and_reduce():
    from runtime import analysis
    m = hlo.parse_hlo("""\
HloModule r

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[5,6] parameter(0)
  t = f32[5,6] tanh(x)
  z = f32[] constant(0)
  ROOT r = f32[5] reduce(t, z), dimensions={1}, to_apply=add_f32
}
""")
    cost = analysis.cost_analysis(m)
    assert cost["transcendentals"] == 30
    assert cost["flops"] == 30 - 5   # one add per element folded into another
    mem = analysis.memory_analysis(m)
    # t only (120 B, aligned to 128 in the arena); the constant is not a temporary.
    assert mem.temp_size_in_bytes == 128


# --- jit -------------------------------------------------------------------------------------
def test_jit_matches_jax_and_analyses():
    import jax

    def f(x, w, b):
        return x @ w + b
    x, w, b = _arrays()
    jf = runtime.jit(f)
    out = jf(x, w, b)
    assert isinstance(out, np.ndarray) and out.shape == (4, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, np.asarray(jax.jit(f)(x, w, b)), rtol=1e-5, atol=1e-5)

    lowered = jf.lower(x, w, b)
    assert "HloModule" in lowered.as_text() and "dot(" in lowered.as_text()
    compiled = lowered.compile()
    assert "dot(" in compiled.as_text()
    cost = compiled.cost_analysis()
    assert cost["flops"] == 2 * 4 * 8 * 3 + 4 * 3
    mem = compiled.memory_analysis()
    assert mem.argument_size_in_bytes == 236 and mem.output_size_in_bytes == 48
    np.testing.assert_allclose(compiled(x, w, b), out)


def test_jit_pytrees_in_and_out():
    import jax.numpy as jnp

    def f(params, xs):
        a, b = xs
        h = jnp.tanh(a @ params["w"])
        return {"h": h, "stats": (h.sum(), b * 2.0)}
    params = {"w": np.ones((3, 2), np.float32)}
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    b = np.float32(1.5) * np.ones(4, np.float32)
    out = runtime.jit(f)(params, (a, b))
    assert set(out) == {"h", "stats"} and isinstance(out["stats"], tuple)
    expect_h = np.tanh(a @ params["w"])
    np.testing.assert_allclose(out["h"], expect_h, rtol=1e-6)
    np.testing.assert_allclose(out["stats"][0], expect_h.sum(), rtol=1e-6)
    np.testing.assert_array_equal(out["stats"][1], np.full(4, 3.0, np.float32))


def test_jit_static_argnums_and_cache():
    def f(x, n):
        return x * n
    jf = runtime.jit(f, static_argnums=1)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(jf(x, 2), x * 2)
    np.testing.assert_array_equal(jf(x + 1, 2), (x + 1) * 2)
    assert jf.cache_info() == (1, 1, 1)          # same shapes and static value: a hit
    np.testing.assert_array_equal(jf(x, 5), x * 5)
    assert jf.cache_info().misses == 2           # a new static value compiles again
    jf(np.zeros(4, np.float32), 5)
    assert jf.cache_info().misses == 3           # a new shape compiles again
    jf(np.zeros(4, np.int32), 5)
    assert jf.cache_info() == (1, 4, 4)          # a new dtype too
    # Compiled takes the dynamic arguments only; the static one was fixed by lower().
    compiled = jf.lower(x, 3).compile()
    np.testing.assert_array_equal(compiled(x), x * 3)


def test_jit_python_scalars_and_unused_args():
    def f(x, s, unused):
        return x + s
    out = runtime.jit(f)(np.ones(2, np.float32), 2.5, np.zeros(7, np.int32))
    assert out.dtype == np.float32                # the weak Python float adapts to f32
    np.testing.assert_array_equal(out, [3.5, 3.5])


def test_jit_bf16_result():
    import jax.numpy as jnp
    out = runtime.jit(lambda x: (x * 2).astype(jnp.bfloat16))(np.array([1.5, 3.0], np.float32))
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), [3.0, 6.0])


def test_compiled_argument_errors_name_the_argument():
    def f(x, params):
        return x @ params["w"]
    x = np.ones((2, 3), np.float32)
    compiled = runtime.jit(f).lower(x, {"w": np.ones((3, 4), np.float32)}).compile()
    with pytest.raises(hlo.InvalidArgumentError,
                       match=r"argument 1 \(params\['w'\]\): expected f32\[3,4\], got f32\[3,5\]"):
        compiled(x, {"w": np.ones((3, 5), np.float32)})
    with pytest.raises(hlo.InvalidArgumentError,
                       match=r"argument 0 \(x\): expected f32\[2,3\], got s32\[2,3\]"):
        compiled(np.ones((2, 3), np.int32), {"w": np.ones((3, 4), np.float32)})
    with pytest.raises(hlo.InvalidArgumentError, match=r"compiled for 2 \(non-static\) arguments, got 1"):
        compiled(x)
    with pytest.raises(hlo.InvalidArgumentError, match="pytree structure"):
        compiled(x, {"v": np.ones((3, 4), np.float32)})


def test_jit_rejects_unhashable_static_arg():
    jf = runtime.jit(lambda x, cfg: x, static_argnums=1)
    with pytest.raises(hlo.InvalidArgumentError, match="argument 1 is static .* hashable"):
        jf(np.ones(2, np.float32), [1, 2])


def test_jit_x64(enable_x64):
    out = runtime.jit(lambda x: x * 2)(np.arange(3, dtype=np.float64))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])


def test_alias_size_from_input_output_alias():
    from runtime import analysis
    m = hlo.parse_hlo("""\
HloModule donated, input_output_alias={ {0}: (1, {}, may-alias) }

ENTRY main {
  x = f32[16] parameter(0)
  acc = f32[16] parameter(1)
  s = f32[16] add(x, acc)
  ROOT t = (f32[16], f32[16]) tuple(s, x)
}
""")
    mem = analysis.memory_analysis(m)
    assert mem.alias_size_in_bytes == 16 * 4          # output {0} reuses parameter 1
    assert mem.output_size_in_bytes == 2 * 16 * 4 and mem.temp_size_in_bytes == 0


def test_jit_jax_array_and_keyword_arguments():
    import jax.numpy as jnp

    def f(x, *, scale):
        return x * scale["s"]
    jf = runtime.jit(f)
    out = jf(jnp.arange(3, dtype=jnp.float32), scale={"s": np.float32(4.0)})
    np.testing.assert_array_equal(out, [0.0, 4.0, 8.0])
    compiled = jf.lower(np.zeros(3, np.float32), scale={"s": np.float32(1.0)}).compile()
    with pytest.raises(hlo.InvalidArgumentError,
                       match=r"keyword argument 'scale' \(scale\['s'\]\): expected f32\[\], got s32\[\]"):
        compiled(np.zeros(3, np.float32), scale={"s": np.int32(1)})


def test_a_backend_that_names_its_gpu_gets_fusion_decided_for_it(monkeypatch):
    """A backend on a GPU (the CUDA one: ``fusion_target`` from the device's name) has the
    pipeline's fusion and layout passes decide for that GPU when the caller names no
    target; a target the caller names wins. Stood in for here by the CPU thunk backend."""
    c = runtime.client("cpu")
    monkeypatch.setattr(c._backend, "fusion_target", "a100", raising=False)
    module = hlo.parse_hlo(MATMUL_ADD)
    exe = c.compile(module, pipeline="fusion")
    assert [r.name for r in exe.pass_records if r.name.startswith("fusion")] == \
        ["fusion{target=a100}"]
    exe = c.compile(module, pipeline="fusion", target="h200")
    assert [r.name for r in exe.pass_records if r.name.startswith("fusion")] == \
        ["fusion{target=h200}"]
    monkeypatch.setattr(c._backend, "fusion_target", None, raising=False)
    exe = c.compile(module, pipeline="fusion")
    assert [r.name for r in exe.pass_records if r.name.startswith("fusion")] == ["fusion"]
