"""Resource limits: absurd shapes stop with a ResourceLimitError before memory is touched,
naming the instruction and how to raise the limit; the limits can be raised."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hlo  # noqa: E402
import runtime  # noqa: E402
from hlo.limits import ResourceLimitError, current, resource_limits  # noqa: E402

HUGE = 100_000_000_000     # f32[1e11] = 400 GB


def _huge_iota(x):
    return x + jnp.arange(HUGE, dtype=jnp.float32).sum()


def _huge_broadcast(x):
    return x + jnp.zeros((HUGE,), jnp.float32).sum()


@pytest.mark.parametrize("fn", [_huge_iota, _huge_broadcast])
@pytest.mark.parametrize("backend,pipeline", [("interpreter", "none"), ("cpu", "none"),
                                              ("cpu", "default")])
def test_huge_shape_is_refused_before_allocating(fn, backend, pipeline):
    with pytest.raises(ResourceLimitError) as e:
        runtime.jit(fn, backend=backend, pipeline=pipeline)(np.float32(1))
    msg = str(e.value)
    assert "f32[100000000000]" in msg and "instruction %" in msg
    assert "HLOTK_MAX_ELEMENTS" in msg and "hlo.resource_limits" in msg


def test_hlo_text_broadcast_and_mlir_splat():
    m = hlo.parse_hlo("HloModule m\nENTRY e {\n  c = f32[] constant(1)\n"
                      "  ROOT b = f32[100000000000] broadcast(c), dimensions={}\n}\n")
    with pytest.raises(ResourceLimitError, match="instruction %b in %e"):
        hlo.evaluate(m, [])
    mlir = ("func.func @main() -> tensor<100000000000xf32> {\n"
            "  %0 = stablehlo.constant dense<1.0> : tensor<100000000000xf32>\n"
            "  return %0 : tensor<100000000000xf32>\n}\n")
    with pytest.raises(hlo.HloImportError, match=r"2:\d+: .*dense splat.*HLOTK_MAX_ELEMENTS"):
        hlo.from_stablehlo(mlir)


def test_limits_can_be_lowered_and_raised(monkeypatch):
    x = np.arange(1000, dtype=np.float32)
    f = runtime.jit(lambda v: v * 2.0)
    np.testing.assert_array_equal(f(x), x * 2.0)
    with resource_limits(max_elements=100):
        with pytest.raises(ResourceLimitError, match="1000 elements, over the limit of 100"):
            runtime.jit(lambda v: v * 3.0)(x)
    with resource_limits(max_bytes=1000):   # 4000 bytes per array
        with pytest.raises(ResourceLimitError, match="over the limit of 1000 B"):
            runtime.jit(lambda v: v * 4.0, backend="interpreter")(x)
    monkeypatch.setenv("HLOTK_MAX_ELEMENTS", "10")
    assert current().max_elements == 10
    with pytest.raises(ResourceLimitError, match="HLOTK_MAX_ELEMENTS"):
        runtime.jit(lambda v: v * 5.0)(x)
    with resource_limits(max_elements=0):   # 0: no limit, over the environment's
        np.testing.assert_array_equal(runtime.jit(lambda v: v * 6.0)(x), x * 6.0)
    monkeypatch.setenv("HLOTK_MAX_ELEMENTS", "lots")
    with pytest.raises(ResourceLimitError, match="not a number"):
        current()


def test_cpu_arena_larger_than_the_host_is_refused(monkeypatch):
    # Under the element and byte limits but over the host's memory: np.empty would succeed
    # lazily and the process would be killed on first touch, so the arena check stops it.
    import runtime.executable as executable
    monkeypatch.setattr(executable, "host_memory_bytes", lambda: 1 << 20)
    f = lambda x: jnp.tanh(x) * 2 + 1  # noqa: E731
    x = np.ones((1 << 19,), np.float32)   # 2 MiB in, 2 MiB out
    with pytest.raises(ResourceLimitError, match=r"more than this host's 1\.0 MiB of memory"):
        runtime.jit(f, backend="cpu")(x)
    with resource_limits(max_bytes=0):    # limits off: the host check is off too
        np.testing.assert_allclose(runtime.jit(f, backend="cpu")(x), np.tanh(x) * 2 + 1,
                                   rtol=1e-6)


def test_check_module_refuses_what_check_shape_refuses():
    """check_module's quick test (issue 13) passes exactly the shapes check_shape passes:
    a tuple whose leaves are each within max_bytes but not together is still refused,
    naming the instruction; a shape shared by many instructions is looked at once."""
    from hlo.limits import check_module, check_shape
    text = ("HloModule m\nENTRY e {\n  a = f32[100] parameter(0)\n  b = f32[100] negate(a)\n"
            "  ROOT t = (f32[100], f32[100]) tuple(a, b)\n}\n")
    m = hlo.parse_hlo(text)
    with resource_limits(max_bytes=500):            # 400 bytes each, 800 together
        with pytest.raises(ResourceLimitError, match="instruction %t in %e"):
            check_module(m)
        check_shape("leaf", m.entry.root.operands[0].shape)
    with resource_limits(max_bytes=800):
        check_module(m)
    with resource_limits(max_elements=99):
        with pytest.raises(ResourceLimitError, match="instruction %a in %e.*100 elements"):
            check_module(m)
    pred = hlo.parse_hlo(text.replace("f32", "s4"))  # sub-byte: one byte per element
    with resource_limits(max_bytes=150):
        with pytest.raises(ResourceLimitError, match="instruction %t"):
            check_module(pred)
