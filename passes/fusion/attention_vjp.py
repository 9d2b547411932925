"""The softmax gradient inside jax.grad's attention backward, checked on random rows.

``check_vjp(root, leaves, score_dims)`` evaluates the instructions under ``root`` as a per-row
function of the forward's values (x, x - m, e, l, m, P) and dP, in float64 on a few random
rows, and raises NoMatch unless it equals P * (dP - rowsum(P * dP)). JAX spells that
gradient in many ways (the custom-JVP form, the transposed division chain ``e / l``,
``-e / l^2`` ...); this accepts any of them built from elementwise ops, compares, selects,
row sums and row broadcasts.

The values need not share one dimension order. jax.nn's grouped-query attention has
scores [b, kv, t, g, s] but computes dP as [b, kv, g, t, s] and dX as [g, b, kv, t, s]
(transposes and layout bitcasts between them). Each value therefore carries its *score
map*: for each of its dims, the score dim it indexes (None for a size-1 dim). Arrays are
stored in one canonical form ([rows, keys] for full values, [rows] for row values, rows
in the scores' order), so a view that only permutes dims changes the map, not the data;
an elementwise op checks that its operands' maps agree (the same element of the same row),
a row sum that it sums over the key dim, a broadcast that it adds the key dim only.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from hlo.ir import Instruction

from .attention import NoMatch, _scalar_constant
from .views import VIEW_OPS, view_step

_ELEMENTWISE = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "negate": np.negative, "exponential": np.exp, "log": np.log, "maximum": np.maximum,
    "minimum": np.minimum,
}

_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}

ScoreMap = tuple      # value dim -> score dim, None for a size-1 dim


def normalized(smap: tuple, dims: tuple) -> ScoreMap:
    """``smap`` with size-1 dims as None (which size-1 score dim a size-1 dim stands for
    moves no element, and bitcasts do not say)."""
    return tuple(None if dims[d] == 1 else s for d, s in enumerate(smap))


def _row_fn(root: Instruction, leaves: dict[int, tuple[str, ScoreMap]], score: tuple,
            env: dict[str, np.ndarray]) -> tuple[np.ndarray, ScoreMap]:
    """(value, score map) of ``root`` as a per-row function of the ``leaves`` (instruction
    id -> (env name, score map)). Raises NoMatch for anything else."""
    key_dim = len(score) - 1
    nonunit = frozenset(d for d, n in enumerate(score) if n != 1)
    row_dims = nonunit - {key_dim}
    memo: dict[int, tuple[np.ndarray, Optional[ScoreMap]]] = {}

    def covered(smap: ScoreMap) -> frozenset:
        return frozenset(s for s in smap if s is not None)

    def val(i: Instruction) -> tuple[np.ndarray, Optional[ScoreMap]]:
        if id(i) in leaves:
            name, smap = leaves[id(i)]
            return env[name], smap
        if id(i) in memo:
            return memo[id(i)]
        c = _scalar_constant(i)
        if c is not None:
            return np.float64(c), None         # broadcasts to any value
        op = i.opcode
        if op == "convert":
            out = val(i.operands[0])
        elif op in VIEW_OPS:
            out = _view(i, val(i.operands[0]))
        elif op == "reduce":
            out = _row_sum(i, val(i.operands[0]))
        elif op in _ELEMENTWISE or op == "select" or (
                op == "compare" and str(i.attrs.get("direction", "")) in _COMPARE):
            ops = [val(o) for o in i.operands]
            maps = {m for _, m in ops if m is not None}
            if len(maps) > 1:
                raise NoMatch(f"%{i.name} ({op}) in the softmax gradient combines values "
                              "whose dims stand for different score dims")
            args = [v for v, _ in ops]
            with np.errstate(all="ignore"):
                if op == "select":
                    v = np.where(*args)
                elif op == "compare":
                    # x == max(x): the gradient of a row max that no stop_gradient cut (a
                    # softmax written by hand); its term is rowsum(dX) = 0 times the argmax
                    v = _COMPARE[str(i.attrs["direction"])](*args)
                else:
                    v = _ELEMENTWISE[op](*args)
            out = (v, next(iter(maps)) if maps else None)
        else:
            raise NoMatch(f"%{i.name} ({op}) in the softmax gradient is not an elementwise "
                          "op, row sum or row broadcast")
        memo[id(i)] = out
        return out

    def _view(i: Instruction, src: tuple) -> tuple[np.ndarray, ScoreMap]:
        v, smap = src
        step = view_step(i)
        if step is None:
            raise NoMatch(f"%{i.name} ({i.opcode}) in the softmax gradient moves elements")
        if smap is None:
            return v, None
        idims = i.shape.dims
        out = [None if d is None else smap[d] for d in step]
        new = [d for d, w in enumerate(step) if w is None and idims[d] != 1]
        had = covered(smap)
        if new:     # a row value broadcast along the keys, and nothing else
            if had != row_dims or len(new) != 1 or idims[new[0]] != score[key_dim]:
                raise NoMatch(f"%{i.name} broadcasts along a row dim, not the key axis")
            out[new[0]] = key_dim
            v = np.broadcast_to(np.asarray(v)[:, None], env["x"].shape)
        out_map = normalized(tuple(out), idims)
        if covered(out_map) != (had | {key_dim} if new else had):
            raise NoMatch(f"%{i.name} ({i.opcode}) in the softmax gradient drops a dim")
        return v, out_map

    def _row_sum(i: Instruction, src: tuple) -> tuple[np.ndarray, ScoreMap]:
        v, smap = src
        body = i.attrs.get("to_apply")
        dims = list(i.attrs.get("dimensions", ()))
        if body is None or body.root.opcode != "add" or smap is None or len(dims) != 1 or \
                covered(smap) != nonunit or smap[dims[0]] != key_dim or \
                _scalar_constant(i.operands[1]) != 0:
            raise NoMatch(f"%{i.name} in the softmax gradient is not a row sum")
        return np.asarray(v).sum(axis=-1), tuple(s for d, s in enumerate(smap)
                                                  if d != dims[0])

    if score[key_dim] == 1 or not row_dims:
        raise NoMatch("a softmax over one key (or of one row) has no gradient to fuse")
    v, smap = val(root)
    if smap is None or covered(smap) != nonunit:
        raise NoMatch(f"%{root.name} is not a [rows, keys] value of the softmax gradient")
    return np.asarray(v), smap


def check_vjp(root: Instruction, leaves: dict[int, tuple[str, ScoreMap]],
              score: tuple) -> ScoreMap:
    """Checks that ``root`` is P*(dP - rowsum(P*dP)) given the leaves (ids of x, sub, ex,
    p, m, l, dp with their score maps); returns ``root``'s score map."""
    keys = score[-1]
    rng = np.random.default_rng(0)
    x = 2 * rng.standard_normal((5, keys))
    m = x.max(axis=-1)
    ex = np.exp(x - m[:, None])
    l_ = ex.sum(axis=-1)
    p = ex / l_[:, None]
    dp = rng.standard_normal((5, keys))
    env = {"x": x, "sub": x - m[:, None], "ex": ex, "l": l_, "m": m, "p": p, "dp": dp}
    got, smap = _row_fn(root, leaves, score, env)
    want = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-7, atol=1e-10):
        raise NoMatch(f"%{root.name} is not the softmax gradient P*(dP - rowsum(P*dP)) "
                      "(checked on random rows)")
    return smap
