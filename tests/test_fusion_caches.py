"""The fusion state's caches (consumers, node estimates, candidates per group, readers per
value, user nodes, work per instruction, values with several readers, candidate estimates,
priorities) give the answers a fresh computation gives, at every call, through whole
CUDA-pipeline compiles (issue 13: they made the passes 2x faster on an Adam step, and must
not change a decision)."""
from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import runtime
from passes.fusion import policy as policy_mod
from passes.fusion import priority as priority_mod
from passes.fusion import rewrite
from passes.fusion.explain import report_for
from passes.fusion.pass_ import with_target
from passes.pipelines import pipeline_spec
from runtime.tools import compile_module

sys.path.insert(0, str(Path(__file__).parent))
from zoo import by_name  # noqa: E402


def _adam(params, grads, m, v, step):
    """An Adam step over a dict of params: many small independent chains sharing ``step``
    (the shape of program whose fusion loop runs longest)."""
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    t = step + 1.0
    out = {}
    for k in params:
        mk = b1 * m[k] + (1 - b1) * grads[k]
        vk = b2 * v[k] + (1 - b2) * grads[k] * grads[k]
        mh = mk / (1 - b1 ** t)
        vh = vk / (1 - b2 ** t)
        out[k] = (params[k] - lr * mh / (jnp.sqrt(vh) + eps), mk, vk)
    return out


def _adam_args(big: bool = False) -> tuple:
    r = np.random.RandomState(0)
    shapes = {"w1": (64, 128), "b1": (128,), "w2": (128, 64), "b2": (64,), "g": (64,)}
    if big:     # arrays of 64 KiB and more: sibling candidates (policy.sibling_candidates)
        shapes = {"w1": (256, 128), "b1": (128,), "w2": (128, 256), "b2": (256,), "g": (64,)}
    tree = lambda s: {k: r.standard_normal(v).astype(np.float32) * s for k, v in shapes.items()}
    return tree(0.02), tree(1e-3), tree(1e-4), {k: np.abs(a) for k, a in tree(1e-6).items()}, \
        np.float32(3.0)


def _many(n: int) -> tuple:
    """Adam's arguments over ``n`` arrays of two shapes: its bias corrections (scalars
    computed from the step) are read by one broadcast per shape and by ``n`` kernels,
    and the trees of one shape share the broadcasts of the constants (a component of
    ~15 n / 2 members per shape)."""
    r = np.random.RandomState(2)
    shapes = [(64, 128), (32, 256)]
    tree = lambda s: {f"w{k}": r.standard_normal(shapes[k % 2]).astype(np.float32) * s
                      for k in range(n)}
    return tree(0.02), tree(1e-3), tree(1e-4), {k: np.abs(a) for k, a in tree(1e-6).items()}, \
        np.float32(3.0)


def _mlp_train(p, x, labels):
    """gpu_suite's MLP training step (3 layers, log-softmax cross-entropy, SGD) at small
    sizes: its sibling candidates come and go as the loop fuses."""
    import jax

    def loss_fn(p):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        h = jax.nn.relu(h @ p["w2"] + p["b2"])
        logp = jax.nn.log_softmax(h @ p["w3"] + p["b3"])
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(labels, 100, dtype=logp.dtype), -1))
    loss, g = jax.value_and_grad(loss_fn)(p)
    return jax.tree.map(lambda w, gw: w - 0.01 * gw, p, g), loss


def _mlp_args() -> tuple:
    r = np.random.RandomState(0)
    f = lambda *s: r.standard_normal(s).astype(np.float32) * 0.1  # noqa: E731
    p = {"w1": f(256, 512), "b1": f(512), "w2": f(512, 512), "b2": f(512),
         "w3": f(512, 100), "b3": f(100)}
    return p, f(128, 256), r.randint(0, 100, (128,)).astype(np.int32)


def _program(name: str) -> tuple:
    if name == "adam":
        return _adam, _adam_args()
    if name == "mlp_train":
        return _mlp_train, _mlp_args()
    prog = by_name(name)
    return prog.fn, prog.args()


def _compile(fn, args, chains: bool = True) -> str:
    """``chains=False``: the ranked loop on single instructions (passes/fusion/chains.py
    merges an optimizer step's elementwise trees before it otherwise)."""
    module = runtime.jit(fn, pipeline="none").lower(*args).module
    spec = with_target(pipeline_spec("default", "cuda"), "h200")
    if not chains:
        spec = spec.replace("fusion{", "fusion{chains=false,", 1)
    compile_module(module, spec, backend="cuda")
    report = report_for(module)
    return module.to_text() + "\n".join(map(repr, report.decisions if report else []))


def _checked(monkeypatch, mismatches: list) -> None:
    """Every cached answer is compared with a fresh one (the cache emptied first)."""
    def check(name: str, cache: str, same=lambda a, b: a == b):
        orig = getattr(rewrite.FusionState, name)

        def wrapper(self, *a):
            got = orig(self, *a)
            getattr(self, cache).clear()
            fresh = orig(self, *a)
            if not same(got, fresh):
                mismatches.append((name, a))
            return got
        monkeypatch.setattr(rewrite.FusionState, name, wrapper)
    ids = lambda a, b: [id(x) for x in a] == [id(x) for x in b]
    check("consumers", "_consumers", ids)
    check("node_estimate", "_node_estimates")
    check("group_readers", "_group_readers", ids)
    check("user_nodes", "_user_nodes", ids)
    check("work_of", "_work")
    check("copy_estimate", "_copy_estimates")
    orig_shared = rewrite.FusionState.shared_values

    def shared(self, min_bytes):
        # (kept across calls, not emptied: it is updated from the values marked dropped)
        got = orig_shared(self, min_bytes)
        fresh = [i for i in self.values_of_at_least(min_bytes)
                 if len(self.group_readers(i)) > 1]
        if not ids(got, fresh):
            mismatches.append(("shared_values", (min_bytes,)))
        return got
    monkeypatch.setattr(rewrite.FusionState, "shared_values", shared)
    orig_pc = policy_mod.producer_consumer_candidates

    def pc(state, *a, **k):
        got = list(orig_pc(state, *a, **k))
        state._pc_candidates.clear()
        if [c.key for c in got] != [c.key for c in orig_pc(state, *a, **k)]:
            mismatches.append(("producer_consumer_candidates", ()))
        return iter(got)
    monkeypatch.setattr(priority_mod, "producer_consumer_candidates", pc)
    orig_est = policy_mod.estimates

    def est(c, state):
        got = orig_est(c, state)
        if got != policy_mod._estimates(c, state):
            mismatches.append(("estimates", c.key))
        return got
    monkeypatch.setattr(policy_mod, "estimates", est)
    monkeypatch.setattr(priority_mod, "benefit_us",
                        lambda c, s: (lambda e: e[0].time_us - e[1].time_us)(est(c, s)))
    orig_priority = priority_mod.PriorityPolicy.priority

    def priority(self, c, state):
        got = orig_priority(self, c, state)
        if got != self._priority(c, state):
            mismatches.append(("priority", c.key))
        return got
    monkeypatch.setattr(priority_mod.PriorityPolicy, "priority", priority)


@pytest.mark.parametrize("name", ["adam", "mlp_train", "transformer_block", "mlp_train_step",
                                  "conv_grad_maxpool_grad", "scan_rnn"])
def test_fusion_caches_answer_as_fresh(monkeypatch, name):
    fn, args = _program(name)
    plain = _compile(fn, args)
    mismatches: list = []
    with monkeypatch.context() as m:
        _checked(m, mismatches)
        checked = _compile(fn, args)
    assert mismatches == []
    assert checked == plain          # the same module and decision log either way
    assert "fusion" in plain


@pytest.mark.parametrize("name", ["adam", "transformer_block", "mlp_train_step",
                                  "conv_grad_maxpool_grad"])
def test_ranked_loop_decides_as_the_general_one(monkeypatch, name):
    """Priority fusion's incremental loop (pass_.run_ranked) makes the decisions, in the
    order, of the general loop that scores every candidate every round."""
    from passes.fusion import pass_
    if name == "adam":
        fn, args = _adam, _adam_args()
    else:
        prog = by_name(name)
        fn, args = prog.fn, prog.args()
    used = []
    real = pass_.run_ranked
    monkeypatch.setattr(pass_, "run_ranked", lambda *a: used.append(1) or real(*a))
    ranked = _compile(fn, args)
    assert used
    monkeypatch.setattr(pass_, "ranks_by_group", lambda policy: False)
    assert _compile(fn, args) == ranked


def test_a_policy_that_changes_priorities_goes_the_general_way():
    from passes.fusion import pass_

    class Reversed(priority_mod.PriorityPolicy):
        def priority(self, c, state):
            return -super().priority(c, state)
    assert pass_.ranks_by_group(priority_mod.PriorityPolicy())
    assert not pass_.ranks_by_group(Reversed())


@pytest.mark.parametrize("name", ["adam", "adam_big", "adam_many", "transformer_block",
                                  "mlp_train_step"])
def test_ranked_loop_rankings_are_current(monkeypatch, name):
    """Every round, each live group's kept candidate list is its current one, each exact
    priority kept is what scoring the candidate afresh gives, and each bound kept in its
    place is at least that (``FusionState.changed`` names every group whose candidates'
    priorities may have changed); a group whose ranking was deferred (a merge replaced
    some of its consumers) keeps one value at least every current candidate's priority,
    and a count at least its consumers'. Fresh scores are computed on a copy of the
    state's caches (scoring caches estimates, which would change what the loop
    estimates)."""
    import copy

    from passes.fusion import pass_
    from passes.fusion.policy import group_candidates, sibling_candidates
    fn, args = (_adam, _many(12) if name == "adam_many" else _adam_args(name == "adam_big")) \
        if name.startswith("adam") else (by_name(name).fn, by_name(name).args())
    rounds, stale, bounds, floors, siblings, deferred = [], [], [], [], [], []
    copy_bounds: list = []
    real_run = pass_.run_ranked

    def run(state, policy, *a):
        def audit(ranked):
            rounds.append(1)
            assert set(ranked) == set(state.groups)
            saved = copy.copy(state.__dict__)
            for k, v in saved.items():
                if isinstance(v, (dict, set)):
                    setattr(state, k, copy.copy(v))
            try:
                for gid, (cands, values, exact, heap, readers) in ranked.items():
                    now = group_candidates(state, state.groups[gid])
                    fresh = [-policy._priority(c, state) for c in now]
                    if readers < len(state.consumers(state.groups[gid])):
                        stale.append(("readers", gid))
                    if cands is None:
                        # deferred: one entry, index -1, a bound of them all
                        deferred.append(gid)
                        (value, j, ex), = heap
                        if j != -1 or ex or any(value > f for f in fresh):
                            stale.append(("deferred", gid))
                        continue
                    if now is not cands:
                        stale.append(gid)
                    for j, v in enumerate(values):
                        bounds.append(not exact[j])
                        copy_bounds.append(not exact[j] and cands[j].action == "duplicate")
                        if (exact[j] and v != fresh[j]) or (not exact[j] and v > fresh[j]):
                            stale.append((gid, j))
                floor = policy.sibling_floor(state)    # below every sibling's key
                floors.append(floor)
                for c in sibling_candidates(state):    # their bounds, made each round
                    siblings.append(c.key)
                    ub = policy.priority_bound(c, state)
                    exact = policy._priority(c, state)
                    if (ub is not None and ub < exact) or -exact < floor:
                        stale.append(c.key)
            finally:
                state.__dict__.clear()
                state.__dict__.update(saved)
        return real_run(state, policy, *a, audit=audit)
    monkeypatch.setattr(pass_, "run_ranked", run)
    _compile(fn, args, chains=False)      # the loop's own rounds, every one of them
    assert len(rounds) > 3 and stale == []
    if name.startswith("adam"):
        assert any(bounds)        # candidates ranked by a bound, never estimated until needed
        assert deferred           # groups whose ranking waited for their turn
        assert any(copy_bounds)   # duplicates ranked by PriorityPolicy.duplicate_bound
        assert all(f > float("-inf") for f in floors)   # no dot: siblings listed when needed
    if name == "adam_big":
        assert siblings           # the floor was checked against some


def test_a_duplicate_marks_the_producers_of_the_dropped_estimates_changed():
    """What run_ranked's rankings rely on: a duplicate drops the cached estimates of the
    candidates naming the groups it touches and marks their producers changed."""
    import hlo
    from passes.fusion.cost_model import get_device
    from passes.fusion.policy import Candidate, estimates
    m = hlo.parse_hlo("""HloModule m

ENTRY %main (p0: f32[4096]) -> (f32[4096], f32[4096]) {
  %p0 = f32[4096]{0} parameter(0)
  %x = f32[4096]{0} exponential(%p0)
  %p = f32[4096]{0} negate(%x)
  %a = f32[4096]{0} add(%p, %p0)
  %b = f32[4096]{0} multiply(%p, %p0)
  ROOT %t = (f32[4096], f32[4096]) tuple(%a, %b)
}
""")
    comp = m.entry
    by = {i.name: i for i in comp.instructions}
    state = rewrite.FusionState(comp, get_device("h200"),
                                fusible=lambda i: i.opcode not in ("parameter", "tuple"))
    gx, gp, ga = (state.group_of(by[n]) for n in ("x", "p", "a"))
    before = estimates(Candidate("merge", gx, (gp,)), state)
    assert gx.id in state.take_changed() and not state.changed    # made: all changed
    state.duplicate(gp, ga)
    assert gx.id in state.changed
    assert ("merge", gx.id, gp.id) not in state._candidates
    assert before is not estimates(Candidate("merge", gx, (gp,)), state)


@pytest.mark.parametrize("name", ["adam", "transformer_block", "conv_grad_maxpool_grad",
                                  "scan_rnn"])
def test_kernel_facts_estimate_as_estimate_kernel(name):
    """``KernelFacts.estimate`` (each instruction's facts worked out once) gives exactly
    ``estimate_kernel``'s estimate, over windows of a lowered program's instructions with
    their last one or two as outputs, small constants folded or not, repeated instances
    (a copy listed twice) included."""
    import random

    from passes.fusion.cost_model import KernelFacts, estimate_kernel, get_device
    fn, args = _program(name)
    module = runtime.jit(fn, pipeline="none").lower(*args).module
    spec = get_device("h200")
    rng = random.Random(0)
    checked = 0
    for comp in module.computations:
        insts = [i for i in comp.instructions if i.opcode != "tuple" or i is not comp.root]
        for small in (0, 64):
            facts = KernelFacts(spec, small)
            for _ in range(60):
                if not insts:
                    break
                a = rng.randrange(len(insts))
                body = insts[a:a + rng.randint(1, 12)]
                if rng.random() < 0.2:
                    body = body + body[:1]
                outs = body[-rng.randint(1, min(2, len(body))):]
                want = estimate_kernel(body, outs, spec, small)
                assert facts.estimate(body, outs) == want, [i.name for i in body]
                checked += 1
    assert checked > 100
