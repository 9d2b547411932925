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
    # A bound may name "unbounded" itself (stablehlo/tests/math/ulp_difference_*.mlir).
    from runtime.conformance import UNBOUNDED_ULP
    assert compare_close(big, np.float32([np.inf]), UNBOUNDED_ULP, min_ulp=UNBOUNDED_ULP) is None
    assert compare_close(big, big, UNBOUNDED_ULP, min_ulp=UNBOUNDED_ULP) is not None


def _expect_close_case(spelling: str) -> str:
    """1 and 1 + 2 ulp compared by check.expect_close in the op or testdata's custom-call
    spelling."""
    check = ("check.expect_close %0, %1 : tensor<1xf32>, tensor<1xf32>" if spelling == "op"
             else "stablehlo.custom_call @check.expect_close(%0, %1) {has_side_effect = true}"
                  " : (tensor<1xf32>, tensor<1xf32>) -> ()")
    return ("func.func @main() {\n"
            "  %0 = stablehlo.constant dense<1.0> : tensor<1xf32>\n"
            "  %1 = stablehlo.constant dense<1.00000024> : tensor<1xf32>\n"
            f"  {check}\n  func.return\n}}\n")


def test_custom_call_checks_use_stablehlo_translate_bounds():
    # stablehlo-translate --interpret checks the custom-call spelling with 3 ULP (and
    # almost_eq with 1e-3); the check op's default is 1 ULP.
    from runtime.conformance import run_case
    assert not run_case("c.mlir", _expect_close_case("op")).passed
    assert run_case("c.mlir", _expect_close_case("custom_call")).passed


# --- the last suite files: printing/FileCheck, --args, quantization, newer collectives -------
@needs_suite
@pytest.mark.parametrize("name,cases", [
    ("printing.mlir", 4), ("api_input_arguments.mlir", 1), ("quantized_ops.mlir", 5),
    ("collective_broadcast.mlir", 10), ("collective_reduce.mlir", 1)])
def test_formerly_failing_files_pass(name, cases):
    results, passed, failed = run_check_files([CONF / name])
    reasons = [f"{r.label}: {r.reason}" for r in results if not r.passed]
    assert (passed, failed) == (cases, 0), reasons


# --- FileCheck ---------------------------------------------------------------------------
from runtime.filecheck import FileCheckError, check_or_raise, filecheck  # noqa: E402

OUTPUT = "header\ntensor<2xi32> {\n  [0, 1]\n}\nvalue = 42 units\nfooter\n"


def test_filecheck_directives_match():
    checks = """
    // CHECK-LABEL: header
    // CHECK:      tensor<2xi32> {
    // CHECK-NEXT:   [0,   1]
    // CHECK-NEXT: }
    // CHECK-NOT: error
    // CHECK: value = {{[0-9]+}}
    // CHECK-SAME: units
    // OTHER{LITERAL}: [0, 1]
    """
    assert filecheck(checks, OUTPUT) == []
    # A run of DAGs matches in any order; what follows continues after the last of them.
    dag = """// CHECK-LABEL: header
    // CHECK-DAG: [0, 1]
    // CHECK-DAG: tensor<2xi32>
    // CHECK-NEXT: }
    // CHECK: footer"""
    assert filecheck(dag, OUTPUT) == []
    assert filecheck(checks, OUTPUT, prefixes=("OTHER",)) == []
    assert filecheck("// CHECK: [[V:[a-z]+]] = 42\n// CHECK: [[V]]", "value = 42\nvalue\n") == []
    # A prefix is a whole word: CHECK-DENSE lines are not CHECK directives.
    assert filecheck("// CHECK-DENSE: nowhere\n// CHECK: footer", OUTPUT) == []


def test_filecheck_failures_say_what_and_where():
    # CHECK-NEXT whose text exists, but two lines further down.
    errs = filecheck("// CHECK: header\n// CHECK-NEXT: [0, 1]", OUTPUT, check_name="t.mlir")
    assert len(errs) == 1
    assert errs[0].startswith("t.mlir:2: CHECK-NEXT: '[0, 1]' is not on the line after")
    assert "output line 3" in errs[0] and "'tensor<2xi32> {'" in errs[0]
    errs = filecheck("// CHECK: missing text", OUTPUT, check_name="t.mlir")
    assert errs and "t.mlir:1: CHECK: expected string not found in input: 'missing text'" \
        in errs[0]
    errs = filecheck("// CHECK: header\n// CHECK-NOT: value\n// CHECK: footer", OUTPUT)
    assert errs and "excluded string 'value' found at output line 5" in errs[0]
    assert filecheck("// CHECK-SAME: x", OUTPUT)[0].endswith("without a previous match to follow")
    assert "no check strings found with prefix CHECK-X:" in \
        filecheck("// CHECK: a", "a", prefixes=("CHECK-X",))[0]
    # Without {LITERAL}, [[...]] is a variable use; with it, text.
    with pytest.raises(FileCheckError, match="undefined variable"):
        check_or_raise("// CHECK: [[X]]", "[[X]]")
    check_or_raise("// CHECK{LITERAL}: [[X]]", "[[X]]")


# --- printing, RUN lines, --args ----------------------------------------------------------
from hlo import dtypes as dt  # noqa: E402
from runtime.conformance import (format_dense, format_tensor, interpret,  # noqa: E402
                                 parse_run_lines, run_case)


def test_tensor_print_formats():
    assert format_tensor(np.array([[1, 2], [3, 4]], np.int8), dt.S8) == \
        "tensor<2x2xi8> {\n  [\n    [1, 2],\n    [3, 4]\n  ]\n}"
    assert format_tensor(np.array(7, np.uint8), dt.U8) == "tensor<ui8> {7}"
    assert format_tensor(np.zeros((2, 0), np.int8), dt.S8) == \
        "tensor<2x0xi8> {\n  [\n    [],\n    []\n  ]\n}"
    # MLIR's float spelling: 6 digits when they round-trip, else the shortest exact form;
    # NaN as its bits.
    x = np.array([1.0, np.float32(1) / np.float32(3), np.nan], np.float32)
    assert format_tensor(x, dt.F32) == \
        "tensor<3xf32> {\n  [1.000000e+00, 0.333333343, 0x7FC00000]\n}"
    assert format_tensor(np.array([1 + 2j], np.complex64), dt.C64) == \
        "tensor<1xcomplex<f32>> {\n  [[1.000000e+00, 2.000000e+00]]\n}"
    assert format_dense(np.array([2, 2], np.int32), dt.S32) == "dense<2> : tensor<2xi32>"
    assert format_dense(np.array([[1.5, -2]], np.float16), dt.F16) == \
        "dense<[[1.500000e+00, -2.000000e+00]]> : tensor<1x2xf16>"


PRINT_FILE = """// RUN: stablehlo-translate --interpret --args="[dense<[1, 2]> : tensor<2xi32>]" %s | FileCheck %s
// RUN: not stablehlo-translate --interpret --args="[1 : i32]" %s 2>&1 | FileCheck %s --check-prefix=ERR
// RUN: stablehlo-translate --interpret --probe-output-dir=/tmp %s
// ERR: expected dense elements attribute for args elements

func.func @main(%x: tensor<2xi32>) -> tensor<2xi32> {
  %c = stablehlo.constant dense<10> : tensor<2xi32>
  %0 = stablehlo.add %x, %c : tensor<2xi32>
  interpreter.print %0 : tensor<2xi32>
  interpreter.print %c : tensor<2xi32>
  interpreter.print %x : tensor<2xi32>
  %1 = stablehlo.multiply %0, %0 : tensor<2xi32>
  return %1 : tensor<2xi32>
}
// CHECK:      %0 = tensor<2xi32> {
// CHECK-NEXT:   [11, 12]
// CHECK-NEXT: }
// CHECK-NEXT: %c = tensor<2xi32> {
// CHECK:      <tensor<2xi32> {
// CHECK-NEXT:   [1, 2]
// CHECK:      tensor<2xi32> {
// CHECK-NEXT:   [121, 144]
"""


def test_run_lines_args_and_print_names(tmp_path):
    runs = parse_run_lines(PRINT_FILE)
    assert [(r.line, r.expect_fail, r.merge_stderr, r.prefixes) for r in runs] == \
        [(1, False, False, ("CHECK",)), (2, True, True, ("ERR",))]   # RUN 3: no FileCheck
    assert runs[0].args == "[dense<[1, 2]> : tensor<2xi32>]"
    res = run_case("p.mlir", PRINT_FILE, runs)
    assert res.passed, res.reason
    # The same case with a wrong expectation fails, naming the RUN line and the directive.
    bad = PRINT_FILE.replace("[121, 144]", "[121, 145]")
    res = run_case("p.mlir", bad, runs)
    assert not res.passed
    assert res.reason.startswith("FileCheck (RUN line 1): p.mlir:22: CHECK-NEXT: "
                                 "expected string not found in input: '[121, 145]'")
    # Arguments of the wrong type are refused, as the tool's signature check does.
    out = interpret(PRINT_FILE, "[dense<1> : tensor<3xi32>]")
    assert not out.ok and "expects tensor<2xi32>" in out.stderr
    out = interpret(PRINT_FILE, "not an array")
    assert not out.ok and "expectected array attribute string for args" in out.stderr


# --- quantization ------------------------------------------------------------------------
import hlo  # noqa: E402
from hlo.errors import HloImportError  # noqa: E402
from hlo.stablehlo.quant import lower_quantized, parse_quant_type  # noqa: E402


def test_parse_quant_types():
    q = parse_quant_type("!quant.uniform<i8:f32, 0.1:-5>")
    assert (q.storage, q.expressed, q.scales, q.zero_points, q.axis) == \
        ("i8", "f32", (0.1,), (-5,), None)
    assert (q.qmin, q.qmax) == (-128, 127)
    q = parse_quant_type("!quant.uniform<u4<1:14>:f16:1, {2.0, 0.5:3}>")
    assert (q.storage_mlir, q.scales, q.zero_points, q.axis, q.qmin, q.qmax) == \
        ("ui4", (2.0, 0.5), (0, 3), 1, 1, 14)
    with pytest.raises(HloImportError, match="unsupported quantized type"):
        parse_quant_type("!quant.uniform<f32:i8, 1.0>")


def _eval_text(text: str) -> np.ndarray:
    return hlo.evaluate(hlo.from_stablehlo(text), [])


def test_quantize_dequantize_by_hand():
    # scale 0.5, zero point 3: x / 0.5 + 3, clamped to [-128, 127], rounded half to even.
    #   1.25 -> 5.5 -> 6;  1.75 -> 6.5 -> 6;  -0.25 -> 2.5 -> 2;  1000 -> 127;  -1000 -> -128
    # and back: (q - 3) * 0.5.
    q = "tensor<5x!quant.uniform<i8:f32, 0.5:3>>"
    text = f"""func.func @main() -> (tensor<5xi8>, tensor<5xf32>) {{
      %x = stablehlo.constant dense<[1.25, 1.75, -0.25, 1000.0, -1000.0]> : tensor<5xf32>
      %q = stablehlo.uniform_quantize %x : (tensor<5xf32>) -> {q}
      %s = stablehlo.bitcast_convert %q : ({q}) -> tensor<5xi8>
      %d = stablehlo.uniform_dequantize %q : ({q}) -> tensor<5xf32>
      return %s, %d : tensor<5xi8>, tensor<5xf32>
    }}"""
    s, d = _eval_text(text)
    np.testing.assert_array_equal(s, np.array([6, 6, 2, 127, -128], np.int8))
    np.testing.assert_array_equal(d, np.array([1.5, 1.5, -0.5, 62.0, -65.5], np.float32))
    # Unsigned storage: u8 with zero point 10 clamps to [0, 255].
    q = "tensor<3x!quant.uniform<u8:f32, 1.0:10>>"
    text = f"""func.func @main() -> tensor<3xui8> {{
      %x = stablehlo.constant dense<[-20.0, 300.0, 2.0]> : tensor<3xf32>
      %q = stablehlo.uniform_quantize %x : (tensor<3xf32>) -> {q}
      %s = stablehlo.bitcast_convert %q : ({q}) -> tensor<3xui8>
      return %s : tensor<3xui8>
    }}"""
    np.testing.assert_array_equal(_eval_text(text), np.array([0, 255, 12], np.uint8))


def test_per_axis_storage_range_and_quantized_add():
    # Axis 1: column 0 has scale 0.5 / zp 0, column 1 scale 2.0 / zp 1; storage i8<-4:4>.
    #   [[1, 4], [-3, 3]] -> [[2, 3], [-4 (clamped from -6), 2 (2.5 rounds to even)]]
    q = "tensor<2x2x!quant.uniform<i8<-4:4>:f32:1, {0.5, 2.0:1}>>"
    text = f"""func.func @main() -> tensor<2x2xi8> {{
      %x = stablehlo.constant dense<[[1.0, 4.0], [-3.0, 3.0]]> : tensor<2x2xf32>
      %q = "stablehlo.uniform_quantize"(%x) : (tensor<2x2xf32>) -> {q}
      %s = "stablehlo.bitcast_convert"(%q) : ({q}) -> tensor<2x2xi8>
      return %s : tensor<2x2xi8>
    }}"""
    np.testing.assert_array_equal(_eval_text(text), np.array([[2, 3], [-4, 2]], np.int8))
    # add on quantized tensors: dequantize both, add, quantize to the result type.
    #   a = q(1.0; 0.25:0) = 4, b = q(3.0; 1.0:-1) = 2; 1.0 + 3.0 = 4.0 -> 4 / 0.5 + 2 = 10
    qa, qb, qr = ("tensor<!quant.uniform<i8:f32, 0.25>>", "tensor<!quant.uniform<i8:f32, 1.0:-1>>",
                  "tensor<!quant.uniform<i8:f32, 0.5:2>>")
    text = f"""func.func @main() -> tensor<i8> {{
      %x = stablehlo.constant dense<1.0> : tensor<f32>
      %y = stablehlo.constant dense<3.0> : tensor<f32>
      %a = stablehlo.uniform_quantize %x : (tensor<f32>) -> {qa}
      %b = stablehlo.uniform_quantize %y : (tensor<f32>) -> {qb}
      %r = "stablehlo.add"(%a, %b) : ({qa}, {qb}) -> {qr}
      %s = stablehlo.bitcast_convert %r : ({qr}) -> tensor<i8>
      return %s : tensor<i8>
    }}"""
    assert int(_eval_text(text)) == 10


def test_quantized_region_ops_are_refused():
    text = """func.func @main(%x: tensor<2x!quant.uniform<i8:f32, 1.0>>) -> tensor<i8> {
      %z = stablehlo.constant dense<0> : tensor<i8>
      %r = "stablehlo.reduce"(%x, %z) ({
      ^bb0(%a: tensor<!quant.uniform<i8:f32, 1.0>>, %b: tensor<!quant.uniform<i8:f32, 1.0>>):
        %s = stablehlo.add %a, %b : tensor<!quant.uniform<i8:f32, 1.0>>
        stablehlo.return %s : tensor<!quant.uniform<i8:f32, 1.0>>
      }) {dimensions = array<i64: 0>} : (tensor<2x!quant.uniform<i8:f32, 1.0>>, tensor<i8>) -> tensor<i8>
      return %r : tensor<i8>
    }"""
    with pytest.raises(HloImportError, match="inside regions"):
        lower_quantized(text)
    assert lower_quantized("func.func @f() {\n}") == "func.func @f() {\n}"


# --- collective_reduce / dynamic-root collective_broadcast ---------------------------------
REDUCE_CASE = """
func.func @reduce(%x: tensor<2xi64>, %root: tensor<1xi32>) -> tensor<2xi64> {
  %r = "stablehlo.collective_reduce"(%x, %root) ({
    ^bb0(%a: tensor<i64>, %b: tensor<i64>):
      %m = stablehlo.multiply %a, %b : tensor<i64>
      stablehlo.return %m : tensor<i64>
  }) {replica_groups = dense<[[0, 1, 2]]> : tensor<1x3xi64>, has_dynamic_root = true
  } : (tensor<2xi64>, tensor<1xi32>) -> tensor<2xi64>
  return %r : tensor<2xi64>
}
func.func @bcast(%x: tensor<2xi64>, %root: tensor<1xi32>) -> tensor<2xi64> {
  %r = "stablehlo.collective_broadcast"(%x, %root) {
    replica_groups = dense<[[1, 0]]> : tensor<1x2xi64>, has_dynamic_root,
    channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>
  } : (tensor<2xi64>, tensor<1xi32>) -> tensor<2xi64>
  return %r : tensor<2xi64>
}
func.func @main() {
  %a = stablehlo.constant dense<[1, 2]> : tensor<2xi64>
  %b = stablehlo.constant dense<[3, 4]> : tensor<2xi64>
  %c = stablehlo.constant dense<[5, 6]> : tensor<2xi64>
  %root = stablehlo.constant dense<[2]> : tensor<1xi32>
  %r:3 = "interpreter.run_parallel"(%a, %root, %b, %root, %c, %root) {
    programs = [[@reduce], [@reduce], [@reduce]]
  } : (tensor<2xi64>, tensor<1xi32>, tensor<2xi64>, tensor<1xi32>, tensor<2xi64>,
       tensor<1xi32>) -> (tensor<2xi64>, tensor<2xi64>, tensor<2xi64>)
  // The root is rank 2 of the group: process 2 gets the product 1*3*5, 2*4*6.
  check.expect_eq_const %r#0, dense<[0, 0]> : tensor<2xi64>
  check.expect_eq_const %r#1, dense<[0, 0]> : tensor<2xi64>
  check.expect_eq_const %r#2, dense<[15, 48]> : tensor<2xi64>
  %one = stablehlo.constant dense<[1]> : tensor<1xi32>
  %p:3 = "interpreter.run_parallel"(%a, %one, %b, %one, %c, %one) {
    programs = [[@bcast, @bcast, @bcast]]
  } : (tensor<2xi64>, tensor<1xi32>, tensor<2xi64>, tensor<1xi32>, tensor<2xi64>,
       tensor<1xi32>) -> (tensor<2xi64>, tensor<2xi64>, tensor<2xi64>)
  // Cross-partition group [1, 0]: rank 1 is partition 0; partition 2 is in no group.
  check.expect_eq_const %p#0, dense<[1, 2]> : tensor<2xi64>
  check.expect_eq_const %p#1, dense<[1, 2]> : tensor<2xi64>
  check.expect_eq_const %p#2, dense<[0, 0]> : tensor<2xi64>
  func.return
}
"""


def test_collective_reduce_and_dynamic_root_broadcast():
    res = run_case("c.mlir", REDUCE_CASE)
    assert res.passed and res.checks == 6, res.reason
    res = run_case("c.mlir", REDUCE_CASE.replace("[15, 48]", "[15, 49]"))
    assert not res.passed and "got [15 48], expected [15 49]" in res.reason
