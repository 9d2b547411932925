"""Layout assignment and normalization, and bitcast as a physical reinterpretation.

The interpreter keeps values logical; only ``bitcast`` reads memory order, so a wrong layout
anywhere a bitcast looks is a wrong answer here."""
import jax
import numpy as np
import pytest

import hlo
from hlo.errors import VerifierError
from passes import PassError, run_pipeline
from passes.layout_assignment import LayoutAssignment
from tests.zoo import ZOO, ZooProgram, by_name, flatten_value, x64_scope

X = np.arange(6, dtype=np.float32).reshape(2, 3)     # [[0,1,2],[3,4,5]]


def _assign(text: str, spec: str = "layout-assignment") -> hlo.Module:
    m = hlo.parse_hlo(text)
    run_pipeline(m, spec, verify=True)
    again = hlo.parse_hlo(m.to_text())
    assert again.to_text() == m.to_text()
    return m


def _body(m: hlo.Module) -> str:
    """The entry's instruction lines, as printed."""
    return "\n".join(line.strip() for line in m.entry.to_text().splitlines()[1:-1])


def _layouts_everywhere(m: hlo.Module) -> bool:
    return all(leaf.layout is not None for inst in m.all_instructions()
               for leaf in inst.shape.leaves() if leaf.is_array)


# --- bitcast: the physical reinterpretation -----------------------------------------------
def _bitcast(src: str, dst: str, x: np.ndarray) -> np.ndarray:
    m = hlo.parse_hlo(f"""HloModule m
ENTRY %main (p: {src}) -> {dst.split('{')[0]} {{
  %p = {src} parameter(0)
  ROOT %b = {dst} bitcast(%p)
}}
""")
    hlo.verify(m)
    return hlo.evaluate(m, [x])


def test_bitcast_reads_column_major_memory():
    # f32[2,3]{0,1} stores 0,3,1,4,2,5.
    np.testing.assert_array_equal(_bitcast("f32[2,3]{0,1}", "f32[6]{0}", X), [0, 3, 1, 4, 2, 5])
    # Read back as a row-major [3,2]: the transpose, without moving a byte.
    np.testing.assert_array_equal(_bitcast("f32[2,3]{0,1}", "f32[3,2]{1,0}", X),
                                  [[0, 3], [1, 4], [2, 5]])
    # Row-major memory 0..5 read as a column-major [3,2]: element [i,j] is memory[j*3+i].
    np.testing.assert_array_equal(_bitcast("f32[2,3]{1,0}", "f32[3,2]{0,1}", X),
                                  [[0, 3], [1, 4], [2, 5]])
    # Same layouts on both sides: a reshape.
    np.testing.assert_array_equal(_bitcast("f32[2,3]{1,0}", "f32[3,2]{1,0}", X),
                                  [[0, 1], [2, 3], [4, 5]])


def test_bitcast_rank3_layout_by_hand():
    x = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    # {1,2,0}: memory order dims 0,2,1: x[0,0,0],x[0,1,0],x[0,0,1],x[0,1,1],... = 0,2,1,3,4,6,5,7
    np.testing.assert_array_equal(_bitcast("s32[2,2,2]{1,2,0}", "s32[8]{0}", x),
                                  [0, 2, 1, 3, 4, 6, 5, 7])


def test_same_width_element_type_bitcast_reinterprets_bits():
    # XLA's simplifier turns bitcast-convert f32->s32 into bitcast (seen in XLA:CPU sort
    # comparators): 1.0f is 0x3f800000, -2.0f is 0xc0000000.
    got = _bitcast("f32[2,1]{1,0}", "s32[1,2]{0,1}", np.array([[1.0], [-2.0]], np.float32))
    np.testing.assert_array_equal(got, [[0x3F800000, np.int32(-0x40000000)]])


def test_verifier_rejects_bitcasts_that_are_not_pure_reinterpretations():
    with pytest.raises(VerifierError, match="different sizes in bits|element width"):
        _bitcast("f32[6]{0}", "s16[6]{0}", X.ravel())
    with pytest.raises(VerifierError, match="bitcast"):
        _bitcast("f32[6]{0}", "f32[3]{0}", X.ravel())


# --- hand-written cases ----------------------------------------------------------------
DOT_OF_TRANSPOSE = """HloModule m

ENTRY %main (a: f32[3,2], b: f32[3,4]) -> f32[2,4] {
  %a = f32[3,2] parameter(0)
  %b = f32[3,4] parameter(1)
  %t = f32[2,3] transpose(%a), dimensions={1,0}
  ROOT %d = f32[2,4] dot(%t, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
A = np.arange(6, dtype=np.float32).reshape(3, 2)
B = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


def test_gpu_folds_the_transpose_into_the_dot_operand_layout():
    m = _assign(DOT_OF_TRANSPOSE, "layout-assignment{target=h100}")
    assert _body(m) == """\
%a = f32[3,2]{1,0} parameter(0)
%b = f32[3,4]{1,0} parameter(1)
%bitcast = f32[2,3]{0,1} bitcast(%a)
ROOT %d = f32[2,4]{1,0} dot(%bitcast, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"""
    assert LayoutAssignment.last_stats["transposes_removed"] == 1
    assert LayoutAssignment.last_stats["copies_inserted"] == 0
    np.testing.assert_allclose(hlo.evaluate(m, [A, B]), A.T @ B)


INT8_DOT = """HloModule m
ENTRY %e (a: s8[4,3], b: s8[3,5]) -> s32[4,5] {
  %a = s8[4,3] parameter(0)
  %b = s8[3,5] parameter(1)
  ROOT %d = s32[4,5] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"""


def test_gpu_8bit_dot_operands_are_k_major_and_the_copy_stays_out_of_the_gemm():
    """Hopper's 8-bit wgmma (and cuBLASLt IMMA) read both operands K-major: the rhs [K,N]
    gets a {0,1} copy (K minor), which fusion must not pull back into the GEMM."""
    m = _assign(INT8_DOT, "layout-assignment{target=h100}")
    assert _body(m) == """\
%a = s8[4,3]{1,0} parameter(0)
%b = s8[3,5]{1,0} parameter(1)
%b.copy = s8[3,5]{0,1} copy(%b)
ROOT %d = s32[4,5]{1,0} dot(%a, %b.copy), lhs_contracting_dims={1}, rhs_contracting_dims={0}"""
    a = np.arange(-6, 6, dtype=np.int8).reshape(4, 3)
    b = np.arange(-7, 8, dtype=np.int8).reshape(3, 5)
    want = a.astype(np.int32) @ b.astype(np.int32)
    np.testing.assert_array_equal(hlo.evaluate(m, [a, b]), want)
    # With an epilogue the dot becomes a GEMM fusion; the K-major copy stays outside it.
    m = _assign(INT8_DOT.replace("ROOT %d = s32[4,5] dot", "%d = s32[4,5] dot").replace(
        "\n}", "\n  ROOT %n = s32[4,5] negate(%d)\n}"), "layout-assignment{target=h100}")
    run_pipeline(m, "fusion{target=h100}")
    assert [i.opcode for i in m.entry.instructions] == ["parameter", "parameter", "copy",
                                                        "fusion"], m.to_text()
    np.testing.assert_array_equal(hlo.evaluate(m, [a, b]), -want)
    # A bf16 dot keeps the cheaper either-order rule: no copy.
    m = _assign(INT8_DOT.replace("s8", "bf16").replace("s32", "f32"),
                "layout-assignment{target=h100}")
    assert "copy" not in _body(m)


def test_cpu_keeps_row_major_dot_operands():
    m = _assign(DOT_OF_TRANSPOSE, "layout-assignment{target=cpu}")
    assert "%t = f32[2,3]{1,0} transpose(%a), dimensions={1,0}" in _body(m)
    assert LayoutAssignment.last_stats["transposes_removed"] == 0
    np.testing.assert_allclose(hlo.evaluate(m, [A, B]), A.T @ B)


def test_gpu_batched_dot_needs_batch_dims_major():
    # [K,B,M] -> [B,M,K]: the permuted layout would leave the batch dim in the middle of
    # memory, which cuBLAS cannot stride over; the transpose stays and writes what it needs.
    text = """HloModule m

ENTRY %main (a: f32[4,2,3], b: f32[2,4,5]) -> f32[2,3,5] {
  %a = f32[4,2,3] parameter(0)
  %b = f32[2,4,5] parameter(1)
  %t = f32[2,3,4] transpose(%a), dimensions={1,2,0}
  ROOT %d = f32[2,3,5] dot(%t, %b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}
}
"""
    m = _assign(text, "layout-assignment{target=h100}")
    assert "%t = f32[2,3,4]{2,1,0} transpose(%a), dimensions={1,2,0}" in _body(m)
    assert LayoutAssignment.last_stats == {"transposes_removed": 0, "copies_inserted": 0,
                                           "reshapes_to_bitcast": 0, "computations_cloned": 0}
    a = np.random.RandomState(0).randn(4, 2, 3).astype(np.float32)
    b = np.random.RandomState(1).randn(2, 4, 5).astype(np.float32)
    np.testing.assert_allclose(hlo.evaluate(m, [a, b]),
                               np.einsum("kbm,bkn->bmn", a, b), rtol=1e-5)


CONFLICT = """HloModule m, entry_computation_layout={(f32[2,3]{1,0}, f32[2,3]{0,1})->f32[2,3]{1,0}}

ENTRY %main (p0: f32[2,3], p1: f32[2,3]) -> f32[2,3] {
  %p0 = f32[2,3] parameter(0)
  %p1 = f32[2,3] parameter(1)
  ROOT %add = f32[2,3] add(%p0, %p1)
}
"""


def test_a_conflict_inserts_exactly_one_copy():
    m = _assign(CONFLICT)
    assert _body(m) == """\
%p0 = f32[2,3]{1,0} parameter(0)
%p1 = f32[2,3]{0,1} parameter(1)
%p1.copy = f32[2,3]{1,0} copy(%p1)
ROOT %add = f32[2,3]{1,0} add(%p0, %p1.copy)"""
    assert LayoutAssignment.last_stats["copies_inserted"] == 1
    np.testing.assert_array_equal(hlo.evaluate(m, [X, 10 * X]), 11 * X)


def test_entry_layouts_are_kept_and_results_stay_right():
    # A column-major parameter: its transpose to a row-major result moves no data.
    text = """HloModule m, entry_computation_layout={(f32[2,3]{0,1})->(f32[3,2]{1,0}, f32[6]{0})}

ENTRY %main (p: f32[2,3]) -> (f32[3,2], f32[6]) {
  %p = f32[2,3] parameter(0)
  %e = f32[2,3] exponential(%p)
  %t = f32[3,2] transpose(%e), dimensions={1,0}
  %r = f32[6] reshape(%p)
  ROOT %out = (f32[3,2], f32[6]) tuple(%t, %r)
}
"""
    m = _assign(text)
    body = _body(m)
    assert "%p = f32[2,3]{0,1} parameter(0)" in body
    assert "%e = f32[2,3]{0,1} exponential(%p)" in body
    assert "= f32[3,2]{1,0} bitcast(%e)" in body           # the transpose is free
    assert "%r = f32[6]{0} reshape(%p)" in body             # this reshape really moves data
    assert str(m.config["entry_computation_layout"]) == \
        "{(f32[2,3]{0,1})->(f32[3,2]{1,0}, f32[6]{0})}"
    t, r = hlo.evaluate(m, [X])
    np.testing.assert_allclose(t, np.exp(X).T, rtol=1e-6)
    np.testing.assert_array_equal(r, X.ravel())
    # Normalizing puts the transpose back and keeps the column-major parameter.
    run_pipeline(m, "layout-normalization", verify=True)
    t2, r2 = hlo.evaluate(m, [X])
    np.testing.assert_array_equal(t2, t)
    np.testing.assert_array_equal(r2, r)
    assert "transpose(" in m.to_text() and "bitcast(" not in m.to_text()


def test_while_body_and_condition_share_the_loop_state_layout():
    text = """HloModule m, entry_computation_layout={(f32[2,3]{0,1})->f32[2,3]{0,1}}

%cond (cs: (s32[], f32[2,3])) -> pred[] {
  %cs = (s32[], f32[2,3]) parameter(0)
  %ci = s32[] get-tuple-element(%cs), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

%body (s: (s32[], f32[2,3])) -> (s32[], f32[2,3]) {
  %s = (s32[], f32[2,3]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %x = f32[2,3] get-tuple-element(%s), index=1
  %y = f32[2,3] add(%x, %x)
  %r = f32[6] bitcast(%y)
  %z = f32[2,3] reshape(%r)
  ROOT %t = (s32[], f32[2,3]) tuple(%j, %z)
}

ENTRY %main (p: f32[2,3]) -> f32[2,3] {
  %p = f32[2,3] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[2,3]) tuple(%zero, %p)
  %w = (s32[], f32[2,3]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[2,3] get-tuple-element(%w), index=1
}
"""
    # The pre-existing bitcast is row-major (no layout printed): it keeps that meaning.
    before = hlo.evaluate(hlo.parse_hlo(text), [X])
    m = _assign(text)
    body = m.computation("body")
    assert body.parameters[0].shape.elements[1].layout.minor_to_major == (0, 1)
    assert body.root.shape.elements[1].layout.minor_to_major == (0, 1)
    assert m.computation("cond").parameters[0].shape == body.parameters[0].shape
    np.testing.assert_array_equal(hlo.evaluate(m, [X]), before)
    np.testing.assert_array_equal(before, 8 * X)
    assert _layouts_everywhere(m)


def test_a_computation_called_with_two_layouts_is_cloned():
    text = """HloModule m, entry_computation_layout={(f32[2,2]{1,0}, f32[2,2]{0,1})->(f32[4], f32[4])}

%f (x: f32[2,2]) -> f32[4] {
  %x = f32[2,2] parameter(0)
  ROOT %r = f32[4] bitcast(%x)
}

ENTRY %main (a: f32[2,2], b: f32[2,2]) -> (f32[4], f32[4]) {
  %a = f32[2,2] parameter(0)
  %b = f32[2,2] parameter(1)
  %ca = f32[4] call(%a), to_apply=%f
  %cb = f32[4] call(%b), to_apply=%f
  ROOT %t = (f32[4], f32[4]) tuple(%ca, %cb)
}
"""
    x = np.array([[1, 2], [3, 4]], np.float32)
    m = _assign(text)
    assert LayoutAssignment.last_stats["computations_cloned"] == 1
    # The bitcast in %f reads row-major memory: a copy feeds it for the column-major %b.
    assert LayoutAssignment.last_stats["copies_inserted"] == 1
    ra, rb = hlo.evaluate(m, [x, x])
    np.testing.assert_array_equal(ra, [1, 2, 3, 4])
    np.testing.assert_array_equal(rb, [1, 2, 3, 4])


def test_gpu_convolution_layouts():
    text = """HloModule m

ENTRY %main (x: bf16[1,4,5,5], w: bf16[6,4,3,3]) -> bf16[1,6,3,3] {
  %x = bf16[1,4,5,5] parameter(0)
  %w = bf16[6,4,3,3] parameter(1)
  ROOT %c = bf16[1,6,3,3] convolution(%x, %w), window={size=3x3}, dim_labels=bf01_oi01->bf01
}
"""
    m = _assign(text, "layout-assignment{target=h100}")
    body = _body(m)
    # NHWC for 16-bit inputs: memory order b,0,1,f (input/output) and o,0,1,i (kernel).
    assert "%x.copy = bf16[1,4,5,5]{1,3,2,0} copy(%x)" in body
    assert "%w.copy = bf16[6,4,3,3]{1,3,2,0} copy(%w)" in body
    assert "%c = bf16[1,6,3,3]{1,3,2,0} convolution(" in body
    assert "ROOT %c.copy = bf16[1,6,3,3]{3,2,1,0} copy(%c)" in body
    rng = np.random.RandomState(0)
    x = rng.randn(1, 4, 5, 5).astype(hlo.dtypes.by_name("bf16").np_dtype)
    w = rng.randn(6, 4, 3, 3).astype(hlo.dtypes.by_name("bf16").np_dtype)
    np.testing.assert_array_equal(hlo.evaluate(m, [x, w]), hlo.evaluate(hlo.parse_hlo(text), [x, w]))


def test_unknown_target_is_an_error():
    with pytest.raises(PassError, match="unknown target 'tpu'"):
        _assign(CONFLICT, "layout-assignment{target=tpu}")


def test_normalization_round_trip_of_the_gpu_dot():
    m = _assign(DOT_OF_TRANSPOSE, "layout-assignment{target=h100},layout-normalization")
    assert _body(m) == """\
%a = f32[3,2]{1,0} parameter(0)
%b = f32[3,4]{1,0} parameter(1)
%transpose = f32[2,3]{1,0} transpose(%a), dimensions={1,0}
ROOT %d = f32[2,4]{1,0} dot(%transpose, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"""
    np.testing.assert_allclose(hlo.evaluate(m, [A, B]), A.T @ B)


# --- the zoo ------------------------------------------------------------------------------
def _zoo(program: ZooProgram, spec: str):
    with x64_scope(program):
        args = program.args()
        flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        module = hlo.from_jax(program.fn, *args)
        expected = flatten_value(hlo.evaluate(module, flat))
        optimized = module.clone()
        run_pipeline(optimized, spec, verify=True)
        text = optimized.to_text()
        assert hlo.parse_hlo(text).to_text() == text
        got = flatten_value(hlo.evaluate(optimized, flat))
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        if e.dtype.kind in "biuc":
            np.testing.assert_allclose(g, e, rtol=program.rtol, atol=program.atol, err_msg=str(k))
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=program.rtol, atol=program.atol, err_msg=str(k))
    return optimized


ZOO_SPEC = "inline,fixpoint(simplify,cse,dce),layout-assignment{target=h100}"


@pytest.mark.parametrize("program", ZOO, ids=[p.name for p in ZOO])
def test_zoo_after_gpu_layout_assignment(program: ZooProgram):
    m = _zoo(program, ZOO_SPEC)
    assert _layouts_everywhere(m)
    # Elementwise operands share their result's layout.
    for inst in m.all_instructions():
        if inst.op.elementwise and inst.opcode != "copy" and not inst.shape.is_tuple:
            for o in inst.operands:
                if o.shape.rank == inst.shape.rank and o.shape.rank > 0:
                    assert o.shape.layout == inst.shape.layout, inst.to_text()


@pytest.mark.parametrize("name", ["transformer_block", "linalg_cholesky_solve", "mlp_train_step",
                                  "cnn_nhwc", "einsum_batched", "giou_boxes", "scan_rnn"])
def test_zoo_normalized_back_to_default_layouts(name: str):
    m = _zoo(by_name(name), ZOO_SPEC + ",layout-normalization")
    assert "bitcast(" not in m.to_text()
    for inst in m.all_instructions():
        for leaf in inst.shape.leaves():
            if leaf.is_array and leaf.rank:
                assert leaf.layout.is_row_major, inst.to_text()


def test_transposes_removed_in_the_zoo():
    """The count the pass reports, on programs whose transposes feed dots or get undone."""
    # The zoo's transformer block has 8 query rows per head: its attention runs as library
    # dots (fewer than 16 rows are a decoding step to the attention matcher, not a flash
    # kernel reading its operands in place), and the head transposes feeding them stay.
    _zoo(by_name("transformer_block"), ZOO_SPEC)
    assert LayoutAssignment.last_stats["transposes_removed"] == 0
    _zoo(by_name("mlp_train_step"), ZOO_SPEC)
    assert LayoutAssignment.last_stats["transposes_removed"] == 2
