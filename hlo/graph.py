"""HLO as a networkx graph, and what the viewer and reports read off one instruction.

``computation.to_networkx()`` / ``module.to_networkx()`` return a ``networkx.MultiDiGraph``
(two edges when an instruction reads the same operand twice, as ``multiply(x, x)``):

- nodes are instruction names (unique in a module), with attributes ``opcode``, ``shape``
  (text, with layout), ``bytes`` (array leaves of the result), ``fusion_kind`` (``kLoop``,
  ``kInput``, ... or ``None``), ``sharding`` (text or ``None``), ``computation`` (its
  name), ``calls`` (names of the computations it calls), ``op_name``, ``source``
  (``file:line`` or ``None``) and ``is_root``;
- edges go operand -> user with ``operand_index``; a module graph also has one edge per
  call, from the caller to the called computation's root, with ``calls`` set to the
  attribute that names it (``body``, ``condition``, ``calls``, ``to_apply`` ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .attrs import COMPUTATION_ATTRS
from .shape import AnyShape, leaf_paths

if TYPE_CHECKING:
    import networkx

    from .ir import Computation, Instruction, Module


def array_bytes(shape: AnyShape) -> int:
    """Bytes of the array leaves of ``shape`` (tokens and tuple tables not counted)."""
    return sum(s.byte_size for _, s in leaf_paths(shape) if s.is_array)


def source_location(inst: "Instruction") -> Optional[str]:
    """``file:line`` from the metadata: ``source_file``/``source_line``, or XLA's
    ``stack_frame_id`` resolved through the module's ``StackFrames`` sections."""
    md = inst.metadata
    if md.get("source_file"):
        line = md.get("source_line")
        return f"{md.get('source_file')}:{line}" if line is not None else str(md.get("source_file"))
    frame = md.get("stack_frame_id")
    module = inst.parent.parent if inst.parent is not None else None
    if frame is None or module is None or not module.sections:
        return None
    return _frame_location(module, int(frame))


def _section(module: "Module", title: str) -> dict[int, str]:
    return dict(module.sections.get(title, ()))


def _fields(text: str) -> dict[str, str]:
    """``{file_name_id=2 function_name_id=2 line=14 ...}`` -> {key: value}."""
    out = {}
    for part in text.strip().strip("{}").split():
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def _frame_location(module: "Module", frame_id: int) -> Optional[str]:
    frames, locations = _section(module, "StackFrames"), _section(module, "FileLocations")
    files = _section(module, "FileNames")
    frame = frames.get(frame_id)
    if frame is None:
        return None
    loc = locations.get(int(_fields(frame).get("file_location_id", -1)))
    if loc is None:
        return None
    f = _fields(loc)
    name = files.get(int(f.get("file_name_id", -1)), "?").strip().strip('"')
    return f"{name}:{f.get('line', '?')}"


def node_attributes(inst: "Instruction") -> dict[str, Any]:
    """What ``to_networkx`` puts on a node."""
    return {
        "opcode": inst.opcode,
        "shape": inst.shape.to_text(),
        "bytes": array_bytes(inst.shape),
        "fusion_kind": inst.attrs.get("kind") if inst.opcode == "fusion" else None,
        "sharding": None if inst.sharding is None else str(inst.sharding),
        "computation": inst.parent.name if inst.parent is not None else None,
        "calls": [c.name for c in inst.called_computations],
        "op_name": inst.metadata.get("op_name"),
        "source": source_location(inst),
        "is_root": inst.is_root,
    }


def _add_computation(g: "networkx.MultiDiGraph", comp: "Computation") -> None:
    for inst in comp.instructions:
        g.add_node(inst.name, **node_attributes(inst))
    for inst in comp.instructions:
        for k, op in enumerate(inst.operands):
            g.add_edge(op.name, inst.name, operand_index=k)


def computation_to_networkx(comp: "Computation") -> "networkx.MultiDiGraph":
    import networkx as nx
    g = nx.MultiDiGraph(name=comp.name)
    _add_computation(g, comp)
    return g


def module_to_networkx(module: "Module") -> "networkx.MultiDiGraph":
    import networkx as nx
    g = nx.MultiDiGraph(name=module.name, entry=module.entry.name if module.entry else None)
    for comp in module.computations:
        _add_computation(g, comp)
    for inst in module.all_instructions():
        for attr in COMPUTATION_ATTRS:
            v = inst.attrs.get(attr)
            callees = v if isinstance(v, (tuple, list)) else [v]
            for c in callees:
                if getattr(c, "root", None) is not None:
                    g.add_edge(c.root.name, inst.name, calls=attr)
    return g
