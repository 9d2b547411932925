"""The conformance runner on StableHLO's interpreter test files (and handmade cases)."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from runtime.conformance import main_check, rewrite_checks, run_check_files, split_cases

CONF = Path("/work/shared/conformance/stablehlo/interpret")
pytestmark = pytest.mark.skipif(not CONF.is_dir(), reason="conformance suite not present")


@pytest.mark.parametrize("name,cases", [("add.mlir", 21), ("compare.mlir", 31),
                                        ("while.mlir", 1), ("check.mlir", 7)])
def test_suite_files_pass(name, cases):
    results, passed, failed = run_check_files([CONF / name])
    reasons = [f"{r.label}: {r.reason}" for r in results if not r.passed]
    assert (passed, failed) == (cases, 0), reasons


def test_multiline_check_rewrite():
    case = ("func.func @t() {\n  %r = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf64>\n"
            "  check.expect_almost_eq_const %r,\n      dense<[1.0,\n 2.0]> : tensor<2xf64>"
            " {tolerance = 0.5 : f64}\n  func.return\n}\n")
    out = rewrite_checks(case)
    assert "check." not in out.replace("@check.", "")
    assert '@check.expect_almost_eq_const(%r, %__check_expected_0)' in out
    assert 'backend_config = "tolerance=0.5"' in out


HANDMADE = """
func.func @good() {
  %0 = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  %1 = stablehlo.add %0, %0 : tensor<2xi32>
  check.expect_eq_const %1, dense<[2, 4]> : tensor<2xi32>
  func.return
}

// -----

func.func @bad() {
  %0 = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
  %1 = stablehlo.multiply %0, %0 : tensor<2xi32>
  check.expect_eq_const %1, dense<[1, 5]> : tensor<2xi32>
  func.return
}

// -----

func.func @nan_is_equal() {
  %0 = stablehlo.constant dense<[0x7FC00000, 1.0]> : tensor<2xf32>
  check.expect_eq_const %0, dense<[0x7FC00000, 1.0]> : tensor<2xf32>
  check.expect_close %0, %0, max_ulp_difference = 0 : tensor<2xf32>, tensor<2xf32>
  func.return
}

// -----

func.func @does_not_import() {
  %0 = stablehlo.constant dense<1.0> : tensor<f32>
  %1 = stablehlo.einsum %0, %0, config = ",->" : (tensor<f32>, tensor<f32>) -> tensor<f32>
  check.expect_eq_const %1, dense<1.0> : tensor<f32>
  func.return
}

// -----

func.func @parallel() {
  %results:2 = "interpreter.run_parallel"() {programs = [[@p], [@p]]} : () -> (tensor<i32>, tensor<i32>)
  func.return
}
"""


def test_handmade_failures_are_reported(tmp_path):
    f = tmp_path / "hand.mlir"
    f.write_text(HANDMADE)
    assert len(split_cases(HANDMADE)) == 5
    out = io.StringIO()
    code = main_check([f], out=out)
    lines = out.getvalue().strip().splitlines()
    assert code == 1
    assert lines[-1] == "2 passed, 3 failed"
    assert lines[0] == ("FAIL hand.mlir:bad: wrong value: check.expect_eq_const "
                        "(%custom-call.6): got [1 4], expected [1 5]") or \
        lines[0].startswith("FAIL hand.mlir:bad: wrong value: check.expect_eq_const")
    assert "got [1 4], expected [1 5]" in lines[0]
    assert lines[1].startswith("FAIL hand.mlir:does_not_import: import:")
    assert "stablehlo.einsum" in lines[1]
    assert lines[2] == "FAIL hand.mlir:parallel: needs interpreter.run_parallel"


def test_all_passing_exit_code_zero():
    out = io.StringIO()
    assert main_check([CONF / "and.mlir"], out=out) == 0
    assert out.getvalue().strip().splitlines()[-1].endswith("passed, 0 failed")
