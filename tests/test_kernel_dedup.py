"""Kernels identical up to HLO names share one generated file (codegen/triton/canonical.py):
the canonical text, the key it gives, and (in Triton's interpreter) that each fusion sharing
a file still computes its own result."""
from __future__ import annotations

import os

import numpy as np
import pytest

from codegen.triton.canonical import canonical_text

SRC = '''"""k: from %fusion.1"""
import triton.language as tl


@triton.jit
def k(p0, out0, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    param_0_1_2 = tl.load(p0 + offs)  # %param_0.1 = f32[8] parameter(0)
    exp_7_3 = tl.exp(param_0_1_2)  # %exp.7
    sub_9_4 = exp_7_3 - param_0_1_2  # %sub.9
    tl.store(out0 + offs, sub_9_4, mask=offs < 8)
'''


def test_names_comments_and_docstring_do_not_count():
    other = (SRC.replace("%fusion.1", "%fusion.42").replace("param_0_1_2", "param_0_9_5")
             .replace("exp_7_3", "exponential_31_6").replace("sub_9_4", "subtract_12_7")
             .replace("# %exp.7", "# another comment"))
    assert other != SRC
    assert canonical_text(other) == canonical_text(SRC)
    # blank lines and a comment-only line change nothing either
    assert canonical_text(SRC.replace("    offs =", "\n    # note\n    offs =")) == \
        canonical_text(SRC)


def test_what_the_code_does_counts():
    swapped = SRC.replace("sub_9_4 = exp_7_3 - param_0_1_2", "sub_9_4 = param_0_1_2 - exp_7_3")
    assert canonical_text(swapped) != canonical_text(SRC)
    assert canonical_text(SRC.replace("offs < 8", "offs < 16")) != canonical_text(SRC)
    assert canonical_text(SRC.replace("tl.exp(", "tl.log(")) != canonical_text(SRC)
    # names the emitter does not make are compared as written: parameters, keyword
    # arguments, attributes
    assert canonical_text(SRC.replace("p0", "p1")) != canonical_text(SRC)
    assert canonical_text(SRC.replace("mask=", "other=")) != canonical_text(SRC)
    # two locals exchanged where they are used is another program
    two = SRC.replace("tl.store(out0 + offs, sub_9_4,", "tl.store(out0 + offs, exp_7_3,")
    assert canonical_text(two) != canonical_text(SRC)


def test_a_local_named_like_a_keyword_argument_keeps_the_keyword():
    src = "def f(x):\n    mask_1 = x > 0\n    return g(x, mask=mask_1)\n"
    text = canonical_text(src)
    assert "mask = $0" in text and "$0 = x > 0" in text


def test_text_that_does_not_tokenize_is_its_own_key():
    broken = "def f(x):\n    return (x\n"
    assert canonical_text(broken) == broken


def test_tuple_and_loop_targets_are_renamed():
    a = "def f(x):\n    for c0_1 in range(4):\n        lo_2, hi_3 = x, c0_1\n    return lo_2\n"
    b = a.replace("c0_1", "c0_7").replace("lo_2", "lo_8").replace("hi_3", "hi_9")
    assert canonical_text(a) == canonical_text(b)
    assert canonical_text(a) != canonical_text(a.replace("return lo_2", "return hi_3"))


# --- in Triton's interpreter: two fusions, one file -------------------------------------------
def _interpreted():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("runs Triton's interpreter on CPU tensors; skipped where CUDA is present")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    return torch


def _module(n: int = 1024):
    import hlo
    text = f"""HloModule m
%fa (a0: f32[{n}], a1: f32[{n}]) -> f32[{n}] {{
  %a0 = f32[{n}] parameter(0)
  %a1 = f32[{n}] parameter(1)
  %ac = f32[] constant(0.9)
  %ab = f32[{n}] broadcast(%ac), dimensions={{}}
  %am = f32[{n}] multiply(%ab, %a0)
  ROOT %as = f32[{n}] subtract(%am, %a1)
}}
%fb (b0: f32[{n}], b1: f32[{n}]) -> f32[{n}] {{
  %b0 = f32[{n}] parameter(0)
  %b1 = f32[{n}] parameter(1)
  %bc = f32[] constant(0.9)
  %bb = f32[{n}] broadcast(%bc), dimensions={{}}
  %bm = f32[{n}] multiply(%bb, %b0)
  ROOT %bs = f32[{n}] subtract(%bm, %b1)
}}
%fc (c0: f32[{n}], c1: f32[{n}]) -> f32[{n}] {{
  %c0 = f32[{n}] parameter(0)
  %c1 = f32[{n}] parameter(1)
  %cc = f32[] constant(0.8)
  %cb = f32[{n}] broadcast(%cc), dimensions={{}}
  %cm = f32[{n}] multiply(%cb, %c0)
  ROOT %cs = f32[{n}] subtract(%cm, %c1)
}}

ENTRY %main (x: f32[{n}], y: f32[{n}], z: f32[{n}]) -> (f32[{n}], f32[{n}], f32[{n}]) {{
  %x = f32[{n}] parameter(0)
  %y = f32[{n}] parameter(1)
  %z = f32[{n}] parameter(2)
  %f1 = f32[{n}] fusion(%x, %y), kind=kLoop, calls=%fa
  %f2 = f32[{n}] fusion(%z, %x), kind=kLoop, calls=%fb
  %f3 = f32[{n}] fusion(%x, %y), kind=kLoop, calls=%fc
  ROOT %t = (f32[{n}], f32[{n}], f32[{n}]) tuple(%f1, %f2, %f3)
}}
"""
    m = hlo.parse_hlo(text)
    return [i for i in m.entry.instructions if i.opcode == "fusion"]


def test_fusions_equal_but_for_names_share_one_kernel_and_each_computes_its_own(
        tmp_path, monkeypatch):
    torch = _interpreted()
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    from codegen.triton import compile_fusion
    f1, f2, f3 = _module()
    k1, k2, k3 = (compile_fusion(f, target="h200") for f in (f1, f2, f3))
    assert k1.key == k2.key and k1.path == k2.path and k1.source == k2.source
    assert k1.fn is k2.fn                        # one module, one JIT function
    assert "%fa" in k2.source                    # the first fusion's file, its names
    assert k2.fusion_name == "f2"                # the kernel itself is still f2's
    assert k3.key != k1.key and k3.path != k1.path     # another constant: another kernel
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(1024).astype(np.float32) for _ in range(3))
    got = []
    for k, (a, b) in zip((k1, k2, k3), ((x, y), (z, x), (x, y))):
        out = torch.full((1024,), float("nan"))
        k.launch([out], [torch.from_numpy(a), torch.from_numpy(b)])
        got.append(out.numpy())
    np.testing.assert_allclose(got[0], np.float32(0.9) * x - y, rtol=1e-6)
    np.testing.assert_allclose(got[1], np.float32(0.9) * z - x, rtol=1e-6)
    np.testing.assert_allclose(got[2], np.float32(0.8) * x - y, rtol=1e-6)


def test_a_new_process_finds_the_shared_file(tmp_path, monkeypatch):
    """The second fusion's key names the first one's file in a later process too (the file
    is read back, not regenerated), so warm processes share it the same way."""
    _interpreted()
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    from codegen.triton import compile_fusion
    f1, f2, _ = _module(512)
    first = compile_fusion(f2, target="h200")     # this time f2 writes the file
    again = compile_fusion(f1, target="h200")
    assert again.path == first.path and "%fb" in again.source and again.fusion_name == "f1"


# --- one build's memo: one generation per distinct fused computation (issue 13) ----------------
def _counting_generation(monkeypatch) -> list:
    from codegen.triton import kernel as kernel_mod
    made: list = []
    real = kernel_mod._generate_kernel

    def counted(fusion_inst, *a, **k):
        made.append(fusion_inst.name)
        return real(fusion_inst, *a, **k)
    monkeypatch.setattr(kernel_mod, "_generate_kernel", counted)
    return made


def test_a_build_memo_generates_each_distinct_fusion_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    from codegen.triton import compile_fusion
    f1, f2, f3 = _module()
    alone = compile_fusion(f2, target="h200")          # no memo: generated from f2 itself
    made = _counting_generation(monkeypatch)
    memo: dict = {}
    k1, k2, k3 = (compile_fusion(f, target="h200", memo=memo) for f in (f1, f2, f3))
    # f2 is f1 renamed (%fb for %fa): f1's generated kernel; f3's constant is 0.8, not 0.9
    assert made == ["f1", "f3"] and len(memo) == 2
    assert (k2.key, k2.path, k2.source) == (alone.key, alone.path, alone.source) \
        == (k1.key, k1.path, k1.source)
    assert (k2.template, k2.config, k2.plan.config, k2.plan.candidates, k2.grid) == \
        (alone.template, alone.config, alone.plan.config, alone.plan.candidates, alone.grid)
    assert k2.fusion_name == "f2" and k1.fusion_name == "f1"        # each still its own
    assert k2.plan is not k1.plan and k2.config is not k1.config   # nothing shared to mutate
    assert k3.key != k1.key and k3.path != k1.path
    assert "0.800000011920929" in k3.source and "0.800000011920929" not in k1.source


def test_a_build_memo_generates_again_for_any_change_the_kernel_could_see(tmp_path,
                                                                          monkeypatch):
    import hlo
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    from codegen.triton import compile_fusion
    base = _module()[0]
    text = base.parent.parent.to_text()
    variants = {
        "operands swapped": text.replace("subtract(%am, %a1)", "subtract(%a1, %am)"),
        "another shape": text.replace("f32[1024]", "f32[2048]"),
        "another opcode": text.replace("multiply(%ab, %a0)", "add(%ab, %a0)"),
        "another constant bit": text.replace("constant(0.9)", "constant(0.90000004)", 1),
        # the same computation, its instructions listed in another (valid) order: the
        # templates read the list in order, so the memo does not assume it is the same
        "another order": text.replace(
            "  %ac = f32[] constant(0.9)\n  %ab = f32[1024] broadcast(%ac), dimensions={}\n"
            "  %am = f32[1024] multiply(%ab, %a0)\n",
            "  %ac = f32[] constant(0.9)\n  %ab = f32[1024] broadcast(%ac), dimensions={}\n"
            "  %am = f32[1024] multiply(%ab, %a0)\n", 1).replace(
            "  %a0 = f32[1024] parameter(0)\n  %a1 = f32[1024] parameter(1)\n",
            "  %a1 = f32[1024] parameter(1)\n  %a0 = f32[1024] parameter(0)\n", 1),
    }
    made = _counting_generation(monkeypatch)
    memo: dict = {}
    compile_fusion(base, target="h200", memo=memo)
    for what, t in variants.items():
        assert t != text, what
        f = next(i for i in hlo.parse_hlo(t).entry.instructions if i.name == "f1")
        compile_fusion(f, target="h200", memo=memo)
        assert made[-1] == "f1" and len(made) == len(memo), what
    assert len(memo) == 1 + len(variants)
    # and a different target is another kernel too (the cost model's, the key's)
    compile_fusion(base, target="h100", memo=memo)
    assert len(memo) == 2 + len(variants)


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["0", "1"])
def test_gpu_optimizer_step_shares_kernels_and_equals_jax(tmp_path, monkeypatch, level):
    """An Adam-like update of four same-sized arrays and one other: the four fusions run one
    kernel (one file, one JIT function), and every output equals jax.jit's."""
    # Triton's kernels are the subject: small loop kernels would be CUDA C under the
    # default HLOTK_LOOP_EMITTER=auto (codegen/cuda_c).
    monkeypatch.setenv("HLOTK_LOOP_EMITTER", "triton")
    import jax
    import jax.numpy as jnp

    import runtime
    from runtime.cuda import executable_of
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOTK_AUTOTUNE", level)

    def step(params, grads, m):
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        params = jax.tree_util.tree_map(lambda p, m: p - 1e-3 * m / (jnp.abs(m) + 1e-8),
                                        params, m)
        return params, m
    rng = np.random.default_rng(1)
    shapes = {"a": (3072,), "b": (3072,), "c": (3072,), "d": (3072,), "e": (1000, 7)}
    tree = lambda: {k: rng.standard_normal(s).astype(np.float32)  # noqa: E731
                    for k, s in shapes.items()}
    args = (tree(), tree(), tree())
    c = runtime.jit(step, backend="cuda").lower(*args).compile()
    got = c(*args)
    want = jax.jit(step)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=1e-7)
    kernels = executable_of(c)._triton_kernels()
    by_size = {}
    for k in kernels:
        by_size.setdefault(k.output_shapes[0].dims, set()).add(str(k.path))
    assert len(kernels) >= 5 and len(by_size[(3072,)]) == 1, by_size
    again = c(*args)                  # the captured graph's replay: the same numbers
    for g, w in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# --- the tokenizer canonical_text reads generated source with --------------------------------
def _tokenize_tokens(source: str) -> list:
    import io
    import tokenize
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER)
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in skip]


EDGE_SOURCES = [
    SRC,
    '"""doc\nover lines"""\nx = (1,\n     2)  # c\n\n# top comment\ndef f(a):\n'
    '    if a:\n        # inner comment\n        return a\n    b = [a,\n  # in brackets\n'
    '         .5, 1e-3, 0x1F, 1_000, 2j, ...]\n    return b\n',
    'x = "a\\"b" + \'c\\\\d\' + f"{x!r}" + rb"\\x00"\ny = """one""" ; z = \'\'\'t\nu\'\'\' + x\n',
    'def g():\n    return """a\n  b""".strip()\n\n\n',
    'a = {1: [2, (3,\n 4)],\n}\nb = a[1][0] ** 2 // 3 >> 1 -> 2 if a != b else a @ b\n',
    'class C:\n    def m(self):\n        pass\n  # dedented comment\n    x = 1\ny = 2\n',
]
# Read by tokenize itself (the fast path declines): tabs, a backslash continuation, a string
# continued by a backslash, no final newline, a stray character, an unclosed bracket.
FALLBACK_SOURCES = ['def f():\n\treturn 1\n', 'x = 1 + \\\n    2\n', 'x = "a\\\nb"\n',
                    'x = 1', 'x = 1 $ 2\n', 'x = (1,\n']


@pytest.mark.parametrize("k", range(len(EDGE_SOURCES)))
def test_fast_tokens_are_tokenize_tokens(k):
    from codegen.triton.canonical import _fast_tokens
    src = EDGE_SOURCES[k]
    fast = _fast_tokens(src)
    assert fast is not None
    assert fast == _tokenize_tokens(src)


@pytest.mark.parametrize("k", range(len(FALLBACK_SOURCES)))
def test_what_the_fast_tokenizer_declines_goes_to_tokenize(k):
    import tokenize

    from codegen.triton.canonical import _fast_tokens, _tokens
    src = FALLBACK_SOURCES[k]
    assert _fast_tokens(src) is None
    try:
        want = _tokenize_tokens(src)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        assert canonical_text(src) == src
        return
    assert _tokens(src) == want


def _kernel_programs() -> list:
    """Small programs whose fusions take the loop, reduction, normalization and GEMM
    templates (an optimizer step, softmax, layer norm, a bias + GELU matmul, a column sum
    of a transposed product)."""
    import jax
    import jax.numpy as jnp
    r = np.random.default_rng(0)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    bf = lambda *s: f(*s).astype(jnp.bfloat16)  # noqa: E731

    def adam(p, g, m, v):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v

    def layernorm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        d = x - mu
        return d * jax.lax.rsqrt((d * d).mean(-1, keepdims=True) + 1e-5) * g + b
    return [(adam, (f(256, 64), f(256, 64), f(256, 64), f(256, 64))),
            (lambda x: jax.nn.softmax(x, -1), (f(64, 128),)),
            (layernorm, (f(64, 256), f(256), f(256))),
            (lambda x, w, b: jax.nn.gelu(x @ w + b), (bf(128, 256), bf(256, 128), bf(128))),
            (lambda x, w: (x @ w).T.sum(0), (f(64, 32), f(32, 48)))]


def test_fast_tokens_on_every_generated_kernel(tmp_path, monkeypatch):
    """Every kernel the Triton generators write for programs of each template tokenizes the
    same both ways, and its canonical text is what tokenize's tokens give."""
    _interpreted()
    import runtime
    from codegen.triton import canonical
    monkeypatch.setenv("HLOTK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HLOTK_COMPILE_CACHE", "0")
    for fn, args in _kernel_programs():
        runtime.jit(fn, backend="cuda", target="h200").lower(*args).compile()
    files = sorted(tmp_path.rglob("*.py"))
    assert len(files) >= 4          # (the f32 matmuls are cuBLAS calls: no kernel)
    for f in files:
        src = f.read_text()
        fast = canonical._fast_tokens(src)
        assert fast is not None, f.name
        assert fast == _tokenize_tokens(src), f.name
        with monkeypatch.context() as m:
            m.setattr(canonical, "_fast_tokens", lambda s: None)
            slow_text = canonical.canonical_text(src)
        assert canonical.canonical_text(src) == slow_text, f.name
