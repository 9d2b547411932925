"""Caches of the import and the printer (issue 13): the importer reads each distinct MLIR
location once (``importer._metadata``), a shape and a metadata record print once; none of
them changes the imported module or its text."""
from __future__ import annotations

import pickle

import jax.numpy as jnp
import numpy as np

import hlo
from hlo.attrs import Metadata
from hlo.shape import Layout, Shape
from hlo.stablehlo import importer, mlir_utils


def _step(ps, gs):
    """Per-parameter updates on one source line each: many ops, few locations."""
    return {k: ps[k] - 0.1 * jnp.sqrt(gs[k] * gs[k] + 1e-8) for k in ps}


def _args():
    shapes = {"a": (4, 3), "b": (3,), "c": (2, 5), "d": (7,)}
    tree = {k: np.ones(s, np.float32) for k, s in shapes.items()}
    return tree, tree


def test_locations_read_once_and_the_module_unchanged(monkeypatch):
    exported = importer.export_jax(_step, *_args())
    reads: list = []
    real = importer.location_metadata
    monkeypatch.setattr(importer, "location_metadata", lambda loc: reads.append(1) or real(loc))
    cached = importer.from_exported(exported)
    n_cached = len(reads)
    # every op through location_metadata, as before the cache
    monkeypatch.setattr(importer, "_metadata", lambda imp, loc: real(loc))
    plain = importer.from_exported(exported)
    text = cached.to_text()
    assert text == plain.to_text() and "source_line=" in text and 'op_name="' in text
    ops = sum(len(c.instructions) - len(c.parameters) for c in plain.computations)
    assert 0 < n_cached < ops / 3
    for c, d in zip(cached.computations, plain.computations):
        assert [i.attrs.get("metadata") for i in c.instructions] == \
            [i.attrs.get("metadata") for i in d.instructions]


def test_importer_metadata_is_location_metadata():
    exported = importer.export_jax(_step, *_args())
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as sh
    ctx = mlir_utils.make_context()
    with ctx, ir.Location.unknown():
        mod = sh.deserialize_portable_artifact(ctx, exported.mlir_module_serialized)
        imp = importer.Importer("m")
        ops = [op for f in mod.body.operations for op in f.regions[0].blocks[0].operations]
        assert len(ops) > 20
        for op in ops + ops:             # the second pass: every location from the cache
            assert importer._metadata(imp, op.location) == \
                mlir_utils.location_metadata(op.location)
        assert importer._metadata(imp, ir.Location.unknown()) is None


def test_shape_text_cached_per_layout_choice_and_through_pickle():
    s = Shape(hlo.dtypes.by_name("f32"), (2, 3), Layout((0, 1)))
    assert s.to_text() == "f32[2,3]{0,1}"
    assert s.to_text(False) == "f32[2,3]" and s.to_text() == "f32[2,3]{0,1}"
    t = Shape(hlo.dtypes.by_name("f32"), (2, 3), Layout((1, 0)))
    assert s != t and str(t) == "f32[2,3]{1,0}" and str(s) == "f32[2,3]{0,1}"
    back = pickle.loads(pickle.dumps(s))
    assert back == s and hash(back) == hash(s) and back.to_text() == "f32[2,3]{0,1}"
    assert s == Shape(hlo.dtypes.by_name("f32"), (2, 3), Layout((0, 1)))   # text not compared


def test_metadata_text_cached():
    m = Metadata((("op_name", 'jit(f)/a"b'), ("source_line", 3), ("flag", True)))
    want = '{op_name="jit(f)/a\\"b" source_line=3 flag=true}'
    assert str(m) == want and str(m) == want
    assert pickle.loads(pickle.dumps(m)) == m and str(pickle.loads(pickle.dumps(m))) == want
    assert m == Metadata(m.fields) and hash(m) == hash(Metadata(m.fields))


def test_parameter_shape_error_still_names_its_location():
    """A parameter's shape is read with its location made only for an error message."""
    import pytest
    src = """
    func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
      %0 = stablehlo.negate %a : tensor<?xf32>
      return %0 : tensor<?xf32>
    }"""
    with pytest.raises(hlo.ImportError, match=r"^-:2:21: dynamic shapes are not supported") as e:
        hlo.from_stablehlo(src)
    assert e.value.location == "-:2:21"


def test_copy_shares_immutable_attributes_only():
    """``Module.copy`` keeps immutable attribute values (metadata records) as they are and
    deep-copies the rest, sharing preserved within the copy."""
    m = importer.from_exported(importer.export_jax(_step, *_args()))
    insts = [i for i in m.entry.instructions if "metadata" in i.attrs]
    shared = ["a", "list"]
    insts[0].attrs["x"] = shared
    insts[1].attrs["x"] = shared
    c = m.copy()
    by_name = {i.name: i for i in c.entry.instructions}
    first, second = by_name[insts[0].name], by_name[insts[1].name]
    assert first.attrs["metadata"] is insts[0].attrs["metadata"]
    assert first.attrs["x"] == shared and first.attrs["x"] is not shared
    assert first.attrs["x"] is second.attrs["x"]          # one copy, as deepcopy's memo
    first.attrs["x"].append("changed")
    assert shared == ["a", "list"]
