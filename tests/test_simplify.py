"""Each simplification rule, shown as HLO text before and after, and checked by evaluation."""
import numpy as np
import pytest

import hlo
from passes import make_pass, run_pipeline
from passes.simplify import SIMPLIFY_RULES, simplify_with_stats


def entry_lines(m: hlo.Module) -> list[str]:
    """The entry's instructions as ``name = opcode(operands) attrs`` without shapes/metadata."""
    out = []
    for i in m.entry.instructions:
        if i.opcode == "parameter":
            continue
        text = i.to_text(print_metadata=False).strip()
        text = text.replace("ROOT ", "")
        out.append(text)
    return out


def module(params: str, body: str, root_shape: str) -> str:
    sig = ", ".join(f"p{k}: {s}" for k, s in enumerate(params.split(";"))) if params else ""
    decl = "\n".join(f"  %p{k} = {s} parameter({k})" for k, s in enumerate(params.split(";"))) if params else ""
    return f"""HloModule t

%add (lhs: f32[], rhs: f32[]) -> f32[] {{
  %lhs = f32[] parameter(0)
  %rhs = f32[] parameter(1)
  ROOT %sum = f32[] add(%lhs, %rhs)
}}

ENTRY %main ({sig}) -> {root_shape} {{
{decl}
{body}
}}
"""


def rewrite(text: str, passes: str = "simplify,dce"):
    before = hlo.parse_hlo(text)
    after = hlo.parse_hlo(text)
    run_pipeline(after, passes, verify=True)
    return before, after


def random_args(m: hlo.Module, seed: int = 0):
    rng = np.random.RandomState(seed)
    args = []
    for p in m.entry.parameters:
        if p.shape.dtype.is_integer:
            args.append(rng.randint(-50, 50, p.shape.dims).astype(p.shape.dtype.np_dtype))
        else:
            args.append(rng.randn(*p.shape.dims).astype(p.shape.dtype.np_dtype))
    return args


CASES = [
    # (rule, params, body, root shape, expected entry lines after)
    ("add-zero", "f32[4]{0}",
     "  %z = f32[] constant(0)\n  %bz = f32[4]{0} broadcast(%z), dimensions={}\n"
     "  ROOT %r = f32[4]{0} add(%p0, %bz)", "f32[4]",
     []),
    ("multiply-one", "f32[4]{0}",
     "  %o = f32[4]{0} constant({1, 1, 1, 1})\n  %n = f32[4]{0} negate(%p0)\n"
     "  ROOT %r = f32[4]{0} multiply(%o, %n)", "f32[4]",
     ["%n = f32[4]{0} negate(%p0)"]),
    ("subtract-self-int", "s32[3]{0}",
     "  ROOT %r = s32[3]{0} subtract(%p0, %p0)", "s32[3]",
     ["%constant = s32[] constant(0)", "%broadcast = s32[3]{0} broadcast(%constant), dimensions={}"]),
    ("double-negation", "f32[4]{0}",
     "  %n1 = f32[4]{0} negate(%p0)\n  %n2 = f32[4]{0} negate(%n1)\n"
     "  ROOT %r = f32[4]{0} exponential(%n2)", "f32[4]",
     ["%r = f32[4]{0} exponential(%p0)"]),
    ("convert-same-type", "f32[4]{0}",
     "  %c = f32[4]{0} convert(%p0)\n  ROOT %r = f32[4]{0} sine(%c)", "f32[4]",
     ["%r = f32[4]{0} sine(%p0)"]),
    ("reshape-fold", "f32[2,6]{1,0}",
     "  %a = f32[12]{0} reshape(%p0)\n  %b = f32[3,4]{1,0} reshape(%a)\n"
     "  ROOT %r = f32[3,4]{1,0} tanh(%b)", "f32[3,4]",
     ["%reshape = f32[3,4]{1,0} reshape(%p0)", "%r = f32[3,4]{1,0} tanh(%reshape)"]),
    ("reshape-of-broadcast", "f32[16]{0}",
     "  %a = f32[1,16]{1,0} broadcast(%p0), dimensions={1}\n"
     "  %b = f32[16]{0} reshape(%a)\n"
     "  %c = f32[4,16]{1,0} broadcast(%b), dimensions={1}\n"
     "  ROOT %r = f32[4,16]{1,0} abs(%c)", "f32[4,16]",
     ["%broadcast.1 = f32[4,16]{1,0} broadcast(%p0), dimensions={1}",
      "%r = f32[4,16]{1,0} abs(%broadcast.1)"]),
    ("transpose-fold", "f32[2,3,4]{2,1,0}",
     "  %a = f32[3,2,4]{2,1,0} transpose(%p0), dimensions={1,0,2}\n"
     "  %b = f32[2,3,4]{2,1,0} transpose(%a), dimensions={1,0,2}\n"
     "  ROOT %r = f32[2,3,4]{2,1,0} abs(%b)", "f32[2,3,4]",
     ["%r = f32[2,3,4]{2,1,0} abs(%p0)"]),
    ("broadcast-fold", "f32[3]{0}",
     "  %a = f32[3,4]{1,0} broadcast(%p0), dimensions={0}\n"
     "  %b = f32[2,3,4]{2,1,0} broadcast(%a), dimensions={1,2}\n"
     "  ROOT %r = f32[2,3,4]{2,1,0} abs(%b)", "f32[2,3,4]",
     ["%broadcast = f32[2,3,4]{2,1,0} broadcast(%p0), dimensions={1}",
      "%r = f32[2,3,4]{2,1,0} abs(%broadcast)"]),
    ("slice-fold", "f32[20]{0}",
     "  %a = f32[8]{0} slice(%p0), slice={[2:18:2]}\n"
     "  %b = f32[3]{0} slice(%a), slice={[1:7:2]}\n"
     "  ROOT %r = f32[3]{0} abs(%b)", "f32[3]",
     ["%slice = f32[3]{0} slice(%p0), slice={[4:13:4]}", "%r = f32[3]{0} abs(%slice)"]),
    ("select-constant-pred", "f32[4]{0};f32[4]{0}",
     "  %t = pred[] constant(false)\n  %bt = pred[4]{0} broadcast(%t), dimensions={}\n"
     "  ROOT %r = f32[4]{0} select(%bt, %p0, %p1)", "f32[4]",
     []),
    ("pad-noop", "f32[4]{0}",
     "  %z = f32[] constant(0)\n  %p = f32[4]{0} pad(%p0, %z), padding=0_0\n"
     "  ROOT %r = f32[4]{0} abs(%p)", "f32[4]",
     ["%r = f32[4]{0} abs(%p0)"]),
    ("concatenate-fold", "f32[4]{0}",
     "  %c = f32[4]{0} concatenate(%p0), dimensions={0}\n  ROOT %r = f32[4]{0} abs(%c)", "f32[4]",
     ["%r = f32[4]{0} abs(%p0)"]),
    ("dot-transposed-operand", "f32[8,4]{1,0};f32[8,3]{1,0}",
     "  %t = f32[4,8]{1,0} transpose(%p0), dimensions={1,0}\n"
     "  ROOT %d = f32[4,3]{1,0} dot(%t, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
     "f32[4,3]",
     ["%dot = f32[4,3]{1,0} dot(%p0, %p1), lhs_contracting_dims={0}, rhs_contracting_dims={0}"]),
    ("reduce-size-one-dims", "f32[4,1]{1,0}",
     "  %z = f32[] constant(0)\n"
     "  ROOT %r = f32[4]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add", "f32[4]",
     ["%reshape = f32[4]{0} reshape(%p0)"]),
    ("subtract-zero", "f32[4]{0}",
     "  %z = f32[] constant(0)\n  %bz = f32[4]{0} broadcast(%z), dimensions={}\n"
     "  %s = f32[4]{0} subtract(%p0, %bz)\n  ROOT %r = f32[4]{0} abs(%s)", "f32[4]",
     ["%r = f32[4]{0} abs(%p0)"]),
    ("multiply-zero-int", "s32[4]{0}",
     "  %z = s32[4]{0} constant({0, 0, 0, 0})\n  ROOT %r = s32[4]{0} multiply(%p0, %z)", "s32[4]",
     ["%constant = s32[] constant(0)", "%broadcast = s32[4]{0} broadcast(%constant), dimensions={}"]),
    ("divide-one", "f32[4]{0}",
     "  %o = f32[] constant(1)\n  %bo = f32[4]{0} broadcast(%o), dimensions={}\n"
     "  %d = f32[4]{0} divide(%p0, %bo)\n  ROOT %r = f32[4]{0} sqrt(%d)", "f32[4]",
     ["%r = f32[4]{0} sqrt(%p0)"]),
    ("and-or-identity", "pred[4]{0}",
     "  %t = pred[] constant(true)\n  %bt = pred[4]{0} broadcast(%t), dimensions={}\n"
     "  %a = pred[4]{0} and(%p0, %bt)\n  ROOT %r = pred[4]{0} not(%a)", "pred[4]",
     ["%r = pred[4]{0} not(%p0)"]),
    ("reverse-size-one", "f32[1,4]{1,0}",
     "  %v = f32[1,4]{1,0} reverse(%p0), dimensions={0}\n  ROOT %r = f32[1,4]{1,0} abs(%v)",
     "f32[1,4]", ["%r = f32[1,4]{1,0} abs(%p0)"]),
    ("copy-noop", "f32[4]{0}",
     "  %c = f32[4]{0} copy(%p0)\n  ROOT %r = f32[4]{0} abs(%c)", "f32[4]",
     ["%r = f32[4]{0} abs(%p0)"]),
    ("max-min-identity", "f32[4]{0}",
     "  %ninf = f32[] constant(-inf)\n  %b = f32[4]{0} broadcast(%ninf), dimensions={}\n"
     "  %m = f32[4]{0} maximum(%b, %p0)\n  ROOT %r = f32[4]{0} exponential(%m)", "f32[4]",
     ["%r = f32[4]{0} exponential(%p0)"]),
    ("max-min-self", "f32[4]{0}",
     "  %m = f32[4]{0} maximum(%p0, %p0)\n  ROOT %r = f32[4]{0} abs(%m)", "f32[4]",
     ["%r = f32[4]{0} abs(%p0)"]),
    # --- size-1 dims (passes/degenerate_dims.py) ---
    ("transpose-of-size-one-dims", "f32[4,1,5]{2,1,0}",
     "  ROOT %t = f32[1,4,5]{2,1,0} transpose(%p0), dimensions={1,0,2}", "f32[1,4,5]",
     ["%reshape = f32[1,4,5]{2,1,0} reshape(%p0)"]),
    ("transpose-of-degenerate-reshape", "f32[4,5]{1,0}",
     "  %r = f32[4,1,5]{2,1,0} reshape(%p0)\n"
     "  ROOT %t = f32[5,1,4]{2,1,0} transpose(%r), dimensions={2,1,0}", "f32[5,1,4]",
     ["%transpose = f32[5,4]{1,0} transpose(%p0), dimensions={1,0}",
      "%reshape = f32[5,1,4]{2,1,0} reshape(%transpose)"]),
    ("dot-size-one-dims", "f32[2,1,3,4]{3,2,1,0};f32[2,1,4,5]{3,2,1,0}",
     "  ROOT %d = f32[2,3,5]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, rhs_batch_dims={0}, "
     "lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}", "f32[2,3,5]",
     ["%reshape = f32[2,3,4]{2,1,0} reshape(%p0)", "%reshape.1 = f32[2,4,5]{2,1,0} reshape(%p1)",
      "%dot = f32[2,3,5]{2,1,0} dot(%reshape, %reshape.1), lhs_batch_dims={0}, "
      "lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}"]),
    ("elementwise-of-degenerate-reshapes", "f32[4,5]{1,0};f32[5]{0}",
     "  %r = f32[1,4,5]{2,1,0} reshape(%p0)\n"
     "  %b = f32[1,4,5]{2,1,0} broadcast(%p1), dimensions={2}\n"
     "  %m = f32[1,4,5]{2,1,0} multiply(%r, %b)\n"
     "  ROOT %n = f32[1,4,5]{2,1,0} negate(%m)", "f32[1,4,5]",
     ["%broadcast = f32[4,5]{1,0} broadcast(%p1), dimensions={1}",
      "%multiply = f32[4,5]{1,0} multiply(%p0, %broadcast)",
      "%negate = f32[4,5]{1,0} negate(%multiply)",
      "%reshape.1 = f32[1,4,5]{2,1,0} reshape(%negate)"]),
    ("reduce-of-degenerate-reshape", "f32[4,5]{1,0}",
     "  %r = f32[1,4,5]{2,1,0} reshape(%p0)\n  %z = f32[] constant(0)\n"
     "  ROOT %s = f32[1,4]{1,0} reduce(%r, %z), dimensions={2}, to_apply=%add", "f32[1,4]",
     ["%z = f32[] constant(0)", "%reduce = f32[4]{0} reduce(%p0, %z), dimensions={1}, "
      "to_apply=%add", "%reshape = f32[1,4]{1,0} reshape(%reduce)"]),
    ("broadcast-of-degenerate-reshape", "f32[4]{0}",
     "  %r = f32[1,4]{1,0} reshape(%p0)\n"
     "  ROOT %b = f32[1,4,6]{2,1,0} broadcast(%r), dimensions={0,1}", "f32[1,4,6]",
     ["%broadcast = f32[1,4,6]{2,1,0} broadcast(%p0), dimensions={1}"]),
    # --- transposes moved toward consumers (passes/transpose_sinking.py) ---
    ("elementwise-of-transposes", "f32[4,5,6]{2,1,0};f32[4]{0}",
     "  %t = f32[5,4,6]{2,1,0} transpose(%p0), dimensions={1,0,2}\n"
     "  %b = f32[5,4,6]{2,1,0} broadcast(%p1), dimensions={1}\n"
     "  ROOT %m = f32[5,4,6]{2,1,0} multiply(%t, %b)", "f32[5,4,6]",
     ["%broadcast = f32[4,5,6]{2,1,0} broadcast(%p1), dimensions={0}",
      "%multiply = f32[4,5,6]{2,1,0} multiply(%p0, %broadcast)",
      "%transpose = f32[5,4,6]{2,1,0} transpose(%multiply), dimensions={1,0,2}"]),
    ("reduce-of-transpose", "f32[4,5,6]{2,1,0}",
     "  %t = f32[5,4,6]{2,1,0} transpose(%p0), dimensions={1,0,2}\n  %z = f32[] constant(0)\n"
     "  ROOT %s = f32[5,4]{1,0} reduce(%t, %z), dimensions={2}, to_apply=%add", "f32[5,4]",
     ["%z = f32[] constant(0)", "%reduce = f32[4,5]{1,0} reduce(%p0, %z), dimensions={2}, "
      "to_apply=%add", "%transpose = f32[5,4]{1,0} transpose(%reduce), dimensions={1,0}"]),
    ("dot-of-transpose-reordering-free-dims", "f32[2,3,4,5]{3,2,1,0};f32[5,7]{1,0}",
     "  %t = f32[3,2,4,5]{3,2,1,0} transpose(%p0), dimensions={1,0,2,3}\n"
     "  ROOT %d = f32[3,2,4,7]{3,2,1,0} dot(%t, %p1), lhs_contracting_dims={3}, "
     "rhs_contracting_dims={0}", "f32[3,2,4,7]",
     ["%dot = f32[2,3,4,7]{3,2,1,0} dot(%p0, %p1), lhs_contracting_dims={3}, "
      "rhs_contracting_dims={0}",
      "%transpose = f32[3,2,4,7]{3,2,1,0} transpose(%dot), dimensions={1,0,2,3}"]),
    ("onehot-scatter", "s32[3,1,1]{2,1,0};f32[3,1]{1,0}",
     "  %z = f32[] constant(0)\n  %b = f32[3,4]{1,0} broadcast(%z), dimensions={}\n"
     "  ROOT %s = f32[3,4]{1,0} scatter(%b, %p0, %p1), update_window_dims={}, "
     "inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, input_batching_dims={0}, "
     "scatter_indices_batching_dims={0}, index_vector_dim=2, to_apply=%add", "f32[3,4]",
     ["%z = f32[] constant(0)", "%b = f32[3,4]{1,0} broadcast(%z), dimensions={}",
      "%iota = s32[3,4] iota(), iota_dimension=1", "%reshape = s32[3] reshape(%p0)",
      "%broadcast = s32[3,4] broadcast(%reshape), dimensions={0}",
      "%compare = pred[3,4] compare(%iota, %broadcast), direction=EQ",
      "%reshape.1 = f32[3] reshape(%p1)",
      "%broadcast.1 = f32[3,4] broadcast(%reshape.1), dimensions={0}",
      "%add = f32[3,4]{1,0} add(%b, %broadcast.1)",
      "%select = f32[3,4]{1,0} select(%compare, %add, %b)"]),
    ("static-dimension-size", "f32[3,7]{1,0}",
     "  ROOT %r = s32[] get-dimension-size(%p0), dimensions={1}", "s32[]",
     ["%constant = s32[] constant(7)"]),
]


@pytest.mark.parametrize("rule,params,body,root_shape,expected", CASES, ids=[c[0] for c in CASES])
def test_rule_rewrites_text_and_preserves_value(rule, params, body, root_shape, expected):
    text = module(params, body, root_shape)
    m = hlo.parse_hlo(text)
    changed, stats = simplify_with_stats(m)
    assert changed and stats[rule] >= 1, stats
    make_pass("dce").run(m)
    hlo.verify(m)
    lines = [l for l in entry_lines(m)]
    assert lines == expected
    original = hlo.parse_hlo(text)
    args = random_args(original)
    np.testing.assert_array_equal(hlo.evaluate(m, args), hlo.evaluate(original, args))


def test_every_rule_has_a_case():
    # convert-of-widening-convert has its own test below (it needs a narrowing counter-case).
    assert {r.name for r in SIMPLIFY_RULES} - {c[0] for c in CASES} == {"convert-of-widening-convert"}


def test_transposes_that_move_the_last_dim_stay_put():
    # a softmax over a key axis the program transposed to the end: moving the transpose
    # below the reduction would make it reduce a middle dim
    text = module("f32[4,6,5]{2,1,0}",
                  "  %t = f32[4,5,6]{2,1,0} transpose(%p0), dimensions={0,2,1}\n"
                  "  %z = f32[] constant(0)\n"
                  "  ROOT %s = f32[4,5]{1,0} reduce(%t, %z), dimensions={2}, to_apply=%add",
                  "f32[4,5]")
    m = hlo.parse_hlo(text)
    _, stats = simplify_with_stats(m)
    assert stats["reduce-of-transpose"] == 0 and m.entry.root.operands[0].opcode == "transpose"


def test_degenerate_dot_rule_keeps_matrix_vector_products():
    # [4,3]·[3,1]: dropping the size-1 free dim would leave a matrix-vector product, which
    # kernels and library calls are not asked to take
    text = module("f32[4,3]{1,0};f32[3,1]{1,0}",
                  "  ROOT %d = f32[4,1]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, "
                  "rhs_contracting_dims={0}", "f32[4,1]")
    m = hlo.parse_hlo(text)
    _, stats = simplify_with_stats(m)
    assert stats["dot-size-one-dims"] == 0 and m.entry.root.opcode == "dot"


def test_float_x_minus_x_is_not_folded():
    # NaN - NaN is NaN and inf - inf is NaN, so x - x -> 0 is only valid for integers.
    m = hlo.parse_hlo(module("f32[3]{0}", "  ROOT %r = f32[3]{0} subtract(%p0, %p0)", "f32[3]"))
    changed, _ = simplify_with_stats(m)
    assert not changed


def test_widening_convert_chain():
    text = module("s8[4]{0}", "  %a = s32[4]{0} convert(%p0)\n  ROOT %r = f32[4]{0} convert(%a)",
                  "f32[4]")
    m = hlo.parse_hlo(text)
    run_pipeline(m, "simplify,dce", verify=True)
    assert entry_lines(m) == ["%convert = f32[4]{0} convert(%p0)"]
    # Narrowing in the middle must stay: f32 -> s8 -> f32 truncates.
    text2 = module("f32[4]{0}", "  %a = s8[4]{0} convert(%p0)\n  ROOT %r = f32[4]{0} convert(%a)",
                   "f32[4]")
    m2 = hlo.parse_hlo(text2)
    changed, _ = simplify_with_stats(m2)
    assert not changed


def test_constant_folding_respects_size_limit():
    text = module("", "  %a = f32[] constant(2)\n  %b = f32[] constant(3)\n"
                      "  %m = f32[] multiply(%a, %b)\n"
                      "  %big = f32[4096]{0} broadcast(%m), dimensions={}\n"
                      "  ROOT %r = f32[4096]{0} exponential(%big)", "f32[4096]")
    m = hlo.parse_hlo(text)
    run_pipeline(m, "constant-folding{max_elements=100},dce", verify=True)
    lines = entry_lines(m)
    assert lines[0].startswith("%m") and "constant(6)" in lines[0]
    assert any("exponential" in l for l in lines)   # 4096 elements > limit: left alone
    np.testing.assert_allclose(hlo.evaluate(m, []), np.exp(np.full(4096, 6, np.float32)), rtol=1e-6)


def test_inline_calls_then_tuple_simplify():
    text = """HloModule t

%inner (x: f32[4]) -> (f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %n = f32[4]{0} negate(%x)
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%x, %n)
}

ENTRY %main (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %c = (f32[4]{0}, f32[4]{0}) call(%p0), to_apply=%inner
  %g = f32[4]{0} get-tuple-element(%c), index=1
  ROOT %r = f32[4]{0} exponential(%g)
}
"""
    m = hlo.parse_hlo(text)
    run_pipeline(m, "inline,tuple-simplify,dce", verify=True)
    assert len(m.computations) == 1
    # Inlined instructions get fresh names (the callee's names were taken when they were copied).
    assert entry_lines(m) == ["%n.1 = f32[4]{0} negate(%p0)", "%r = f32[4]{0} exponential(%n.1)"]


CF = """HloModule t

%then (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %e = f32[4]{0} exponential(%x)
}

%else (y: f32[4]) -> f32[4] {
  %y = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%y)
}

%cond (s: (s32[], f32[4], f32[4])) -> pred[] {
  %s = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %lim = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %lim), direction=LT
}

%body (b: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {
  %b = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %bi = s32[] get-tuple-element(%b), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%bi, %one)
  %acc = f32[4]{0} get-tuple-element(%b), index=1
  %acc2 = f32[4]{0} add(%acc, %acc)
  %junk = f32[4]{0} get-tuple-element(%b), index=2
  %junk2 = f32[4]{0} sine(%junk)
  ROOT %out = (s32[], f32[4]{0}, f32[4]{0}) tuple(%next, %acc2, %junk2)
}

ENTRY %main (p0: f32[4], p1: f32[4]) -> (f32[4], f32[4]) {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %k = pred[] constant(true)
  %c = f32[4]{0} conditional(%k, %p0, %p1), true_computation=%then, false_computation=%else
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}, f32[4]{0}) tuple(%zero, %p0, %p1)
  %w = (s32[], f32[4]{0}, f32[4]{0}) while(%init), condition=%cond, body=%body
  %res = f32[4]{0} get-tuple-element(%w), index=1
  ROOT %r = (f32[4]{0}, f32[4]{0}) tuple(%c, %res)
}
"""


def test_control_flow_simplify_constant_pred_and_unused_loop_state():
    m = hlo.parse_hlo(CF)
    original = hlo.parse_hlo(CF)
    run_pipeline(m, "control-flow-simplify,inline,dce", verify=True)
    lines = entry_lines(m)
    assert not any("conditional" in l for l in lines)
    assert any(l.startswith("%e.1 = f32[4]{0} exponential(%p0)") for l in lines)
    w = next(i for i in m.entry.instructions if i.opcode == "while")
    assert w.shape.to_text(print_layout=False) == "(s32[], f32[4])"   # the sine state is gone
    body = w.attrs["body"]
    assert not any(i.opcode == "sine" for i in body.instructions)
    args = random_args(original)
    for got, want in zip(hlo.evaluate(m, args), hlo.evaluate(original, args)):
        np.testing.assert_array_equal(got, want)


def test_zero_trip_while_is_removed():
    text = CF.replace("%lim = s32[] constant(3)\n  ROOT %lt = pred[] compare(%i, %lim), direction=LT",
                      "ROOT %f = pred[] constant(false)")
    m = hlo.parse_hlo(text)
    run_pipeline(m, "control-flow-simplify,tuple-simplify,dce", verify=True)
    assert not any(i.opcode == "while" for i in m.entry.instructions)
    res = m.entry.root.operands[1]
    assert res.opcode == "parameter" and res.name == "p0"
