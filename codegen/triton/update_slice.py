"""In-place dynamic-update-slice: a fusion whose root writes an update into a window of a
parameter it reads nowhere else (a scan's stacked outputs, a KV cache's new position)
becomes a kernel over the update's elements alone, storing each at its place in the
output. The output must then hold the operand's values already: buffer assignment gives a
dynamic-update-slice its operand's buffer where it can (passes/dataflow.py), and the CUDA
runtime copies the operand there first where it did not (``Plan.in_place`` names the
parameter; runtime/cuda/backend.py).

The loop template computes every output element (``select(in window, update, operand)``):
a scan of 128 steps writing one [64, 512] row of a [128, 64, 512] stack per step moved the
whole stack twice per step, 128 times (an LSTM's gradient: 40 ms of device time).
"""
from __future__ import annotations

import math

from hlo.ir import Computation

from .elemental import Emitter
from .templates import NotTileable, Plan, _store, clamp_if, next_pow2


def update_slice_template(em: Emitter, comp: Computation, big: bool) -> Plan:
    root = comp.root
    if root.opcode != "dynamic-update-slice" or root.shape.is_tuple:
        raise NotTileable("the root is not a dynamic-update-slice")
    operand, update = root.operands[0], root.operands[1]
    if operand.opcode != "parameter" or len(operand.users) != 1:
        raise NotTileable("the updated operand is computed here or read elsewhere")
    dims = update.shape.dims
    n = math.prod(dims)
    em.line("pid = tl.program_id(0)")
    em.line(f"offs = pid{'.to(tl.int64)' if big else ''} * BLOCK + tl.arange(0, BLOCK)",
            "flat indices of this program's update elements")
    mask = em.assign("mask", f"offs < {n}")
    lin = em.fresh("lin")
    clamp_if(em, lin, "offs", n, "BLOCK")
    local = em.delinearize("u", lin, dims)
    starts = em._starts(root, 2, dims)         # clamped into the operand, as XLA does
    # A dim the update holds once has the constant index 0: ``lin * 0`` keeps the store's
    # address a block like its mask (Triton rejects a scalar pointer with a block mask).
    at = tuple(em.assign("o", f"{i} + {s}" + (f" + {lin} * 0" if str(i).strip().isdigit()
                                               else "")) for i, s in zip(local, starts))
    _store(em, 0, root, em.value(update, tuple(local)), at, mask)
    block = min(1024, max(16, next_pow2(n)))
    cfg = {"BLOCK": block, "num_warps": 4 if block >= 512 else 2, "num_stages": 1}
    plan = Plan("update_slice", ["BLOCK"], cfg, lambda c: (max(1, -(-n // c["BLOCK"])),), [cfg])
    plan.in_place = operand.parameter_number
    return plan
