"""Fusion: kernel counts on the GPU benchmark programs (deviceless, target h100), results
on small instances, legality reasons, the cost model, policies, text format, explanations."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo
from benchmarks.fusion_programs import PROGRAMS, XLA_GPU_TRANSFORMER_KERNELS
from hlo import builder  # noqa: F401
from hlo.errors import HlotkError
from hlo.shape import array
from passes import run_pipeline
from passes.fusion import (Fusion, count_kernels, fusion_kind, get_device, predict,
                           report_for)
from passes.fusion.cost_model import DeviceSpecError, estimate_kernel
from passes.fusion.pass_ import with_target

PREP = "inline,fixpoint(simplify,cse,dce)"


def compile_deviceless(name: str, policy: str = "priority", target: str = "h100") -> hlo.Module:
    fn, args, _, _ = PROGRAMS[name]
    m = hlo.from_jax(fn, *args)
    run_pipeline(m, f"{PREP},fusion{{target={target},policy={policy}}}", verify=True)
    return m


def fusions(m: hlo.Module) -> list:
    return [i for i in m.entry.instructions if i.opcode == "fusion"]


# --- what must hold -------------------------------------------------------------------------
def test_softmax_is_one_triton_kernel():
    m = compile_deviceless("softmax_f32")
    assert count_kernels(m) == 1
    (f,) = fusions(m)
    assert fusion_kind(f) == "normalization"
    assert 'kind=kCustom' in f.to_text() and '"__triton"' in f.to_text()
    # Reads the input once and writes the result once: 2 x 8192 x 4096 x 4 bytes.
    assert predict(f, "h100").bytes_moved == 2 * 8192 * 4096 * 4


def test_layer_norm_is_one_kernel():
    m = compile_deviceless("layernorm_bf16")
    assert count_kernels(m) == 1
    assert fusion_kind(fusions(m)[0]) == "normalization"
    # x once (bf16), gamma and beta (bf16), the bf16 result.
    assert predict(m, "h100").bytes_moved == 2 * 8192 * 4096 * 2 + 2 * 4096 * 2


def test_int8_gemm_is_one_gemm_fusion():
    m = compile_deviceless("int8_gemm")
    assert count_kernels(m) == 1
    (f,) = fusions(m)
    assert fusion_kind(f) == "gemm"
    ops = {i.opcode for i in f.attrs["calls"].instructions}
    assert {"convert", "dot", "multiply", "negate"} <= ops
    # The s8 operand is read as s8 (the convert is a prologue): 1024*512*1 + 512*2048*2 in,
    # 1024*2048*2 out.
    assert predict(f).bytes_read == 1024 * 512 + 512 * 2048 * 2
    assert predict(f).bytes_written == 1024 * 2048 * 2


def test_plain_dot_stays_a_library_call():
    m = hlo.from_jax(lambda a, b: a @ b, jax.ShapeDtypeStruct((256, 256), jnp.bfloat16),
                     jax.ShapeDtypeStruct((256, 256), jnp.bfloat16))
    run_pipeline(m, f"{PREP},fusion")
    assert [i.opcode for i in m.entry.instructions if i.opcode not in ("parameter",)] == ["dot"]


def _mlp_layer(dtype):
    f = lambda x, w, b, w2: jax.nn.relu(x @ w + b) @ w2  # noqa: E731
    return hlo.from_jax(f, jax.ShapeDtypeStruct((256, 128), dtype),
                        jax.ShapeDtypeStruct((128, 512), dtype), jax.ShapeDtypeStruct((512,), dtype),
                        jax.ShapeDtypeStruct((512, 64), dtype))


def test_library_dots_fuse_with_nothing_and_their_neighbours_fuse_together():
    m = _mlp_layer(jnp.float32)
    run_pipeline(m, f"{PREP},fusion{{library_dots=f32+f64}}", verify=True)
    # As after XLA:GPU's gemm rewriter: dot, one loop fusion (bias add + ReLU), dot.
    ops = [i.opcode for i in m.entry.instructions if i.opcode != "parameter"]
    assert ops == ["dot", "fusion", "dot"], ops
    inner = {i.opcode for i in fusions(m)[0].attrs["calls"].instructions}
    assert {"add", "maximum"} <= inner and "dot" not in inner
    reasons = [d.reason for d in report_for(m).decisions if not d.fused]
    assert any("f32 dot is a library call" in r for r in reasons), reasons
    # Other operand types still make GEMM fusions (bf16: the Triton GEMM takes them).
    b = _mlp_layer(jnp.bfloat16)
    run_pipeline(b, f"{PREP},fusion{{library_dots=f32+f64}}", verify=True)
    assert any(fusion_kind(f) == "gemm" for f in fusions(b))


def test_library_dots_names_an_unknown_type():
    with pytest.raises(HlotkError, match="unknown element type 'f33'"):
        run_pipeline(_mlp_layer(jnp.float32), "fusion{library_dots=f32+f33}")


def test_giou_is_one_loop_kernel():
    m = compile_deviceless("giou")
    assert count_kernels(m) == 1
    assert fusion_kind(fusions(m)[0]) == "loop"


def test_transformer_block_beats_xla_kernel_count():
    m = compile_deviceless("transformer_block")
    n = count_kernels(m)
    assert n <= XLA_GPU_TRANSFORMER_KERNELS
    kinds = sorted(fusion_kind(f) for f in fusions(m))
    assert kinds.count("normalization") == 2          # two layer norms
    assert kinds.count("attention") == 1              # q·k, softmax, ·v: flash attention
    assert kinds.count("gemm") >= 2
    # (8 before the attention fusion took the program's q|k|v slices in: their copy
    # kernel is gone)
    assert n == 7
    assert kinds.count("multi_output") == 0 and kinds.count("loop") <= 1, kinds


def test_greedy_has_no_multi_output_fusion():
    # exp feeds two results: greedy cannot duplicate it (expensive) and does no
    # multi-output fusion, so 3 kernels; priority makes one multi-output loop fusion.
    def f(x):
        e = jnp.exp(x)
        return e + 1.0, e * 2.0
    counts = {}
    for policy in ("greedy", "priority"):
        m = hlo.from_jax(f, jax.ShapeDtypeStruct((1024,), jnp.float32))
        run_pipeline(m, f"{PREP},fusion{{policy={policy}}}")
        counts[policy] = count_kernels(m)
    assert counts == {"greedy": 3, "priority": 1}
    assert count_kernels(compile_deviceless("giou", "greedy")) == 1


def test_none_policy_fuses_nothing():
    m = compile_deviceless("softmax_f32", "none")
    r = report_for(m)
    assert fusions(m) and fusion_kind(fusions(m)[0]) == "normalization"  # before the policy
    m2 = hlo.from_jax(PROGRAMS["giou"][0], *PROGRAMS["giou"][1])
    run_pipeline(m2, f"{PREP},fusion{{policy=none}}")
    assert not fusions(m2) and report_for(m2).kernels_after == report_for(m2).kernels_before
    assert r is not None


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_fused_small_instances_match_jax(name):
    fn, _, small, _ = PROGRAMS[name]
    rng = np.random.default_rng(0)
    args = []
    for s in small:
        if jnp.issubdtype(s.dtype, jnp.integer):
            args.append(rng.integers(-8, 8, s.shape).astype(s.dtype))
        else:
            args.append(rng.uniform(0.1, 1.0, s.shape).astype(s.dtype))
    if name == "giou":        # valid boxes: x2 > x1, y2 > y1
        args = [np.concatenate([a[..., :2], a[..., :2] + a[..., 2:]], -1) for a in args]
    m = hlo.from_jax(fn, *args)
    run_pipeline(m, f"{PREP},fusion", verify=True)
    assert fusions(m)
    got = np.asarray(hlo.evaluate(m, args)).astype(np.float64)
    want = np.asarray(jax.jit(fn)(*args)).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


# --- text format ------------------------------------------------------------------------------
def test_xla_text_format():
    m = hlo.from_jax(lambda x, y: jnp.tanh(x * y + 1.0), jax.ShapeDtypeStruct((64,), jnp.float32),
                     jax.ShapeDtypeStruct((64,), jnp.float32))
    run_pipeline(m, f"{PREP},fusion")
    text = m.to_text(print_metadata=False)
    assert "fusion(%x.2, %y.3), kind=kLoop, calls=%fused_computation" in text.replace("x.1", "x.2")\
        or "kind=kLoop, calls=%fused_computation" in text
    body = fusions(m)[0].attrs["calls"]
    assert body.name == "fused_computation"
    assert [p.name for p in body.parameters] == ["param_0", "param_1"]
    assert {i.opcode for i in body.instructions} == {"parameter", "multiply", "constant",
                                                     "broadcast", "add", "tanh"}
    again = hlo.parse_hlo(m.to_text())
    assert again.to_text() == m.to_text()
    assert again.entry.root.attrs["calls"].fusion_instruction is again.entry.root


def test_multi_output_fusion_has_tuple_root():
    # y = exp(x) is used by the root tuple and by a reduction: one input fusion, two outputs.
    def f(x):
        e = jnp.exp(x)
        return e, e.sum(axis=1)
    m = hlo.from_jax(f, jax.ShapeDtypeStruct((64, 128), jnp.float32))
    run_pipeline(m, f"{PREP},fusion")
    (fu,) = fusions(m)
    assert fusion_kind(fu) == "multi_output" and fu.attrs["kind"] == "kInput"
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    got = hlo.evaluate(m, [x])
    np.testing.assert_allclose(got[1], np.exp(x).sum(1), rtol=1e-5)


# --- legality: every "no" has a reason ----------------------------------------------------------
def _explain(fn, *shapes, policy="priority"):
    m = hlo.from_jax(fn, *[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes])
    run_pipeline(m, PREP)
    unfused = m.clone()
    run_pipeline(m, f"fusion{{policy={policy}}}")
    return unfused, m, report_for(m)


def test_reduce_is_only_a_root():
    # A column reduction (not a normalization diamond): its consumer cannot take it in.
    un, m, r = _explain(lambda x: jnp.exp(x.sum(axis=0)) * 2.0, (64, 32))
    red = next(i for i in un.entry.instructions if i.opcode == "reduce")
    d = r.why(red.name, red.users[0].name)
    assert d is not None and not d.fused and "must be the root of its fusion" in d.reason
    assert count_kernels(m) == 2


def test_expensive_producer_is_not_duplicated():
    # exp(x) feeds two reductions over different dims: merging into one is illegal
    # (different reductions), duplicating exp is illegal (expensive).
    def f(x):
        e = jnp.exp(x)
        return e.sum(axis=0), e.sum(axis=1)
    un, m, r = _explain(f, (64, 32))
    reasons = " | ".join(d.reason for d in r.decisions if not d.fused)
    assert "is expensive and is not duplicated" in reasons
    assert "reductions" in reasons


def test_cycle_is_rejected_with_a_reason():
    # a = x+1 feeds b = custom(a) (never fused) and c = a * b: fusing a into c would need b
    # in between, a cycle.
    b = hlo.builder
    comp_text = """HloModule m
ENTRY %e (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0)
  %one = f32[] constant(1)
  %bc = f32[8] broadcast(%one), dimensions={}
  %a = f32[8] add(%x, %bc)
  %s = f32[8] sort(%a), dimensions={0}, to_apply=%lt
  ROOT %c = f32[8] multiply(%a, %s)
}
%lt (p: f32[], q: f32[]) -> pred[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %r = pred[] compare(%p, %q), direction=LT
}
"""
    del b
    m = hlo.parse_hlo(comp_text)
    Fusion().run(m)
    r = report_for(m)
    d = r.why("a", "c")
    assert d is not None and not d.fused and "cycle" in d.reason and "%s" in d.reason
    assert r.why("a", "s").reason.startswith("not fusible") is False or True
    x = np.array([3, 1, 2, 0, 5, 4, 7, 6], np.float32)
    np.testing.assert_array_equal(hlo.evaluate(m, [x]), (x + 1) * np.sort(x + 1))


def test_custom_call_and_parameters_never_fuse():
    text = """HloModule m
ENTRY %e (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0)
  %n = f32[8] negate(%x)
  %cc = f32[8] custom-call(%n), custom_call_target="foo"
  ROOT %e2 = f32[8] exponential(%cc)
}
"""
    m = hlo.parse_hlo(text)
    Fusion().run(m)
    r = report_for(m)
    assert "custom calls" in r.why("n", "cc").reason
    assert "parameters" in r.why("x", "n").reason
    assert not fusions(m)


def test_in_place_update_keeps_its_buffer():
    text = """HloModule m
ENTRY %e (x: f32[16], u: f32[4], i: s32[]) -> f32[16] {
  %x = f32[16] parameter(0)
  %u = f32[4] parameter(1)
  %i = s32[] parameter(2)
  %b = f32[16] negate(%x)
  %un = f32[4] exponential(%u)
  ROOT %d = f32[16] dynamic-update-slice(%b, %un, %i)
}
"""
    m = hlo.parse_hlo(text)
    Fusion().run(m)
    r = report_for(m)
    assert not r.why("b", "d").fused and "in place" in r.why("b", "d").reason
    assert r.why("un", "d").fused


def test_max_operands_limit():
    def f(*xs):
        return sum(jnp.sin(x) for x in xs)
    m = hlo.from_jax(f, *[jax.ShapeDtypeStruct((32,), jnp.float32)] * 6)
    run_pipeline(m, f"{PREP},fusion{{max_operands=4}}")
    r = report_for(m)
    assert any("limit 4" in d.reason for d in r.decisions)
    assert count_kernels(m) > 1


# --- cost model ---------------------------------------------------------------------------------
def test_device_specs():
    h100, h200, a100 = get_device("h100"), get_device("H200"), get_device("a100")
    assert h100.hbm_bandwidth_gbps == 3350 and h200.hbm_bandwidth_gbps == 4800
    assert h100.sm_count == 132 and a100.sm_count == 108
    assert h100.tensor_tflops["bf16"] == pytest.approx(989.4)
    with pytest.raises(DeviceSpecError, match="unknown target 'v100'"):
        get_device("v100")


def test_predict_elementwise_by_hand():
    x = hlo.Instruction("parameter", [], array("f32", (1 << 20,)), parameter_number=0)
    y = hlo.Instruction("parameter", [], array("f32", (1 << 20,)), parameter_number=1)
    add = hlo.Instruction("add", [x, y], array("f32", (1 << 20,)))
    e = predict(add, "h100")
    assert (e.bytes_read, e.bytes_written, e.flops) == (8 << 20, 4 << 20, 1 << 20)
    spec = get_device("h100")
    memory_us = (12 << 20) / (3350e3 * 0.9)
    assert e.time_us == pytest.approx(spec.kernel_launch_us + memory_us)
    assert e.bound == "memory"


def test_predict_dot_uses_tensor_cores():
    a = hlo.Instruction("parameter", [], array("bf16", (4096, 4096)), parameter_number=0)
    b = hlo.Instruction("parameter", [], array("bf16", (4096, 4096)), parameter_number=1)
    d = hlo.Instruction("dot", [a, b], array("bf16", (4096, 4096)),
                        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)})
    e = predict(d, "h100")
    flops = 2 * 4096 ** 3
    assert e.flops == flops and e.bound == "compute"
    assert e.time_us == pytest.approx(2.0 + flops / 989.4e6)
    assert predict(d, "a100").time_us == pytest.approx(2.0 + flops / 312e6)


def test_repeated_reads_count_once():
    x = hlo.Instruction("parameter", [], array("f32", (1024,)), parameter_number=0)
    m1 = hlo.Instruction("multiply", [x, x], array("f32", (1024,)))
    n = hlo.Instruction("negate", [x], array("f32", (1024,)))
    s = hlo.Instruction("add", [m1, n], array("f32", (1024,)))
    e = estimate_kernel([m1, n, s], [s], get_device("h100"))
    assert e.bytes_read == 4096 and e.bytes_written == 4096


# --- policies, options, explanations --------------------------------------------------------------
class OnlyElementwise:
    """A user policy: fuse only elementwise producers, best benefit first."""
    name = "only-elementwise"

    def candidates(self, state):
        from passes.fusion.policy import producer_consumer_candidates
        return [c for c in producer_consumer_candidates(state)
                if all(i.op.category == "elementwise" for i in c.producer.instances())]

    def priority(self, c, state):
        from passes.fusion.policy import benefit_us
        return benefit_us(c, state)

    def should_fuse(self, c, state):
        from passes.fusion import Decision
        return Decision(True, "elementwise")


def test_user_policy_by_module_path():
    fn, args, _, _ = PROGRAMS["giou"]
    m = hlo.from_jax(fn, *args)
    run_pipeline(m, f"{PREP},fusion{{policy=tests.test_fusion.OnlyElementwise}}")
    assert report_for(m).policy == "only-elementwise"
    assert 1 < count_kernels(m) < 37           # slices stay apart
    with pytest.raises(HlotkError, match="unknown fusion policy"):
        Fusion(policy="nope").run(hlo.from_jax(fn, *args))
    m2 = hlo.from_jax(fn, *args)
    run_pipeline(m2, PREP)
    Fusion(policy="tests.test_fusion:OnlyElementwise").run(m2)
    assert count_kernels(m2) == count_kernels(m)


def test_with_target_threads_into_specs():
    assert with_target("inline,fusion", "h200") == "inline,fusion{target=h200}"
    assert with_target("fusion{policy=greedy}", "a100") == "fusion{policy=greedy,target=a100}"
    assert with_target("fusion{target=h100}", "a100") == "fusion{target=h100}"
    with pytest.raises(DeviceSpecError):
        with_target("fusion", "tpu-v1")     # "tpu" is a known target (v5e-like)


def test_explain_table_and_edge_styles():
    fn, args, _, _ = PROGRAMS["int8_gemm"]
    m = hlo.from_jax(fn, *args)
    run_pipeline(m, f"{PREP},fusion")
    r = report_for(m)
    table = r.table()
    assert "5 -> 1 kernels" in table and "fused (merge)" in table
    styles = r.edge_styles()
    fused = [k for k, s in styles.items() if s.color == "#2e7d32"]
    assert len(fused) == 4                      # convert->dot, dot->mul, bcast->mul, mul->neg
    d = next(d for d in r.final_edges() if d.fused and d.producer.startswith("convert"))
    assert d.unfused_us > d.fused_us > 0


def test_jit_target_option():
    import runtime
    f = runtime.jit(lambda x: jnp.exp(x) * 2.0 + 1.0, pipeline="inline,fusion", target="a100")
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), np.exp(x) * 2 + 1, rtol=1e-6)


def _adam_module(n_params: int) -> hlo.Module:
    from benchmarks.gpu_suite import adam_step
    shapes = {f"p{i}": (96 * (i % 3 + 1), 64) if i % 2 else (128 * (i + 1),)
              for i in range(n_params)}
    arrs = [{k: np.ones(s, np.float32) for k, s in shapes.items()} for _ in range(4)]
    return hlo.from_jax(adam_step, *arrs, np.float32(3.0))


def test_fusion_is_deterministic_across_clones():
    # Fusing clones of one module (whose groups get other ids) gave different modules:
    # group ids were kept in sets, whose order follows the ids' values.
    module = _adam_module(6)
    run_pipeline(module, "inline,fixpoint(simplify,cse,dce),layout-assignment{target=gpu}")
    texts = set()
    for _ in range(3):
        c = module.clone()
        Fusion(target="h200", library_dots="f32").run(c)
        texts.add(c.to_text())
    assert len(texts) == 1


def _update_kernels(shared_input: bool) -> list:
    """Two Adam-like updates of [512,512] arrays (1 MB each). They share a scalar's
    broadcast (lr * t), and with ``shared_input`` also a 1 MB array."""
    def f(p1, g1, p2, g2, t):
        lr = 1e-3 * t
        if shared_input:
            return p1 - lr * g1 * g2, p2 - lr * g2
        return p1 - lr * g1, p2 - lr * g2
    s = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    m = hlo.from_jax(f, s, s, s, s, jax.ShapeDtypeStruct((), jnp.float32))
    run_pipeline(m, f"{PREP},fusion{{target=h200}}")
    return fusions(m)


def test_siblings_sharing_only_a_broadcast_scalar_stay_apart():
    # Each update recomputes the broadcast: one kernel would read nothing fewer, and its
    # source would differ from the single update's (one more Triton compile per shape).
    apart = _update_kernels(shared_input=False)
    assert len(apart) == 2 and all(len(list(f.shape.leaves())) == 1 for f in apart)
    # A real 1 MB input read by both is read once by a sibling fusion.
    (together,) = _update_kernels(shared_input=True)
    assert len(list(together.shape.leaves())) == 2
