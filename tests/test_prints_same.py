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


# --- structure_key: the same computation up to instruction names (issue 13) -----------------
def _fused_comp(m: hlo.Module) -> hlo.Computation:
    return next(c for c in m.computations if c.fusion_instruction is not None)


def _renamed(m: hlo.Module) -> hlo.Module:
    u = _round_trip(m)
    for k, inst in enumerate(i for c in u.computations for i in c.instructions):
        inst.name = f"other.{k}"
        if "metadata" in inst.attrs:
            inst.attrs["metadata"] = Metadata((("op_name", f"elsewhere/{k}"),))
    return u


def test_structure_key_ignores_instruction_names_and_metadata():
    from hlo.same import structure_key
    m = _fused()
    u = _renamed(m)
    for a, b in zip(m.computations, u.computations):
        assert structure_key(a) == structure_key(b), a.name
        assert hash(structure_key(a)) == hash(structure_key(b))
    assert not prints_same(u, m)                      # the names do show in the text


# The edits above that change a computation's structure (names and metadata aside; the
# "attribute order" edit there may only move metadata).
STRUCTURAL = ("opcode", "layout", "operand order", "literal bit", "attribute value", "root")


@pytest.mark.parametrize("edit", STRUCTURAL)
def test_structure_key_sees_every_other_change(edit):
    from hlo.same import structure_key
    m = _fused()
    u = _round_trip(m)
    EDITS[edit](u)
    before = [structure_key(c) for c in m.computations]
    after = [structure_key(c) for c in u.computations]
    assert before != after


def test_structure_key_values_by_type_and_bits():
    from hlo.same import attrs_key, structure_key
    m = _fused()
    u = _round_trip(m)
    inst = _first(u, lambda i: "dimensions" in i.attrs)
    comp = inst.parent
    key = structure_key(comp)
    inst.attrs["dimensions"] = list(inst.attrs["dimensions"])     # a list is not a tuple
    assert structure_key(comp) != key
    # -0.0 == 0.0 in Python, but the two print differently
    assert attrs_key({"x": -0.0}) != attrs_key({"x": 0.0})
    assert attrs_key({"x": 1}) != attrs_key({"x": 1.0}) != attrs_key({"x": True})
    assert attrs_key({"x": 1, "y": 2}) != attrs_key({"y": 2, "x": 1})     # printed in order
    assert attrs_key({"x": 1, "metadata": Metadata((("op_name", "a"),))}) == attrs_key({"x": 1})
    # a called computation counts by its name too (a kernel names its combiner after it)
    renamed = _round_trip(m)
    assert structure_key(renamed.entry) == structure_key(m.entry)
    _fused_comp(renamed).name = "renamed_body"
    assert structure_key(renamed.entry) != structure_key(m.entry)


def test_structure_key_refuses_what_it_cannot_hash():
    from hlo.same import attrs_key

    class Opaque:
        __hash__ = None                 # type: ignore[assignment]
    with pytest.raises(TypeError):
        attrs_key({"x": Opaque()})
