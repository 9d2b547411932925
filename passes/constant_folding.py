"""Constant folding through the reference interpreter, with a size limit.

An instruction whose operands are all constants is evaluated and replaced by a constant,
unless its result would be larger than ``max_elements`` (folding a broadcast of a scalar
into a huge literal makes the program bigger, not faster; XLA avoids that too).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hlo.errors import HlotkError
from hlo.ir import Instruction, Module

from .base import register_pass

_NEVER_FOLD = {"parameter", "constant", "rng", "rng-bit-generator", "rng-get-and-update-state",
               "custom-call", "infeed", "recv", "send", "outfeed", "after-all", "replica-id",
               "partition-id", "while", "conditional", "call", "fusion", "async-start",
               "optimization-barrier", "all-reduce", "all-gather", "reduce-scatter",
               "all-to-all", "collective-permute", "collective-broadcast", "tuple",
               "get-tuple-element"}


@register_pass
@dataclass(frozen=True)
class ConstantFolding:
    name = "constant-folding"
    max_elements: int = 1024

    def run(self, module: Module) -> bool:
        from hlo.evaluator import EvalContext, Evaluator
        ctx = EvalContext(Evaluator())
        changed = False
        for comp in module.computations:
            for inst in list(comp.instructions):
                if inst.parent is not comp or not self._foldable(inst):
                    continue
                try:
                    value = inst.op.evaluate(inst, [o.literal for o in inst.operands], ctx)
                except HlotkError:
                    continue  # leave it for run time, where the error names the inputs
                literal = np.asarray(value).astype(inst.shape.dtype.np_dtype)
                const = Instruction("constant", [], inst.shape, literal=literal,
                                    name=inst.name)
                md = inst.attrs.get("metadata")
                if md is not None:
                    const.attrs["metadata"] = md
                comp.replace_instruction(inst, const)
                changed = True
        return changed

    def _foldable(self, inst: Instruction) -> bool:
        # The operands first: most instructions read a non-constant, and this test is the
        # cheapest (the tests are pure: their order changes no answer).
        for o in inst.operands:
            if o.opcode != "constant" or o.literal is None or isinstance(o.literal, tuple):
                return False
        if inst.opcode in _NEVER_FOLD or inst.shape.is_tuple or inst.is_side_effecting:
            return False
        if inst.op.evaluate is None or not inst.shape.is_array:
            return False
        if inst.opcode == "iota" or inst.opcode == "broadcast":
            # Materializing these only makes the literal bigger.
            return inst.shape.size <= 1
        return inst.shape.size <= self.max_elements
