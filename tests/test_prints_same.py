"""``hlo.same.prints_same``: the module cache's check that an unpickled module is the one it
pickled, without printing either (issue 13). It must say True for a faithful copy of every
HLO fixture and False for any change the printer would show."""
from __future__ import annotations

import pathlib
import pickle

import numpy as np
import pytest

import hlo
from hlo.attrs import Metadata
from hlo.same import prints_same
from hlo.shape import Layout, Shape

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
FILES = sorted(DATA.glob("*.hlo.txt"))


def _round_trip(m: hlo.Module) -> hlo.Module:
    return pickle.loads(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.replace(".hlo.txt", ""))
def test_an_unpickled_fixture_prints_the_same(path):
    m = hlo.parse_hlo(path.read_text(), str(path))
    u = _round_trip(m)
    assert u.to_text() == m.to_text()
    assert prints_same(u, m) and prints_same(m, u)
    assert prints_same(m.clone(), m)


def _fused() -> hlo.Module:
    import jax.numpy as jnp

    from passes import run_pipeline
    from passes.pipelines import pipeline_spec
    m = hlo.from_jax(lambda x, y: (jnp.tanh(x @ y + 1.0).sum(0) * 2.0, x[1:3] * 0.5),
                     np.ones((8, 4), np.float32), np.ones((4, 4), np.float32))
    run_pipeline(m, pipeline_spec("default", "cpu"))
    assert any(i.opcode == "fusion" for i in m.entry.instructions)
    return m


def _first(m: hlo.Module, pred) -> hlo.Instruction:
    return next(i for i in m.all_instructions() if pred(i))


# Each edit changes what the module prints; prints_same must see it.
EDITS = {
    "instruction name": lambda m: setattr(m.entry.root, "name", "renamed"),
    "opcode": lambda m: setattr(_first(m, lambda i: i.opcode == "multiply"), "opcode", "add"),
    "layout": lambda m: setattr(
        _first(m, lambda i: i.shape.rank == 2 and not i.shape.is_tuple), "shape",
        (lambda s: Shape(s.dtype, s.dims, Layout((0, 1))))(
            _first(m, lambda i: i.shape.rank == 2 and not i.shape.is_tuple).shape)),
    "operand order": lambda m: _first(
        m, lambda i: len(i.operands) == 2 and i.operands[0] is not i.operands[1]
    ).operands.reverse(),
    "literal bit": lambda m: _first(
        m, lambda i: i.opcode == "constant" and i.literal is not None
    ).literal.__setitem__(Ellipsis, np.float32(1.0000001)),
    "attribute value": lambda m: _first(
        m, lambda i: "dimensions" in i.attrs).attrs.__setitem__("dimensions", (7,)),
    "attribute order": lambda m: _reorder(_first(m, lambda i: len(i.attrs) >= 2)),
    "metadata": lambda m: _first(m, lambda i: "metadata" in i.attrs).attrs.__setitem__(
        "metadata", Metadata((("op_name", "other"),))),
    "config": lambda m: m.config.__setitem__("replica_count", 2),
    "computation name": lambda m: setattr(m.computations[0], "name", "other_name"),
    "root": lambda m: setattr(m.entry, "root", m.entry.instructions[0]),
}


def _reorder(inst: hlo.Instruction) -> None:
    items = list(inst.attrs.items())
    inst.attrs.clear()
    inst.attrs.update(reversed(items))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_change_the_printer_shows_is_seen(edit):
    m = _fused()
    u = _round_trip(m)
    EDITS[edit](u)
    assert u.to_text() != m.to_text()          # the edit shows in the text
    assert not prints_same(u, m)


def test_values_compare_by_type_and_bits():
    m = _fused()
    u = _round_trip(m)
    inst = _first(u, lambda i: "dimensions" in i.attrs)
    dims = inst.attrs["dimensions"]
    inst.attrs["dimensions"] = list(dims)       # prints the same, but not provably: False
    assert not prints_same(u, m)
    inst.attrs["dimensions"] = dims
    assert prints_same(u, m)
