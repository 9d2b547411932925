"""Every zoo program through the default pipeline: verified and round-tripped after every
pass, and evaluating to what the unoptimized module evaluates to."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import hlo
from passes import run_pipeline
from passes.pipelines import pipeline_spec
from tests.zoo import ZOO, ZooProgram, flatten_value, x64_scope


def _round_trip_hook(event, p, module, record):
    if event != "after":
        return
    text = module.to_text()
    again = hlo.parse_hlo(text).to_text()
    assert again == text, f"text round trip breaks after pass {record.name}"


@pytest.mark.parametrize("program", ZOO, ids=[p.name for p in ZOO])
def test_default_pipeline_preserves_results(program: ZooProgram):
    with x64_scope(program):
        args = program.args()
        flat_args = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        module = hlo.from_jax(program.fn, *args)
        expected = flatten_value(hlo.evaluate(module, flat_args))
        optimized = module.clone()
        records = run_pipeline(optimized, pipeline_spec("default", "cpu"), verify=True,
                               hooks=[_round_trip_hook])
        assert records, "the default pipeline ran no pass"
        got = flatten_value(hlo.evaluate(optimized, flat_args))
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, f"result {k}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e, err_msg=f"result {k}")
        else:
            # The passes only remove work or reassociate nothing, so results agree closely.
            np.testing.assert_allclose(g.astype(np.float64) if e.dtype.kind != "c" else g,
                                       e.astype(np.float64) if e.dtype.kind != "c" else e,
                                       rtol=program.rtol, atol=program.atol, err_msg=f"result {k}")


from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.test_random_graphs import Program, programs  # noqa: E402


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_default_pipeline_on_random_graphs(prog: Program) -> None:
    """Random elementwise/broadcast/reduce/reshape/... graphs: the optimized module gives
    what the imported one gives (the passes are exact rewrites; x + 0 -> x may turn a -0
    result into -0 where XLA's add gives +0, which equality treats as equal)."""
    args = [np.asarray(d) for d in prog.input_data]
    module = hlo.from_jax(jax.jit(prog.build(), keep_unused=True), *args)
    expected = flatten_value(hlo.evaluate(module, args))
    optimized = module.clone()
    run_pipeline(optimized, pipeline_spec("default", "cpu"), verify=True, hooks=[_round_trip_hook])
    got = flatten_value(hlo.evaluate(optimized, args))
    for k, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e),
                                      err_msg=f"output {k}\n{prog.listing()}\n{optimized.to_text()}")
