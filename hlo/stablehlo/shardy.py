"""Shardy (``sdy`` dialect) shardings -> ``hlo.sharding.Sharding``.

JAX puts its shardings in exports as Shardy attributes over named meshes:

    sdy.mesh @mesh = <["data"=2, "model"=4]>
    %arg1: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}
    %2 = sdy.sharding_constraint %1 <@mesh, [{}, {"model"}]> : tensor<8x32xf32>

A dimension lists the mesh axes it is split over, major first; axes no dimension uses
replicate the array. The HLO spelling is a tile assignment: the mesh's device ids
transposed so that each dimension's axes come in order, then the unused axes last
(``last_tile_dim_replicate``). It is printed in iota form (``[1,4,2]<=[2,4]T(1,0)``)
whenever the mesh has no explicit ``device_ids``, merging axes that stay adjacent, as XLA
does. ``sdy.sharding_constraint`` becomes XLA's ``custom-call(x),
custom_call_target="Sharding"``; ``sdy.manual_computation`` becomes the
``SPMDFullToShardShape`` / call / ``SPMDShardToFullShape`` sandwich XLA's importer emits.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..errors import HloImportError
from ..sharding import Sharding


@dataclass(frozen=True)
class Mesh:
    """A Shardy mesh: axis names and sizes (major first), device ids (None = iota)."""
    axes: tuple[tuple[str, int], ...]
    device_ids: Optional[tuple[int, ...]] = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def num_devices(self) -> int:
        if not self.axes and self.device_ids:
            return 1
        return math.prod(self.shape)

    def axis_index(self, name: str) -> int:
        for i, (n, _) in enumerate(self.axes):
            if n == name:
                return i
        raise HloImportError(f"mesh axis {name!r} is not in mesh "
                             f"[{', '.join(f'{n}={s}' for n, s in self.axes)}]")


_MESH_BODY = re.compile(r"<\s*\[(?P<axes>[^\]]*)\]\s*(?:,\s*device_ids\s*=\s*\[(?P<ids>[^\]]*)\])?\s*>")


def parse_mesh(text: str) -> Mesh:
    """``<["data"=2, "model"=4]>`` or ``<["a"=2], device_ids=[1,0]>`` (``mesh`` prefix ok)."""
    m = _MESH_BODY.search(text)
    if m is None:
        raise HloImportError(f"cannot read Shardy mesh {text!r}")
    axes = tuple((n, int(s)) for n, s in re.findall(r'"([^"]+)"\s*=\s*(\d+)', m.group("axes")))
    ids = None
    if m.group("ids") is not None and m.group("ids").strip():
        ids = tuple(int(x) for x in m.group("ids").split(","))
    return Mesh(axes, ids)


def mesh_of_op(op: Any) -> tuple[str, Mesh]:
    """(symbol, Mesh) of a top-level ``sdy.mesh`` operation."""
    from jaxlib.mlir import ir
    sym = ir.StringAttr(op.attributes["sym_name"]).value
    return sym, parse_mesh(str(op.attributes["mesh"]))


# --- one sharding ------------------------------------------------------------------------
_SHARDING = re.compile(r"<\s*(?P<mesh>@[\w.$-]+|mesh\s*<.*?\]\s*(?:,\s*device_ids=\[[^\]]*\])?\s*>)"
                       r"\s*,\s*\[(?P<dims>.*?)\]\s*(?P<rest>(?:,\s*\w+\s*=\s*\{[^}]*\}\s*)*)>",
                       re.S)


def _dim_axes(dim_text: str, where: str) -> list[str]:
    """Axis names of one ``{"a", "b", ?}p1`` dimension, sub-axes rejected clearly."""
    if re.search(r'"\s*:\s*\(', dim_text):
        raise HloImportError(f"Shardy sub-axes ({dim_text.strip()}) are not supported", op=where)
    return re.findall(r'"([^"]+)"', dim_text)


def convert_sharding(text: str, meshes: dict[str, Mesh], where: str = "sdy.sharding") -> Sharding:
    """One ``#sdy.sharding<@mesh, [...]>`` (or ``<@mesh, [...]>``) as an HLO Sharding."""
    m = _SHARDING.search(text)
    if m is None:
        raise HloImportError(f"cannot read Shardy sharding {text!r}", op=where)
    ref = m.group("mesh")
    if ref.startswith("@"):
        mesh = meshes.get(ref[1:])
        if mesh is None:
            raise HloImportError(f"sharding names mesh {ref} but the module has no sdy.mesh "
                                 f"{ref}", op=where)
    else:
        mesh = parse_mesh(ref)
    dims = [_dim_axes(d, where) for d in re.findall(r"\{[^}]*\}", m.group("dims"))]
    return axes_to_sharding(mesh, [[mesh.axis_index(a) for a in d] for d in dims])


def convert_sharding_list(text: str, meshes: dict[str, Mesh], where: str) -> list[Sharding]:
    """Every ``<@mesh, [...]>`` in ``text`` (sharding_per_value, in/out_shardings)."""
    out = []
    for m in _SHARDING.finditer(text):
        out.append(convert_sharding(m.group(0), meshes, where))
    return out


def axes_to_sharding(mesh: Mesh, dim_axes: list[list[int]]) -> Sharding:
    """The HLO sharding splitting array dim i over mesh axes ``dim_axes[i]`` (major first)."""
    if not mesh.axes:   # a maximal mesh: one device
        return Sharding.maximal(mesh.device_ids[0] if mesh.device_ids else 0)
    used = [a for d in dim_axes for a in d]
    if len(set(used)) != len(used):
        raise HloImportError(f"a mesh axis is used twice in sharding {dim_axes}")
    sizes = mesh.shape
    if not used:
        return Sharding.replicated()
    rest = [a for a in range(len(sizes)) if a not in used]
    tiles = [math.prod(sizes[a] for a in d) for d in dim_axes]
    rep = math.prod(sizes[a] for a in rest)
    tile_dims = tiles + ([rep] if rep > 1 else [])
    order = used + rest
    if mesh.device_ids is not None:
        ids = np.asarray(mesh.device_ids).reshape(sizes).transpose(order).reshape(tile_dims)
        return Sharding.tiled(ids, last_tile_dim_replicate=rep > 1)
    reshape, transpose = canonical_iota(sizes, order)
    return Sharding.iota(tile_dims, reshape, transpose, last_tile_dim_replicate=rep > 1)


def canonical_iota(sizes: tuple[int, ...], order: list[int]
                   ) -> tuple[tuple[int, ...], Optional[tuple[int, ...]]]:
    """XLA's canonical ``<=[reshape]T(perm)`` for iota(sizes).transpose(order).

    Size-1 axes are dropped and axes that stay adjacent after the transpose merge, so
    ``[2,4]T(0,1)`` prints as ``[8]`` and no transpose is printed when none is left.
    """
    keep = [a for a in range(len(sizes)) if sizes[a] > 1]
    order = [a for a in order if a in keep]
    # Merge runs a, a+1 (in original numbering, among kept axes) that stay consecutive.
    groups: list[list[int]] = []
    for a in order:
        if groups and keep.index(a) == keep.index(groups[-1][-1]) + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_first = sorted(groups, key=lambda g: g[0])
    reshape = tuple(math.prod(sizes[a] for a in g) for g in by_first) or (1,)
    perm = tuple(by_first.index(g) for g in groups)
    if perm == tuple(range(len(perm))):
        return reshape, None
    return reshape, perm


# --- import hooks (called from importer.py) ---------------------------------------------
def sharding_attr(imp: Any, attr: Any, where: str = "sdy.sharding") -> Any:
    """The value for ``attrs["sharding"]`` of an op/argument carrying ``sdy.sharding``.

    One result: a Sharding; several (``sharding_per_value``): a tuple Sharding.
    """
    meshes = getattr(imp, "sdy_meshes", {})
    text = str(attr)
    shardings = convert_sharding_list(text, meshes, where)
    if not shardings:
        raise HloImportError(f"cannot read Shardy sharding {text!r}", op=where)
    if "sharding_per_value" in text and len(shardings) > 1:
        return Sharding.tuple(shardings)
    return shardings[0]


def _register_rules() -> None:
    from .importer import op_rule
    from .mlir_utils import to_shape

    @op_rule("sdy.sharding_constraint", "sdy.reshard")
    def _constraint(imp, scope, op):
        (x,) = imp.operands(scope, op)
        s = convert_sharding(str(op.attributes["sharding"]), getattr(imp, "sdy_meshes", {}),
                             op.operation.name)
        return imp.emit(scope, "custom-call", [x], x.shape,
                        {"custom_call_target": "Sharding", "sharding": s}, op)

    @op_rule("sdy.manual_computation")
    def _manual(imp, scope, op):
        meshes = getattr(imp, "sdy_meshes", {})
        ins = convert_sharding_list(str(op.attributes["in_shardings"]), meshes,
                                    "sdy.manual_computation")
        outs = convert_sharding_list(str(op.attributes["out_shardings"]), meshes,
                                     "sdy.manual_computation")
        block = op.regions[0].blocks[0]
        local = []
        for x, s, a in zip(imp.operands(scope, op), ins, block.arguments):
            full = imp.emit(scope, "custom-call", [x], x.shape,
                            {"custom_call_target": "Sharding", "sharding": s}, op)
            local.append(imp.emit(scope, "custom-call", [full], to_shape(a.type),
                                  {"custom_call_target": "SPMDFullToShardShape",
                                   "sharding": Sharding.manual()}, op))
        body = imp.region_computation(op.regions[0], "shmap_body")
        res_shapes = [to_shape(r.type) for r in op.results]
        call_shape = body.root.shape
        call = imp.emit(scope, "call", local, call_shape, {"to_apply": body}, op)
        if len(res_shapes) == 1 and not call_shape.is_tuple:
            parts = [call]
        else:
            parts = [imp.emit(scope, "get-tuple-element", [call], call_shape.elements[i],
                              {"index": i}) for i in range(len(res_shapes))]
        results = []
        for p, s, shape in zip(parts, outs, res_shapes):
            # The copy marks the value manual before it goes back to the full shape.
            m = imp.emit(scope, "custom-call", [p], p.shape,
                         {"custom_call_target": "Sharding", "sharding": Sharding.manual()}, op)
            results.append(imp.emit(scope, "custom-call", [m], shape,
                                    {"custom_call_target": "SPMDShardToFullShape",
                                     "sharding": s}, op))
        return results if len(results) != 1 else results[0]


_register_rules()
