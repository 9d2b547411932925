"""Partitioning rules of control flow: while loops with a sharded state, and manual
computations (``shard_map``) kept per-device.

**While.** ``sharding-propagation`` gave the loop state one tuple sharding (on the while,
its body's parameter and root, its condition's parameter). The initial state is
resharded to it, the body and the condition are partitioned as computations of their own
(their parameter's elements split that way, the body's root resharded back to it, the
condition's predicate whole), and the loop runs on every device on its pieces: a scan
over layers keeps its activations and stacked weights split, with the collectives of one
layer inside the body.

**Manual computations.** ``sdy.manual_computation`` (and the older custom-call form) reach
the partitioner as ``Sharding`` -> ``SPMDFullToShardShape`` -> body ->
``SPMDShardToFullShape``. The body's instructions already have per-device shapes and
their own collectives (a ``psum`` is an all-reduce over device ids, a ``ppermute`` a
collective-permute): they are copied as they are. The full-to-shard takes the operand
resharded to the manual computation's in-sharding, whose local piece is the body's
argument; the shard-to-full declares the body's result to be the local piece of an array
split by the out-sharding. A body manual over some mesh axes only (``axis_names``) runs
whole along the others: every device of such a group computes the same piece (correct;
XLA would also split it along the automatic axes). The older GSPMD spelling of that case
(``last_tile_dims={manual}``) is refused with an error.
"""
from __future__ import annotations

from typing import Any

from hlo.ir import Computation, Instruction
from hlo.sharding import Sharding
from hlo.shape import TupleShape

from .partitioner import MANUAL, Partitioner, Value, handler
from .propagation import manual_region
from .tiling import SpmdError, Tiling


# --- while -----------------------------------------------------------------------------
@handler("while")
def while_loop(p: Partitioner, inst: Instruction) -> Value:
    s = inst.sharding
    init = p.vals[id(inst.operands[0])]
    shapes = inst.shape.elements
    if not (isinstance(s, Sharding) and s.is_tuple and isinstance(init.tiling, tuple)
            and all(not e.is_tuple and not e.is_token for e in shapes)
            and all(isinstance(e.tiling, Tiling) for e in init.tiling)):
        return p.fallback(inst)
    state = [Tiling.from_sharding(e, len(g.dims), p.n) for e, g in zip(s.elements, shapes)]
    parts = [p.reshard(e.inst, e.tiling, t, g) for e, t, g in zip(init.tiling, state, shapes)]
    local = TupleShape(tuple(x.shape for x in parts))
    body = _computation(p, inst.attrs["body"], state, local, root_state=True)
    cond = _computation(p, inst.attrs["condition"], state, local, root_state=False)
    new = p.add("while", [p.add("tuple", parts, local)], local,
                {"condition": cond, "body": body}, name=inst.name)
    return p.tuple_value(new, state, inst.shape)


def _computation(p: Partitioner, comp: Computation, state: list[Tiling], local: TupleShape,
                 root_state: bool) -> Computation:
    """``comp`` (one parameter: the loop state) partitioned: its root resharded to the
    state (a body) or whole (a condition)."""
    new = Computation(p.module.unique_computation_name(comp.name + "_spmd"))
    old_param = comp.parameters[0]
    p.manual |= manual_region(comp)
    with p.scope(new):
        param = p.add("parameter", [], local, name=old_param.name, parameter_number=0)
        p.vals[id(old_param)] = p.tuple_value(param, state, old_param.shape)
        for inst in comp.post_order():
            if inst.opcode != "parameter":
                p.vals[id(inst)] = p.partition(inst)
        root = comp.root
        if root_state:
            v = p.vals[id(root)]
            if not isinstance(v.tiling, tuple):
                raise SpmdError(f"while body %{comp.name}: root %{root.name} is not a tuple")
            parts = [p.reshard(e.inst, e.tiling, t, e.global_shape)
                     for e, t in zip(v.tiling, state)]
            new.root = p.add("tuple", parts, local)
        else:
            new.root = p.whole(root)
    p.module.add_computation(new)
    return new


# --- manual computations ---------------------------------------------------------------
@handler("manual")
def manual(p: Partitioner, inst: Instruction) -> Value:
    """An instruction of a manual computation: the same instruction on the values it
    reads (which are per-device already)."""
    target = inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None
    if target == "SPMDFullToShardShape":
        return _full_to_shard(p, inst)
    if target == "Sharding":          # the manual marker before the shard-to-full
        return Value(p.vals[id(inst.operands[0])].inst, MANUAL, inst.shape)
    ops = [p.vals[id(o)].inst if p.vals[id(o)].tiling == MANUAL else p.whole(o)
           for o in inst.operands]
    attrs = {k: v for k, v in inst.attrs.items() if k != "sharding"}
    new = p.add(inst.opcode, ops, inst.shape, attrs, literal=inst.literal, name=inst.name)
    return Value(new, MANUAL, inst.shape)


def _full_to_shard(p: Partitioner, inst: Instruction) -> Value:
    x = inst.operands[0]
    if not (x.opcode == "custom-call" and x.attrs.get("custom_call_target") == "Sharding"):
        raise SpmdError(f"%{inst.name}: SPMDFullToShardShape must read a Sharding custom-call "
                        f"(found {x.opcode})")
    t = Tiling.from_sharding(x.sharding, len(x.shape.dims), p.n)
    piece = p.get(x, t)
    _check_piece(inst, t, x.shape, inst.shape)
    return Value(piece, MANUAL, inst.shape)


def shard_to_full(p: Partitioner, inst: Instruction) -> Value:
    """The manual body's result is the local piece of a value split by the out-sharding."""
    v = p.vals[id(inst.operands[0])]
    if v.tiling != MANUAL:
        raise SpmdError(f"%{inst.name}: SPMDShardToFullShape of a value that is not manual")
    s = inst.sharding
    if isinstance(s, Sharding) and s.kind == "tiled" and s.last_tile_dims:
        raise SpmdError(f"%{inst.name}: partially manual computations (sharding {s}) are not "
                        "partitioned; make every mesh axis manual in shard_map")
    t = Tiling.from_sharding(s, len(inst.shape.dims), p.n)
    _check_piece(inst, t, inst.shape, inst.operands[0].shape)
    return Value(v.inst, t, inst.shape)


def _check_piece(inst: Instruction, t: Tiling, full: Any, piece: Any) -> None:
    if tuple(t.local_dims(full.dims)) != tuple(piece.dims) or any(
            n % k for n, k in zip(full.dims, t.tiles)):
        raise SpmdError(f"%{inst.name}: a manual computation's piece {list(piece.dims)} is not "
                        f"an even split of {list(full.dims)} into {list(t.tiles)} tiles")

