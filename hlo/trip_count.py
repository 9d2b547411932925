"""The trip count of a ``while`` loop that counts, as ``lax.scan`` and ``lax.fori_loop``
with static bounds lower: an integer element ``i`` of the loop state starts at a constant,
the body adds a positive constant to it and nothing else writes it, and the condition
compares it with a constant (``i < n``, ``i <= n``, ``n > i``, ``n >= i``, ``i != n``).

The CUDA runtime then runs the body that many times without reading the predicate back
(runtime/cuda/thunks.py ``CountedLoopThunk``): one CUDA graph can hold the whole loop.
Anything the analysis does not recognize gives None (the loop stays host-driven).
"""
from __future__ import annotations

from typing import Optional

from .ir import Instruction

# i OP n is true while ... (as a function of i, n), for the constant on the right.
_KEEPS_GOING = {"LT": lambda i, n: i < n, "LE": lambda i, n: i <= n,
                "GT": lambda i, n: i > n, "GE": lambda i, n: i >= n,
                "NE": lambda i, n: i != n}
_MIRROR = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}
MAX_TRIPS = 1 << 20


def _through_copies(inst: Instruction) -> Instruction:
    """Copy insertion puts copies on a loop's initial state and on what its body returns."""
    while inst.opcode == "copy" and inst.operands:
        inst = inst.operands[0]
    return inst


def _int_constant(inst: Instruction) -> Optional[int]:
    inst = _through_copies(inst)
    if inst.opcode != "constant" or inst.literal is None or inst.shape.is_tuple or \
            inst.shape.dims or not inst.shape.dtype.is_integer:
        return None
    return int(inst.literal)


def _state_element(inst: Instruction, param: Instruction) -> Optional[int]:
    """k when ``inst`` is get-tuple-element(param, k)."""
    if inst.opcode == "get-tuple-element" and inst.operands[0] is param:
        return int(inst.attrs["index"])
    return None


def _initial(init: Instruction, k: int) -> Optional[int]:
    if init.opcode == "tuple" and k < len(init.operands):
        return _int_constant(init.operands[k])
    if init.opcode == "constant" and isinstance(init.literal, tuple) and k < len(init.literal):
        return int(init.literal[k])
    return None


def known_trip_count(loop: Instruction) -> Optional[int]:
    """How many times ``loop``'s body runs, or None when it is not a counted loop."""
    if loop.opcode != "while" or not loop.shape.is_tuple:
        return None
    cond, body = loop.attrs.get("condition"), loop.attrs.get("body")
    if cond is None or body is None or not cond.parameters or not body.parameters:
        return None
    root = cond.root
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = str(root.attrs.get("direction", ""))
    a, b = root.operands
    k, bound = _state_element(a, cond.parameters[0]), _int_constant(b)
    if k is None or bound is None:
        k, bound = _state_element(b, cond.parameters[0]), _int_constant(a)
        direction = _MIRROR.get(direction, "")
    if k is None or bound is None or direction not in _KEEPS_GOING:
        return None
    body_root = body.root
    if body_root is None or body_root.opcode != "tuple" or k >= len(body_root.operands):
        return None
    step_inst = _through_copies(body_root.operands[k])
    if step_inst.opcode != "add":
        return None
    x, y = step_inst.operands
    step = _int_constant(y) if _state_element(x, body.parameters[0]) == k else \
        _int_constant(x) if _state_element(y, body.parameters[0]) == k else None
    start = _initial(loop.operands[0], k)
    if step is None or step <= 0 or start is None:
        return None
    keeps_going = _KEEPS_GOING[direction]
    if direction in ("GT", "GE") or (direction == "NE" and (
            bound < start or (bound - start) % step)):
        return None              # counting up: such a loop never ends or never starts
    bits = loop.shape.elements[k].dtype.bits
    if bound + step >= 1 << (bits - 1):
        return None              # the counter could wrap before the compare fails
    trips = 0
    if keeps_going(start, bound):
        last = bound if direction == "LE" else bound - 1
        trips = (last - start) // step + 1
    return trips if trips <= MAX_TRIPS else None
