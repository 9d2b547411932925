"""The reference interpreter's driver: walks a computation and dispatches on the op table.

Values are numpy arrays whose dtype is the instruction's element type (ml_dtypes for bf16,
f8 and sub-byte ints) and whose shape is the logical shape; tuples are Python tuples; a
token is ``TOKEN``. Each op's rule is attached to the op table as ``OpDef.evaluate`` by the
modules in this package and is called as ``rule(inst, operand_values, ctx)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import EvaluationError, HlotkError
from ..ir import Computation, Instruction, Module
from ..shape import AnyShape


NUMERICS_MODES = ("xla_cpu", "spec")


class _Token:
    def __repr__(self) -> str:
        return "TOKEN"


TOKEN = _Token()
Value = Any  # np.ndarray | tuple[Value, ...] | _Token


@dataclass
class EvalContext:
    """What a rule may need beyond its operands: calling other computations, ids, hooks."""
    evaluator: "Evaluator"
    replica_id: int = 0
    partition_id: int = 0
    num_replicas: int = 1
    num_partitions: int = 1
    # Collectives across simulated devices: ``collective(inst, value) -> value``. The
    # single-device default treats every group as {this device}.
    collective: Optional[Callable[[Instruction, Sequence[Value]], Value]] = None
    # Custom-call targets the host registered (name -> fn(inst, operands, ctx) -> value).
    custom_calls: dict[str, Callable] = field(default_factory=dict)
    rng_state: int = 0
    # Which numerics to follow where XLA:CPU and the StableHLO spec disagree:
    # "xla_cpu" (default): results equal jax.jit on the CPU (subnormals flushed to zero by
    # DAZ/FTZ, reduce-precision keeps NaN); "spec": the StableHLO spec and its reference
    # interpreter (gradual underflow, NaN to a 0-mantissa format becomes +inf).
    numerics: str = "xla_cpu"

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS_MODES:
            raise EvaluationError(f"unknown numerics mode {self.numerics!r}; expected one of "
                                  f"{', '.join(NUMERICS_MODES)}")

    @property
    def flush_denormals(self) -> bool:
        """Whether float arithmetic treats subnormal inputs and results as zero."""
        return self.numerics == "xla_cpu"

    def call(self, comp: Computation, args: Sequence[Value]) -> Value:
        return self.evaluator.run_computation(comp, list(args), self)


class Evaluator:
    """Runs computations instruction by instruction. Stateless apart from its options."""

    def __init__(self, trace: Optional[Callable[[Instruction, Value], None]] = None):
        self.trace = trace
        self._within_limits: set[int] = set()   # computations whose shapes were checked

    def _check_limits(self, comp: Computation) -> None:
        # Once per computation and evaluator: a loop body is checked once, not per trip.
        if id(comp) in self._within_limits:
            return
        from ..limits import check_shape
        for inst in comp.instructions:
            check_shape(f"instruction %{inst.name} in %{comp.name}", inst.shape)
        self._within_limits.add(id(comp))

    def run_computation(self, comp: Computation, args: list[Value], ctx: EvalContext) -> Value:
        if len(args) != len(comp.parameters):
            raise EvaluationError(f"%{comp.name} takes {len(comp.parameters)} arguments, "
                                  f"got {len(args)}")
        self._check_limits(comp)
        env: dict[int, Value] = {}
        for p, a in zip(comp.parameters, args):
            env[id(p)] = a
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            rule = inst.op.evaluate
            if rule is None:
                raise EvaluationError(f"the interpreter has no rule for {inst.opcode} "
                                      f"(instruction %{inst.name})")
            operands = [env[id(o)] for o in inst.operands]
            try:
                value = rule(inst, operands, ctx)
            except HlotkError as e:
                if f"%{inst.name}" in str(e):
                    raise
                raise type(e)(f"evaluating %{inst.name} ({inst.opcode}): {e}") from e
            except (ValueError, TypeError, IndexError, ArithmeticError) as e:
                raise EvaluationError(f"evaluating %{inst.name} ({inst.opcode}): "
                                      f"{type(e).__name__}: {e}") from e
            if self.trace is not None:
                self.trace(inst, value)
            env[id(inst)] = value
        assert comp.root is not None
        return env[id(comp.root)]


def evaluate(module_or_comp: Module | Computation, args: Sequence[Any], **ctx_options: Any) -> Value:
    """Run the entry computation (or the given computation) on numpy arguments.

    Arguments are converted to each parameter's element type; tuples stay tuples.
    ``ctx_options`` are EvalContext fields, e.g. ``numerics="spec"`` for the StableHLO
    spec's numerics instead of XLA:CPU's (see EvalContext.numerics).
    """
    comp = module_or_comp.entry if isinstance(module_or_comp, Module) else module_or_comp
    if comp is None:
        raise EvaluationError("module has no entry computation")
    ev = Evaluator()
    ctx = EvalContext(ev, **ctx_options)
    conv = [to_value(a, p.shape) for a, p in zip(args, comp.parameters)] if len(args) == len(
        comp.parameters) else list(args)
    return ev.run_computation(comp, conv, ctx)


def to_value(x: Any, shape: AnyShape) -> Value:
    """Convert a Python/numpy/JAX value to the interpreter's representation of ``shape``."""
    if shape.is_tuple:
        return tuple(to_value(v, s) for v, s in zip(x, shape.elements))
    if shape.is_token:
        return TOKEN
    arr = np.asarray(x)
    if arr.dtype != shape.dtype.np_dtype:
        arr = arr.astype(shape.dtype.np_dtype)
    return arr.reshape(shape.dims)
