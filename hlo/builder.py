"""Building HLO by hand: ``Builder`` appends instructions with inferred shapes.

    b = Builder("main")
    x = b.parameter(array("f32", (4, 8)))
    y = b.tanh(b.add(x, x))
    module = b.module(root=y)

Any opcode is a method (``-`` spelled ``_``): ``b.get_tuple_element(t, index=0)``. Keyword
arguments are attributes in XLA's names; ``shape=`` overrides inference.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import dtypes as dt
from .errors import ShapeError
from .ir import Computation, Instruction, Module
from .ops import get_op
from .shape import AnyShape, Shape


def infer_shape(opcode: str, operands: list[Instruction] | list[AnyShape],
                attrs: dict[str, Any]) -> AnyShape:
    """The result shape of ``opcode`` on these operands/attributes (op table's ``infer``)."""
    op = get_op(opcode)
    if op.infer is None:
        raise ShapeError(f"{opcode}: no shape inference rule; pass shape= explicitly")
    shapes = [o.shape if isinstance(o, Instruction) else o for o in operands]
    return op.infer(shapes, attrs)


class Builder:
    def __init__(self, name: str = "main", module: Optional[Module] = None):
        self.computation = Computation(name)
        self._module = module
        if module is not None:
            module.add_computation(self.computation)

    # --- generic ------------------------------------------------------------------------
    def op(self, opcode: str, *operands: Instruction, shape: Optional[AnyShape] = None,
           name: Optional[str] = None, **attrs: Any) -> Instruction:
        if shape is None:
            shape = infer_shape(opcode, list(operands), attrs)
        inst = Instruction(opcode, operands, shape, attrs)
        return self.computation.add_instruction(inst, name=name)

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        opcode = attr.replace("_", "-")
        get_op(opcode)  # AttributeError-like failure for typos, with a clear message

        def make(*operands: Instruction, **kw: Any) -> Instruction:
            return self.op(opcode, *operands, **kw)
        make.__name__ = attr
        return make

    # --- leaves -------------------------------------------------------------------------
    def parameter(self, shape: AnyShape, name: Optional[str] = None,
                  number: Optional[int] = None, **attrs: Any) -> Instruction:
        n = len(self.computation.parameters) if number is None else number
        inst = Instruction("parameter", (), shape, attrs, parameter_number=n)
        return self.computation.add_instruction(inst, name=name or f"p{n}")

    def constant(self, value: Any, dtype: dt.DType | str | None = None,
                 name: Optional[str] = None) -> Instruction:
        if isinstance(dtype, str):
            dtype = dt.by_name(dtype)
        arr = np.asarray(value)
        if dtype is None:
            if arr.dtype == np.float64 and arr.ndim == 0 and not isinstance(value, np.generic):
                dtype = dt.F32
            elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)):
                dtype = dt.S32
            else:
                dtype = dt.from_numpy(arr.dtype)
        arr = arr.astype(dtype.np_dtype)
        inst = Instruction("constant", (), Shape(dtype, arr.shape), literal=arr)
        return self.computation.add_instruction(inst, name=name or "constant")

    # --- finishing ----------------------------------------------------------------------
    def build(self, root: Optional[Instruction] = None) -> Computation:
        comp = self.computation
        comp.root = root if root is not None else comp.instructions[-1]
        return comp

    def module(self, root: Optional[Instruction] = None, name: Optional[str] = None,
               called: tuple[Computation, ...] = ()) -> Module:
        """Finish as the entry of a new module (with ``called`` computations before it)."""
        comp = self.build(root)
        m = Module(name or comp.name)
        for c in called:
            if c.parent is None:
                m.add_computation(c)
        m.add_computation(comp, entry=True)
        return m
