"""The conformance runner on StableHLO's interpreter test files (and handmade cases)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from runtime.conformance import main_check, rewrite_checks, run_check_files, split_cases

from tests.paths import CONFORMANCE as CONF
needs_suite = pytest.mark.skipif(not CONF.is_dir(), reason="conformance suite not present")


@needs_suite
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

func.func @nan_is_close() {
  %0 = stablehlo.constant dense<[0x7FC00000, 1.0]> : tensor<2xf32>
  check.expect_almost_eq_const %0, dense<[0x7FC00000, 1.0]> : tensor<2xf32>
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

module @parallel {
  func.func @p() -> tensor<ui32> {
    %0 = stablehlo.replica_id : tensor<ui32>
    return %0 : tensor<ui32>
  }
  func.func @main() {
    %results:2 = "interpreter.run_parallel"() {programs = [[@p], [@p]]} : () -> (tensor<ui32>, tensor<ui32>)
    check.expect_eq_const %results#1, dense<1> : tensor<ui32>
    func.return
  }
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
    assert lines[-1] == "3 passed, 2 failed"
    assert lines[0] == ("FAIL hand.mlir:bad: wrong value: check.expect_eq_const "
                        "(%custom-call.6): got [1 4], expected [1 5]") or \
        lines[0].startswith("FAIL hand.mlir:bad: wrong value: check.expect_eq_const")
    assert "got [1 4], expected [1 5]" in lines[0]
    assert lines[1].startswith("FAIL hand.mlir:does_not_import: import:")
    assert "stablehlo.einsum" in lines[1]


@needs_suite
def test_all_passing_exit_code_zero():
    out = io.StringIO()
    assert main_check([CONF / "and.mlir"], out=out) == 0
    assert out.getvalue().strip().splitlines()[-1].endswith("passed, 0 failed")


# --- interpreter.run_parallel, probe ------------------------------------------------------------
@needs_suite
@pytest.mark.parametrize("name,cases", [
    ("all_gather.mlir", 5), ("all_reduce.mlir", 5), ("all_to_all.mlir", 5),
    ("reduce_scatter.mlir", 3), ("collective_permute.mlir", 2), ("send_recv.mlir", 2),
    ("infeed.mlir", 1), ("outfeed.mlir", 1), ("replica_id.mlir", 1), ("partition_id.mlir", 1),
    ("probe.mlir", 8)])
def test_parallel_and_probe_files_pass(name, cases):
    results, passed, failed = run_check_files([CONF / name])
    reasons = [f"{r.label}: {r.reason}" for r in results if not r.passed]
    assert (passed, failed) == (cases, 0), reasons


PARALLEL = """
module @grid {
  func.func @sum(%x: tensor<2xi32>) -> (tensor<2xi32>, tensor<ui32>) {
    %0 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<i32>, %b: tensor<i32>):
        %s = stablehlo.add %a, %b : tensor<i32>
        stablehlo.return %s : tensor<i32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2xi32>) -> tensor<2xi32>
    %p = stablehlo.partition_id : tensor<ui32>
    return %0, %p : tensor<2xi32>, tensor<ui32>
  }
  func.func @fed(%t: !stablehlo.token) -> (tensor<2xi32>, !stablehlo.token) {
    %0:2 = "stablehlo.infeed"(%t) : (!stablehlo.token) -> (tensor<2xi32>, !stablehlo.token)
    %1 = "stablehlo.outfeed"(%0#0, %0#1) : (tensor<2xi32>, !stablehlo.token) -> !stablehlo.token
    return %0#0, %1 : tensor<2xi32>, !stablehlo.token
  }
  func.func @q() -> tensor<2xi32> {
    %0 = stablehlo.constant dense<[40, 2]> : tensor<2xi32>
    return %0 : tensor<2xi32>
  }
  func.func @main() {
    %a = stablehlo.constant dense<[1, 2]> : tensor<2xi32>
    %b = stablehlo.constant dense<[10, 20]> : tensor<2xi32>
    %c = stablehlo.constant dense<[100, 200]> : tensor<2xi32>
    %d = stablehlo.constant dense<[1000, 2000]> : tensor<2xi32>
    // 2 replicas x 2 partitions; replica groups pair (r0, r1) within each partition.
    %r:8 = "interpreter.run_parallel"(%a, %b, %c, %d) {
      programs = [[@sum, @sum], [@sum, @sum]]
    } : (tensor<2xi32>, tensor<2xi32>, tensor<2xi32>, tensor<2xi32>) ->
        (tensor<2xi32>, tensor<ui32>, tensor<2xi32>, tensor<ui32>,
         tensor<2xi32>, tensor<ui32>, tensor<2xi32>, tensor<ui32>)
    check.expect_eq_const %r#0, dense<[101, 202]> : tensor<2xi32>
    check.expect_eq_const %r#2, dense<[1010, 2020]> : tensor<2xi32>
    check.expect_eq_const %r#4, dense<[101, 202]> : tensor<2xi32>
    check.expect_eq_const %r#7, dense<1> : tensor<ui32>
    %t = stablehlo.after_all : !stablehlo.token
    %f:2 = "interpreter.run_parallel"(%t) {infeed = [@q], programs = [[@fed]]}
      : (!stablehlo.token) -> (tensor<2xi32>, !stablehlo.token)
    check.expect_eq_const %f#0, dense<[40, 2]> : tensor<2xi32>
    func.return
  }
}
"""


def test_run_parallel_grid_infeed_outfeed(tmp_path):
    f = tmp_path / "grid.mlir"
    f.write_text(PARALLEL)
    results, passed, failed = run_check_files([f])
    assert (passed, failed) == (1, 0), [r.reason for r in results]
    assert results[0].checks == 5
    wrong = tmp_path / "wrong.mlir"
    wrong.write_text(PARALLEL.replace("dense<[1010, 2020]>", "dense<[1010, 2021]>"))
    (r,), _, _ = run_check_files([wrong])
    assert not r.passed and "got [1010 2020], expected [1010 2021]" in r.reason


def test_probe_records_every_iteration(tmp_path):
    case = """
func.func @probe_loop() {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %three = stablehlo.constant dense<3> : tensor<i64>
  %r = stablehlo.while(%i = %zero) : tensor<i64>
  cond {
    %c = stablehlo.compare LT, %i, %three : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  } do {
    %n = stablehlo.add %i, %one : tensor<i64>
    %p = interpreter.probe %n, probe_id = "step/n" : tensor<i64>
    stablehlo.return %p : tensor<i64>
  }
  check.expect_eq_const %r, dense<3> : tensor<i64>
  check.expect_serialized_eq %one, probe_id = "step/n" : tensor<i64>
  check.expect_serialized_eq %three, probe_id = "step/n", iter = 2 : tensor<i64>
  func.return
}
"""
    f = tmp_path / "probe.mlir"
    f.write_text(case)
    (r,), passed, _ = run_check_files([f])
    assert r.passed and r.checks == 3, r.reason
    f.write_text(case.replace("iter = 2", "iter = 3"))
    (r,), _, _ = run_check_files([f])
    assert "recorded 3 value(s), no iteration 3" in r.reason


# --- the check dialect's comparisons (stablehlo/tests/CheckOps.cpp, Element.cpp) ------------
def test_almost_eq_is_absolute_tolerance_only():
    from runtime.conformance import compare_almost_eq
    f32 = lambda *v: np.array(v, np.float32)  # noqa: E731
    assert compare_almost_eq(f32(1.0, 2.0), f32(1.00005, 2.0), 1e-4) is None
    # Relatively tiny (1e-8) but absolutely 1e-2 apart: the reference says not equal.
    assert compare_almost_eq(f32(1e6), f32(1e6 + 0.0625), 1e-4) is not None
    assert compare_almost_eq(f32(np.nan, np.inf, -np.inf), f32(np.nan, np.inf, -np.inf),
                             1e-4) is None
    assert compare_almost_eq(f32(np.nan), f32(1.0), 1e-4) is not None
    assert compare_almost_eq(f32(np.inf), f32(3e38), 1e-4) is not None
    # A sign flip near zero is within tolerance (the current reference has no sign rule).
    assert compare_almost_eq(f32(-1e-6), f32(1e-6), 1e-4) is None
    c = np.array([1 + 1j], np.complex64)
    assert compare_almost_eq(c, np.array([1 + 1.001j], np.complex64), 1e-4) is not None
    assert compare_almost_eq(c, np.array([1 + 1.00001j], np.complex64), 1e-4) is None


def test_expect_eq_is_ieee_and_expect_close_counts_ulps():
    from runtime.conformance import DEFAULT_MAX_ULP, compare_close, compare_eq
    nan = np.array([np.nan], np.float32)
    assert compare_eq(nan, nan) is not None                 # NaN == NaN is false
    assert compare_eq(np.float32([-0.0]), np.float32([0.0])) is None
    one = np.float32(1.0)
    up1, up2 = np.nextafter(one, np.float32(2)), np.nextafter(np.nextafter(
        one, np.float32(2)), np.float32(2))
    assert DEFAULT_MAX_ULP == 1
    assert compare_close(np.array([up1]), np.array([one]), DEFAULT_MAX_ULP) is None
    assert compare_close(np.array([up2]), np.array([one]), DEFAULT_MAX_ULP) is not None
    assert compare_close(np.array([up1]), np.array([one]), 1, min_ulp=1) is None
    assert compare_close(np.array([one]), np.array([one]), 1, min_ulp=1) is not None
    # Across zero: distances add. Non-finite: only bitwise-equal (or both NaN) match.
    tiny = np.array([1], np.uint32).view(np.float32)
    assert compare_close(tiny, -tiny, 2) is None and compare_close(tiny, -tiny, 1) is not None
    big = np.array([np.finfo(np.float32).max], np.float32)
    assert compare_close(big, np.float32([np.inf]), 10**9) is not None
    assert compare_close(np.float32([np.inf, np.nan]), np.float32([np.inf, np.nan]), 0) is None
