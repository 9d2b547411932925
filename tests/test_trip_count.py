"""hlo/trip_count.py: the loops lax.scan and lax.fori_loop with static bounds lower to are
counted (before and after the pipeline's copy insertion); anything else is not."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import hlo  # noqa: E402
import runtime  # noqa: E402
from hlo.trip_count import known_trip_count  # noqa: E402
from passes.pipelines import PIPELINES  # noqa: E402

X = np.ones((5, 3), np.float32)


def _trips(f, *args, optimized: bool = False) -> list:
    m = runtime.jit(f, target="h200", pipeline=PIPELINES["default"]["cuda"]) \
        .lower(*args).compile().module if optimized else hlo.from_jax(f, *args)
    return [known_trip_count(i) for c in m.computations for i in c.instructions
            if i.opcode == "while"]


@pytest.mark.parametrize("optimized", [False, True])
def test_scans_and_static_fori_loops_are_counted(optimized):
    scan = lambda x: jax.lax.scan(lambda c, r: (c + r, c * 2), jnp.zeros(3), x)  # noqa: E731
    back = lambda x: jax.lax.scan(lambda c, r: (c * r, c), jnp.ones(3), x,  # noqa: E731
                                  reverse=True)
    fori = lambda x: jax.lax.fori_loop(2, 9, lambda i, c: c + i, x[0])  # noqa: E731
    assert _trips(scan, X, optimized=optimized) == [5]
    assert _trips(back, X, optimized=optimized) == [5]
    assert _trips(fori, X, optimized=optimized) == [7]


def test_loops_without_a_static_count_are_not():
    dyn = lambda x, n: jax.lax.fori_loop(0, n, lambda i, c: c + i, x[0])  # noqa: E731
    cond = lambda x: jax.lax.while_loop(  # noqa: E731
        lambda c: c[0] < 10.0, lambda c: (c[0] + c[1][0], c[1]), (0.0, x[0]))
    assert _trips(dyn, X, np.int32(4)) == [None]
    assert _trips(cond, X) == [None]


def _loop(cond_root: str, init: int, step: str = "add(i, one)") -> hlo.Module:
    return hlo.parse_hlo(f"""HloModule m
cond {{
  p = (s32[], f32[]) parameter(0)
  k = s32[] get-tuple-element(p), index=0
  n = s32[] constant(10)
  ROOT c = pred[] {cond_root}
}}
body {{
  q = (s32[], f32[]) parameter(0)
  i = s32[] get-tuple-element(q), index=0
  x = f32[] get-tuple-element(q), index=1
  one = s32[] constant(3)
  j = s32[] {step}
  y = f32[] add(x, x)
  ROOT t = (s32[], f32[]) tuple(j, y)
}}
ENTRY e {{
  a = f32[] parameter(0)
  i0 = s32[] constant({init})
  s = (s32[], f32[]) tuple(i0, a)
  ROOT w = (s32[], f32[]) while(s), condition=cond, body=body
}}""")


@pytest.mark.parametrize("cond_root,init,step,want", [
    ("compare(k, n), direction=LT", 0, "add(i, one)", 4),      # 0 3 6 9
    ("compare(k, n), direction=LE", 1, "add(one, i)", 4),      # 1 4 7 10
    ("compare(n, k), direction=GT", 4, "add(i, one)", 2),      # 4 7
    ("compare(k, n), direction=NE", 1, "add(i, one)", 3),      # 1 4 7
    ("compare(k, n), direction=LT", 12, "add(i, one)", 0),     # never enters
    ("compare(k, n), direction=NE", 0, "add(i, one)", None),   # 0 3 6 9 12 ...: never 10
    ("compare(k, n), direction=GT", 0, "add(i, one)", None),   # counts up past n forever
    ("compare(k, n), direction=LT", 0, "subtract(i, one)", None),
    ("compare(k, n), direction=LT", 0, "multiply(i, one)", None),
])
def test_the_count_each_compare_gives_agrees_with_the_interpreter(cond_root, init, step, want):
    m = _loop(cond_root, init, step)
    assert known_trip_count(m.entry.root) == want
    if want is not None:      # the interpreter runs the loop: y doubles once per trip
        out = hlo.evaluate(m, [np.float32(1.0)])
        assert float(out[1]) == 2.0 ** want
