"""Every zoo program (tests/zoo.py) through hlotk, compared with ``jax.jit`` on the CPU.

For each program:
  * import: ``hlo.from_jax`` gives a module that ``hlo.verify`` accepts;
  * interpreter: ``hlo.evaluate`` on the imported module equals ``jax.jit(fn)(*args)``;
  * runtime: ``runtime.jit(fn)(*args)`` equals ``jax.jit(fn)(*args)``, pytree for pytree;
  * text: printing, parsing and printing again gives the same text, and the reparsed
    module evaluates to exactly what the imported one does.
Integer/bool leaves must match exactly, floating ones within the program's tolerance.
"""
from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hlo  # noqa: E402
from tests.zoo import (ZOO, ZooProgram, assert_flat_close, assert_trees_close, by_name,  # noqa: E402
                 flatten_value, x64_scope)


@pytest.fixture(params=ZOO, ids=[p.name for p in ZOO])
def program(request) -> ZooProgram:
    """The zoo program; x64 programs run with 64-bit types enabled only inside their test."""
    prog = request.param
    with x64_scope(prog):
        yield prog


# Caches keyed by program name: JAX's expected value and the imported module are shared by
# the tests of one program, so each is computed once per session.
@functools.cache
def _args(name: str) -> tuple:
    return by_name(name).args()


@functools.cache
def _expected(name: str):
    out = jax.jit(by_name(name).fn)(*_args(name))
    return jax.tree.map(np.asarray, out)


@functools.cache
def _module(name: str) -> hlo.Module:
    return hlo.from_jax(by_name(name).fn, *_args(name))


def _flat_args(name: str) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(_args(name))]


def test_zoo_is_big_enough():
    assert len(ZOO) >= 30
    assert len({p.name for p in ZOO}) == len(ZOO)


def test_import_and_verify(program: ZooProgram):
    module = _module(program.name)
    assert isinstance(module, hlo.Module)
    assert module.entry is not None
    assert len(module.entry.parameters) == len(_flat_args(program.name)), (
        "one entry parameter per argument leaf")
    hlo.verify(module)


def test_interpreter_matches_jax(program: ZooProgram):
    got = hlo.evaluate(_module(program.name), _flat_args(program.name))
    assert_flat_close(got, _expected(program.name), program.rtol, program.atol)


def test_runtime_jit_matches_jax(program: ZooProgram):
    import runtime
    got = runtime.jit(program.fn)(*_args(program.name))
    assert_trees_close(got, _expected(program.name), program.rtol, program.atol)


def test_text_round_trip(program: ZooProgram):
    module = _module(program.name)
    text = module.to_text()
    reparsed = hlo.parse_hlo(text)
    hlo.verify(reparsed)
    args = _flat_args(program.name)
    before = flatten_value(hlo.evaluate(module, args))
    after = flatten_value(hlo.evaluate(reparsed, args))
    assert len(after) == len(before)
    for i, (a, b) in enumerate(zip(after, before)):
        # The same program on the same inputs: bit-exact (catches lossy constant printing).
        assert np.asarray(a).dtype == np.asarray(b).dtype, f"result {i} changed dtype"
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                      err_msg=f"result {i} changed after the text round trip")
    text2 = reparsed.to_text()
    assert text2 == text, _first_difference(text, text2)


def _first_difference(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1} differs after the round trip:\n  printed: {x}\n  reprint: {y}"
    return f"line counts differ: {len(la)} vs {len(lb)}"
