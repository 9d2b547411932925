"""The fusion state's caches (consumers, node estimates, candidates per group, readers per
value, user nodes, work per instruction, candidate estimates, priorities) give the answers
a fresh computation gives, at every call,
through whole CUDA-pipeline compiles (issue 13: they made the passes 2x faster on an Adam
step, and must not change a decision)."""
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


def _adam_args() -> tuple:
    r = np.random.RandomState(0)
    shapes = {"w1": (64, 128), "b1": (128,), "w2": (128, 64), "b2": (64,), "g": (64,)}
    tree = lambda s: {k: r.standard_normal(v).astype(np.float32) * s for k, v in shapes.items()}
    return tree(0.02), tree(1e-3), tree(1e-4), {k: np.abs(a) for k, a in tree(1e-6).items()}, \
        np.float32(3.0)


def _compile(fn, args) -> str:
    module = runtime.jit(fn, pipeline="none").lower(*args).module
    compile_module(module, with_target(pipeline_spec("default", "cuda"), "h200"), backend="cuda")
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


@pytest.mark.parametrize("name", ["adam", "transformer_block", "mlp_train_step",
                                  "conv_grad_maxpool_grad", "scan_rnn"])
def test_fusion_caches_answer_as_fresh(monkeypatch, name):
    if name == "adam":
        fn, args = _adam, _adam_args()
    else:
        prog = by_name(name)
        fn, args = prog.fn, prog.args()
    plain = _compile(fn, args)
    mismatches: list = []
    with monkeypatch.context() as m:
        _checked(m, mismatches)
        checked = _compile(fn, args)
    assert mismatches == []
    assert checked == plain          # the same module and decision log either way
    assert "fusion" in plain
