"""HLO text printer + parser: round trips on real XLA output, XLA's own parser as an oracle,
literals, shapes, attributes and error positions.

Fixtures in tests/data/hlo/ come from ``tests/data/hlo/generate.py`` (jax on CPU): each
program as ``lower().as_text(dialect="hlo")`` (short style) and ``compile().as_text()``
(long style); the three XLA:GPU anchors come from /work/shared/anchors.
"""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import hlo
from hlo import ParseError, attrs, dtypes as dt
from hlo.ir import Computation, Instruction
from hlo.sharding import Sharding
from hlo.text.parser import ComputationLayout
from hlo.text.printer import format_float, format_literal

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
from tests.paths import ANCHORS
LOWERED = sorted(DATA.glob("*.lowered.hlo.txt"))
COMPILED = sorted(DATA.glob("*.compiled.hlo.txt"))
ANCHOR_FILES = sorted(ANCHORS.glob("*.hlo.txt")) if ANCHORS.exists() else []
ALL = LOWERED + COMPILED + ANCHOR_FILES


def _id(p: pathlib.Path) -> str:
    return p.name.replace(".hlo.txt", "")


# --- structural comparison -----------------------------------------------------------------

def _value_key(v):
    """A comparable form of an attribute value (computations by name)."""
    if isinstance(v, Computation):
        return ("computation", v.name)
    if isinstance(v, Instruction):
        return ("instruction", v.name)
    if isinstance(v, tuple):
        return tuple(_value_key(x) for x in v)
    return v


def _literal_equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple):
        return isinstance(b, tuple) and all(_literal_equal(x, y) for x, y in zip(a, b))
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())   # bitwise: keeps -0 and nan exact


def assert_same_module(a: hlo.Module, b: hlo.Module) -> None:
    assert a.name == b.name
    assert [c.name for c in a.computations] == [c.name for c in b.computations]
    assert a.entry.name == b.entry.name
    assert a.sections == b.sections
    assert list(a.config) == list(b.config)
    for ca, cb in zip(a.computations, b.computations):
        assert ca.root.name == cb.root.name
        assert [p.name for p in ca.parameters] == [p.name for p in cb.parameters]
        assert len(ca.instructions) == len(cb.instructions), ca.name
        for ia, ib in zip(ca.instructions, cb.instructions):
            where = f"%{ca.name} %{ia.name}"
            assert (ia.name, ia.opcode, ia.shape) == (ib.name, ib.opcode, ib.shape), where
            assert [o.name for o in ia.operands] == [o.name for o in ib.operands], where
            assert [o.name for o in ia.control_predecessors] == \
                [o.name for o in ib.control_predecessors], where
            assert ia.parameter_number == ib.parameter_number, where
            assert {k: _value_key(v) for k, v in ia.attrs.items()} == \
                {k: _value_key(v) for k, v in ib.attrs.items()}, where
            assert _literal_equal(ia.literal, ib.literal), where
            for o in ia.operands:   # users are kept exact
                assert ia in o.users


# --- round trips on XLA output --------------------------------------------------------------

def test_fixtures_exist():
    assert len(LOWERED) >= 15 and len(COMPILED) >= 15
    assert len(ANCHOR_FILES) == 3


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_round_trip(path):
    text = path.read_text()
    m = hlo.parse_hlo(text, str(path))
    printed = m.to_text()
    m2 = hlo.parse_hlo(printed)
    assert m2.to_text() == printed
    assert_same_module(m, m2)
    if path in LOWERED:
        return
    # The long style is what hlotk prints: XLA's own output comes back byte for byte.
    assert printed == text


def _assert_copy_is_clone(m: hlo.Module) -> None:
    """``Module.copy`` gives what ``clone`` (print, parse back) gives, sharing no object
    of the graph with the original."""
    copied, cloned = m.copy(), m.clone()
    assert copied.to_text() == cloned.to_text() == m.to_text()
    assert_same_module(copied, cloned)
    old = {id(x) for c in m.computations for x in [c] + c.instructions}
    for cc, cl in zip(copied.computations, cloned.computations):
        assert id(cc) not in old and cc.parent is copied
        assert (cc.fusion_instruction is None) == (cl.fusion_instruction is None)
        if cc.fusion_instruction is not None:
            assert cc.fusion_instruction.attrs["calls"] is cc
        for ic, il in zip(cc.instructions, cl.instructions):
            assert id(ic) not in old and ic.parent is cc
            # users in the parser's order (program order), not the original's
            assert [u.name for u in ic.users] == [u.name for u in il.users]
            for callee in ic.called_computations:
                assert callee.parent is copied
    assert copied._names == cloned._names
    assert copied._computation_names == cloned._computation_names


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_copy_is_clone_without_printing(path):
    _assert_copy_is_clone(hlo.parse_hlo(path.read_text(), str(path)))


def test_copy_of_a_fused_module_is_independent():
    import jax.numpy as jnp

    from passes import run_pipeline
    from passes.pipelines import pipeline_spec
    m = hlo.from_jax(lambda x, y: jnp.tanh(x @ y + 1.0).sum(0) * 2.0,
                     np.ones((8, 4), np.float32), np.ones((4, 4), np.float32))
    run_pipeline(m, pipeline_spec("default", "cpu"))
    assert any(i.opcode == "fusion" for i in m.entry.instructions)
    _assert_copy_is_clone(m)
    # The copy's attributes and config are its own: changing them leaves the original.
    before = m.to_text()
    c = m.copy()
    c.config["entry_computation_layout"] = "changed"
    for inst in c.all_instructions():
        inst.attrs.clear()
    c.entry.instructions[-1].name = "renamed"
    assert m.to_text() == before


def test_parsed_module_structure():
    m = hlo.parse_hlo((DATA / "constants.compiled.hlo.txt").read_text())
    assert m.name == "jit_constants"
    assert m.is_scheduled and m.config["is_scheduled"] is True
    layout = m.config["entry_computation_layout"]
    assert isinstance(layout, ComputationLayout)
    assert layout.parameters == (hlo.array("f32", (2, 3), (1, 0)),)
    assert str(layout.result) == "(f32[2,3]{1,0}, f16[3]{0}, pred[3]{0}, s32[3]{0}, u32[2]{0})"
    assert m.config["allow_spmd_sharding_propagation_to_output"] == (True,) * 5
    assert m.sections["FunctionNames"][0] == (1, '"<module>"')
    assert m.entry.name == "main.1" and m.computations[-1] is m.entry
    fusion = m.entry.get("wrapped_add")
    body = fusion.attrs["calls"]
    assert isinstance(body, Computation) and body.name == "wrapped_add_computation"
    assert body.fusion_instruction is fusion and fusion.attrs["kind"] == "kLoop"
    md = fusion.metadata
    assert md.get("op_name") == "jit(constants)/add" and md.get("stack_frame_id") == 3
    assert m.entry.get("x.1").parameter_number == 0
    assert m.entry.root.opcode == "tuple" and m.entry.root.name == "tuple"
    assert [o.name for o in m.entry.root.operands][:2] == ["wrapped_add", "copy"]


def test_short_style_structure():
    m = hlo.parse_hlo((DATA / "switch.lowered.hlo.txt").read_text())
    assert m.entry.name == "main.4"
    cond = m.entry.root
    assert cond.opcode == "conditional"
    assert [c.name for c in cond.attrs["branch_computations"]] == \
        ["region_0.1", "region_1.2", "region_2.3"]
    assert all(c.parent is m for c in cond.attrs["branch_computations"])
    # Computation and instruction names live apart, as in XLA (%fft.1 the computation,
    # %fft.1 the instruction).
    fft = hlo.parse_hlo((DATA / "complex_fft.lowered.hlo.txt").read_text())
    assert fft.computation("fft.1").get("fft.1").opcode == "fft"


def test_short_and_long_style_parse_to_the_same_module():
    """XLA reprints the short style in the long style; both parse to the same module."""
    # (constants.lowered is left out: XLA's parser reads f16 "-0" as +0.)
    for path in [p for p in LOWERED if "constants" not in p.name][:8]:
        text = path.read_text()
        xla_long = _xla_reprint([text])[0]
        assert xla_long[0], xla_long[1]
        assert_same_module(hlo.parse_hlo(text), hlo.parse_hlo(xla_long[1]))


def test_live_jax_output_round_trips():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x, y):
        return jnp.sum(jnp.where(x > 0, x @ y, -1.0), axis=0), jax.lax.cumsum(x, 1)

    args = (np.ones((3, 4), np.float32), np.ones((4, 4), np.float32))
    lowered = jax.jit(f).lower(*args)
    for text in (lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
        m = hlo.parse_hlo(text)
        assert hlo.parse_hlo(m.to_text()).to_text() == m.to_text()
    assert m.to_text() == text


# --- XLA's parser as an oracle (run in a subprocess: XLA CHECK-fails abort the process) ---

_ORACLE = r"""
import json, sys
from jaxlib import _hlo
out = []
for t in json.load(sys.stdin):
    try:
        out.append([True, _hlo.hlo_module_from_text(t).to_string()])
    except Exception as e:
        out.append([False, str(e)])
json.dump(out, sys.stdout)
"""


def _xla_reprint(texts: list[str]) -> list[tuple[bool, str]]:
    try:
        from jaxlib import _hlo  # noqa: F401
    except ImportError:
        pytest.skip("jaxlib._hlo not available")
    r = subprocess.run([sys.executable, "-c", _ORACLE], input=json.dumps(texts),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [tuple(x) for x in json.loads(r.stdout)]


def test_xla_accepts_our_text_and_prints_what_we_print():
    ours = [hlo.parse_hlo(p.read_text()).to_text(print_large_constants=False) for p in ALL]
    results = _xla_reprint(ours)
    for path, text, (ok, xla_text) in zip(ALL, ours, results):
        assert ok, f"XLA rejects our print of {path.name}: {xla_text}"
        if path in LOWERED:
            # The short style has no stack-frame tables for XLA to renumber, so XLA's
            # reprint is ours exactly. XLA's parser reads f16 "-0" as +0 (it negates the
            # integer 0), which is why that one element differs.
            if path.name == "constants.lowered.hlo.txt":
                text = text.replace("inf, -0}", "inf, 0}")
            assert xla_text == text, path.name


def test_xla_accepts_builder_module():
    b = hlo.Builder("main")
    x = b.parameter(hlo.array("f32", (2, 3), (1, 0)))
    c = b.constant(np.array([[1.5, -np.inf, np.nan], [0.1, 2, 3]], np.float32))
    s = b.add(x, c, shape=x.shape)
    m = b.module(root=b.tuple(s, x, shape=hlo.tuple_shape(x.shape, x.shape)))
    text = m.to_text()
    assert "constant({ { 1.5, -inf, nan }, { 0.1, 2, 3 } })" in text
    assert _xla_reprint([text])[0][0]
    m2 = hlo.parse_hlo(text)
    assert_same_module(m, m2)


# --- literals -------------------------------------------------------------------------------

def _const(shape: str, literal: str) -> hlo.Instruction:
    m = hlo.parse_hlo(f"HloModule m\nENTRY e {{\n  ROOT c = {shape} constant({literal})\n}}\n")
    return m.entry.root


@pytest.mark.parametrize("shape,text,dtype,expected", [
    ("pred[]", "true", np.bool_, True),
    ("pred[3]", "{1, 0, 1}", np.bool_, [True, False, True]),
    ("s4[2]", "{-8, 7}", ml_dtypes.int4, [-8, 7]),
    ("u64[1]", "{18446744073709551615}", np.uint64, [2**64 - 1]),
    ("bf16[2]", "{0.1001, 300}", ml_dtypes.bfloat16, [0.10009765625, 300]),
    ("f8e4m3fn[2]", "{0.102, 288}", ml_dtypes.float8_e4m3fn, [0.1015625, 288]),
    ("f8e5m2[2]", "{0.094, 3.2e+02}", ml_dtypes.float8_e5m2, [0.09375, 320]),
    ("c64[2]", "{(1, 2), (3.5, -4)}", np.complex64, [1 + 2j, 3.5 - 4j]),
    ("c128[]", "(1, -0.5)", np.complex128, 1 - 0.5j),
    ("f32[2,2,2]", "{ { { 1, 2 }, { 3, 4 } }, { { 5, 6 }, { 7, 8 } } }", np.float32,
     np.arange(1, 9).reshape(2, 2, 2)),
    ("f32[2,0]", "{ {}, {} }", np.float32, np.zeros((2, 0))),
    ("f32[0,2]", "{  }", np.float32, np.zeros((0, 2))),
    ("s32[2,1,1,2]", "{ { /*i0=0*/ { /*i1=0*/ { 1, 2 } } }, { /*i0=1*/ { /*i1=0*/ { 3, 4 } } } }",
     np.int32, [[[[1, 2]]], [[[3, 4]]]]),
])
def test_literal_parse(shape, text, dtype, expected):
    inst = _const(shape, text)
    assert inst.literal.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(inst.literal.astype(np.complex128 if "c" in shape[0] else
                                                      np.float64), np.asarray(expected))
    # ... and it prints back the way XLA prints it (these strings are XLA's own output).
    assert format_literal(inst.literal, inst.shape) == text


def test_literal_special_values():
    inst = _const("f32[4]", "{nan, -nan, -inf, -0}")
    lit = inst.literal
    assert np.isnan(lit[0]) and not np.signbit(lit[0])
    assert np.isnan(lit[1]) and np.signbit(lit[1])
    assert lit[2] == -np.inf and lit[3] == 0 and np.signbit(lit[3])
    assert format_literal(lit, inst.shape) == "{nan, -nan, -inf, -0}"


def test_literal_elided_and_tuple():
    assert _const("f32[20]", "{...}").literal is None
    assert _const("(f32[], s32[2])", "{...}").literal is None
    t = _const("(f32[], s32[2])", "( 1, {2, 3} )")
    assert t.literal[0] == np.float32(1) and t.literal[1].tolist() == [2, 3]
    assert t.to_text() == "%c = (f32[], s32[2]) constant(( 1, {2, 3} ))"
    big = _const("s32[12]", "{" + ", ".join(map(str, range(12))) + "}")
    assert big.to_text(print_large_constants=False) == "%c = s32[12] constant({...})"
    assert big.to_text().endswith("constant({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})")


@pytest.mark.parametrize("value,dtype,text", [
    # Strings XLA printed for these values (see the oracle runs in the fixtures).
    (1 / 7, "f32", "0.142857149"), (16777216, "f32", "16777216"), (1e-45, "f32", "1.4013e-45"),
    (0.1, "f32", "0.1"), (1e10, "f32", "1e+10"), (1.5e-7, "f32", "1.5e-07"),
    (3.43273939e-07, "f32", "3.43273939e-07"),
    (0.1, "f64", "0.1"), (1 / 7, "f64", "0.14285714285714285"),
    (0.1, "bf16", "0.1001"), (300, "bf16", "300"), (0.2, "f16", "0.19995"),
    (60000, "f16", "60000"), (1e-7, "f16", "1.1921e-07"), (300, "f8e5m2", "3.2e+02"),
    (0.1, "f8e4m3fn", "0.102"), (float("inf"), "f32", "inf"), (float("-inf"), "bf16", "-inf"),
])
def test_float_format(value, dtype, text):
    d = dt.by_name(dtype)
    assert format_float(np.asarray(value).astype(d.np_dtype), d) == text


@pytest.mark.parametrize("shape,literal,message", [
    ("f32[3]", "{1, 2}", "literal has 2 elements in dimension 0 but the shape says 3"),
    ("s8[1]", "{300}", "300 is out of range for s8"),
    ("s32[]", "1.5", "expected an integer s32 value but found '1.5'"),
    ("pred[]", "2", "expected a pred value (true, false, 1 or 0) but found '2'"),
])
def test_literal_errors(shape, literal, message):
    with pytest.raises(ParseError) as e:
        _const(shape, literal)
    assert message in str(e.value)
    assert e.value.line == 3


# --- shapes ------------------------------------------------------------------------------------

def test_parse_shape():
    assert hlo.parse_shape("f32[2,3]{1,0}") == hlo.array("f32", (2, 3), (1, 0))
    assert hlo.parse_shape("f32[2,3]") == hlo.array("f32", (2, 3))
    assert hlo.parse_shape("pred[]") == hlo.scalar("pred")
    assert hlo.parse_shape("token[]") == hlo.token()
    t = hlo.parse_shape("(s32[], (f32[2]{0}, token[]), /*index=2*/u8[0])")
    assert t.is_tuple and len(t.elements) == 3 and t.elements[1].elements[1].is_token
    tiled = hlo.parse_shape("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}")
    assert tiled.layout == hlo.Layout((1, 0), "T(8,128)(2,1)S(1)")
    assert str(tiled) == "bf16[8,128]{1,0:T(8,128)(2,1)S(1)}"
    assert hlo.parse_shape("()") == hlo.tuple_shape()


@pytest.mark.parametrize("text,col,message", [
    ("f32[<=4]", 5, "dynamic dimensions are not supported"),
    ("f32[?,2]", 5, "dynamic dimensions are not supported"),
    ("f33[2]", 1, "expected a shape but found 'f33'"),
    ("f32[2,3]{1,1}", 9, "is not a permutation of 2 dimensions"),
    ("f32[2] x", 8, "expected end of shape but found 'x'"),
    ("(f32[], s32[]", 14, "expected ')' but found end of input"),
])
def test_parse_shape_errors(text, col, message):
    with pytest.raises(ParseError) as e:
        hlo.parse_shape(text)
    assert (e.value.line, e.value.column) == (1, col)
    assert message in str(e.value)


# --- attributes ------------------------------------------------------------------------------

ATTRS_MODULE = """\
HloModule attrs, replica_count=2, num_partitions=4, input_output_alias={ {0}: (0, {}, may-alias) }

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (x: f32[1,8,8,3], w: f32[3,3,3,4], v: f32[8]) -> f32[8] {
  %x = f32[1,8,8,3]{3,2,1,0} parameter(0), sharding={devices=[1,2,2,1]<=[4]}
  %w = f32[3,3,3,4]{3,2,1,0} parameter(1)
  %v = f32[8]{0} parameter(2), sharding={replicated}
  %conv = f32[1,4,4,4]{3,2,1,0} convolution(%x, %w), window={size=3x3 stride=2x2 pad=1_1x0_1 rhs_dilate=1x2}, dim_labels=b01f_01io->b01f, feature_group_count=1
  %rw = f32[1,4,4,4]{3,2,1,0} reduce-window(%conv, %zero), window={size=1x2x2x1 stride=1x1x1x1 pad=0_0x0_1x0_1x0_0}, to_apply=%later
  %zero = f32[] constant(0)
  %p = f32[11]{0} pad(%v, %zero), padding=1_2, frontend_attributes={_xla_stream="1",k="a b"}
  %sl = f32[4]{0} slice(%p), slice={[0:8:2]}
  %ar = f32[4]{0} all-reduce(%sl), channel_id=3, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%add
  %ag = f32[8]{0} all-gather(%ar), replica_groups={{0,1},{2,3}}, dimensions={0}
  %cp = f32[8]{0} collective-permute(%ag), source_target_pairs={{0,1},{1,0}}
  %cc = f32[8]{0} custom-call(%cp), custom_call_target="my$target", backend_config="{\\"k\\": 1}", custom_call_has_side_effect=true, mystery_attr={a, {b}}
  %d = f32[8]{0} dot(%cc, %cc), lhs_contracting_dims={}, rhs_contracting_dims={}, operand_precision={highest,default}, control-predecessors={%ar}, metadata={op_name="d" source_file="f.py" source_line=7 profile_type={relative}}
  ROOT %r = f32[8]{0} reduce-precision(%d), exponent_bits=5, mantissa_bits=10
}

%later (p0: f32[], p1: f32[]) -> f32[] {
  %p0 = f32[] parameter(0)
  %p1 = f32[] parameter(1)
  ROOT %m = f32[] maximum(%p0, %p1)
}
"""


def test_typed_attributes():
    # (Operands used before their definition are rejected; move %zero up first.)
    text = ATTRS_MODULE.replace(
        "  %zero = f32[] constant(0)\n", "").replace(
        "  %conv =", "  %zero = f32[] constant(0)\n  %conv =")
    m = hlo.parse_hlo(text)
    e = m.entry
    assert m.config["replica_count"] == 2 and m.config["num_partitions"] == 4
    assert m.config["input_output_alias"] == attrs.Raw("{ {0}: (0, {}, may-alias) }")
    conv = e.get("conv")
    win = conv.attrs["window"]
    assert win.dims[0] == attrs.WindowDim(3, 2, 1, 1, 1, 1)
    assert win.dims[1] == attrs.WindowDim(3, 2, 0, 1, 2, 1)
    assert conv.attrs["dim_labels"] == attrs.ConvDimLabels(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2))
    rw = e.get("rw")
    assert rw.attrs["to_apply"] is m.computation("later")   # forward reference resolved
    assert e.get("p").attrs["padding"] == attrs.PaddingConfig((attrs.PadDim(1, 2),))
    assert e.get("p").frontend_attributes.get("k") == "a b"
    assert e.get("sl").attrs["slice"] == attrs.SliceSpec((attrs.SliceDim(0, 8, 2),))
    ar = e.get("ar")
    assert ar.attrs["replica_groups"] == attrs.IotaReplicaGroups((2, 2), (2, 2), (1, 0))
    assert ar.attrs["replica_groups"].expand() == [[0, 2], [1, 3]]
    assert ar.attrs["channel_id"] == 3 and ar.attrs["use_global_device_ids"] is True
    assert e.get("ag").attrs["replica_groups"] == attrs.ReplicaGroups(((0, 1), (2, 3)))
    assert e.get("cp").attrs["source_target_pairs"] == ((0, 1), (1, 0))
    cc = e.get("cc")
    assert cc.attrs["custom_call_target"] == "my$target"
    assert cc.attrs["backend_config"] == attrs.Raw('"{\\"k\\": 1}"')
    assert cc.attrs["mystery_attr"] == attrs.Raw("{a, {b}}")
    d = e.get("d")
    assert d.attrs["operand_precision"] == ("highest", "default")
    assert d.control_predecessors == [ar]
    assert d.metadata.get("source_line") == 7
    assert d.metadata.get("profile_type") == attrs.Raw("{relative}")
    assert e.get("x").sharding == Sharding.iota((1, 2, 2, 1))
    assert e.get("v").sharding.is_replicated
    # Operands written with their shapes (older XLA) parse to plain operands.
    s = m.computation("add").root
    assert [o.name for o in s.operands] == ["a", "b"]
    assert e.root.attrs == {"exponent_bits": 5, "mantissa_bits": 10}

    printed = m.to_text()
    assert "add(%a, %b)" in printed
    assert ("window={size=3x3 stride=2x2 pad=1_1x0_1 rhs_dilate=1x2}, dim_labels=b01f_01io->b01f"
            in printed)
    assert ("operand_precision={highest,default}, control-predecessors={%ar}, "
            'metadata={op_name="d" source_file="f.py" source_line=7 profile_type={relative}}'
            in printed)
    assert 'backend_config="{\\"k\\": 1}", custom_call_has_side_effect=true, ' \
           "mystery_attr={a, {b}}" in printed
    assert "replica_groups=[2,2]<=[2,2]T(1,0)" in printed
    assert "sharding={devices=[1,2,2,1]<=[4]}" in printed
    m2 = hlo.parse_hlo(printed)
    assert m2.to_text() == printed
    assert_same_module(m, m2)
    # The entry prints last, after the computations it calls.
    assert printed.index("%later") < printed.index("ENTRY %main")


def test_print_options():
    m = hlo.parse_hlo((DATA / "matmul.compiled.hlo.txt").read_text())
    plain = m.to_text(print_layout=False, print_metadata=False)
    assert "metadata=" not in plain and "{1,0}" not in plain.split("\n", 1)[1].replace(
        "entry_computation_layout", "")
    assert "f32[4,3] " in plain


# --- errors -------------------------------------------------------------------------------------

GOOD = """\
HloModule m

ENTRY %main (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %n = f32[2]{0} negate(%p)
}
"""


@pytest.mark.parametrize("old,new,line,col,message", [
    ("negate(%p)", "negate(%p,)", 5, 33, "expected an operand name but found ')'"),
    ("negate(%p)", "negate(%p", 6, 1, "expected ')' but found '}'"),
    ("negate(%p)", "negat(%p)", 5, 23, "unknown opcode 'negat'"),
    ("negate(%p)", "negate(%q)", 5, 30, "unknown operand %q"),
    ("negate(%p)", "negate(%p), to_apply=%nowhere", 5, 44, "unknown computation %nowhere"),
    ("negate(%p)", "negate(%p), dimensions=3", 5, 46, "expected '{' but found '3'"),
    ("negate(%p)", "negate(%p), index=x", 5, 41, "expected an integer for index but found 'x'"),
    ("negate(%p)", 'negate(%p), sharding={devices=[2]0}', 5, 56,
     "tile grid [2] needs 2 device ids but found 1"),
    ("HloModule m", "HloModul m", 1, 1, "expected 'HloModule' but found 'HloModul'"),
    ("f32[2]{0} parameter(0)", "f32[2]{0} parameter(0", 5, 3, "expected ')' but found 'ROOT'"),
    ("= f32[2]{0} negate", "= f32[2]{0,1} negate", 5, 19, "not a permutation of 1 dimensions"),
    ("(p: f32[2])", "(p: f32[3])", 3, 14, "signature parameter p: f32[3] does not match"),
    ("ROOT %n", "ROOT %p", 5, 8, "instruction name %p is already used"),
    ("f32[2]{0} parameter(0)", "f32[<=2]{0} parameter(0)", 4, 12,
     "dynamic dimensions are not supported"),
    ('negate(%p)', 'negate(%p), metadata={op_name="x}', 5, 53, "unterminated string"),
    ("}\n", "", 6, 1, "expected an instruction or '}' but found end of input"),
])
def test_parse_errors(old, new, line, col, message):
    text = GOOD.replace(old, new)
    assert text != GOOD
    with pytest.raises(ParseError) as e:
        hlo.parse_hlo(text, "bad.hlo")
    err = e.value
    assert (err.line, err.column) == (line, col), str(err)
    assert message in err.message
    assert str(err).startswith(f"bad.hlo:{line}:{col}: ")


def test_error_message_shows_the_line():
    with pytest.raises(ParseError) as e:
        hlo.parse_hlo(GOOD.replace("negate(%p)", "negate(%p,)"))
    assert str(e.value) == ("<text>:5:33: expected an operand name but found ')'\n"
                            "    ROOT %n = f32[2]{0} negate(%p,)\n"
                            "                                  ^")


def test_garbage_never_raises_a_bare_exception():
    """Truncating a real module anywhere gives ParseError, never another exception."""
    text = (DATA / "scan.compiled.hlo.txt").read_text()
    for cut in range(40, len(text) - 3, max(1, len(text) // 150)):
        try:
            hlo.parse_hlo(text[:cut])
        except ParseError:
            pass


def test_mesh_replica_groups_parse_expand_and_print_back():
    """Newer XLA prints ``replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` (optionally
    with the mesh's ``device_ids``): groups are the devices along the named axes."""
    text = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %r1 = f32[4]{0} all-reduce(%x), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, use_global_device_ids=true, to_apply=%add
  %r2 = f32[4]{0} all-reduce(%x), channel_id=2, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, use_global_device_ids=true, to_apply=%add
  %r3 = f32[4]{0} all-reduce(%x), channel_id=3, replica_groups=mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'a'}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(%r1, %r2, %r3)
}
"""
    m = hlo.parse_hlo(text)
    r1, r2, r3 = m.entry.root.operands
    assert r1.attrs["replica_groups"].expand() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r2.attrs["replica_groups"].expand() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # ids [4,2]T(1,0) = [[0,2,4,6],[1,3,5,7]] as the (a=2, b=4) mesh; groups along 'a'
    assert r3.attrs["replica_groups"].expand() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    printed = m.to_text()
    assert "replica_groups=mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'a'}" in printed
    assert hlo.parse_hlo(printed).to_text() == printed
    with pytest.raises(hlo.ParseError, match="does not have"):
        hlo.parse_hlo(text.replace("{'axis_1'}", "{'axis_9'}"))


def test_quote_escapes_as_xla_prints():
    """``attrs.quote``: plain strings as they are (its fast path), C escapes otherwise."""
    from hlo.attrs import quote
    assert quote("jit(f)/mul") == '"jit(f)/mul"'
    assert quote("") == '""'
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    assert quote("x\ny\tz\x01\x1f") == '"x\\ny\\tz\\x01\\x1f"'
    assert quote("é\x7f") == '"é\x7f"'
