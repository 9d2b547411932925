"""Every zoo program through ``inline,fixpoint(simplify,cse,dce),fusion``: verified, text
round-tripped, and evaluating to what the unfused module evaluates to (the interpreter runs
a ``fusion`` by calling its fused computation)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import hlo
from passes import run_pipeline
from passes.fusion import report_for
from tests.zoo import ZOO, ZooProgram, flatten_value, x64_scope

SPEC = "inline,fixpoint(simplify,cse,dce),fusion{target=h100}"


def _compare(got, expected, program: ZooProgram) -> None:
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, f"result {k}"
        if e.dtype.kind in "biu?":
            np.testing.assert_array_equal(g, e, err_msg=f"result {k}")
        elif e.dtype.kind == "c":
            np.testing.assert_allclose(g, e, rtol=program.rtol, atol=program.atol)
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=program.rtol, atol=program.atol, err_msg=f"result {k}")


@pytest.mark.parametrize("policy", ["priority", "greedy"])
@pytest.mark.parametrize("program", ZOO, ids=[p.name for p in ZOO])
def test_fusion_preserves_results(program: ZooProgram, policy: str):
    with x64_scope(program):
        args = program.args()
        flat_args = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        module = hlo.from_jax(program.fn, *args)
        expected = flatten_value(hlo.evaluate(module, flat_args))
        fused = module.clone()
        run_pipeline(fused, SPEC.replace("}", f",policy={policy}}}"), verify=True)
        text = fused.to_text()
        assert hlo.parse_hlo(text).to_text() == text, "text round trip after fusion"
        report = report_for(fused)
        assert report is not None and report.kernels_after <= report.kernels_before
        got = flatten_value(hlo.evaluate(fused, flat_args))
    _compare(got, expected, program)
