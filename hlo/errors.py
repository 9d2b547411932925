"""The project's exception types.

Every error a user can cause (bad text, bad MLIR, a bad call) is raised as one of these, so
callers can catch ``HlotkError`` and get a message naming what was wrong and where.
"""
from __future__ import annotations


class HlotkError(Exception):
    """Base of every error hlotk raises on purpose."""


class ParseError(HlotkError):
    """Malformed HLO text (or another textual input). Carries line and column (1-based)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 filename: str | None = None, source_line: str | None = None):
        self.message = message
        self.line = line
        self.column = column
        self.filename = filename
        self.source_line = source_line
        where = ""
        if line is not None:
            where = f"{filename or '<text>'}:{line}:{column or 0}: "
        text = where + message
        if source_line is not None and column is not None:
            text += "\n  " + source_line + "\n  " + " " * max(column - 1, 0) + "^"
        super().__init__(text)


class VerifierError(HlotkError):
    """The module breaks an HLO invariant; the message names the instruction."""

    def __init__(self, message: str, instruction: str | None = None,
                 computation: str | None = None):
        self.instruction = instruction
        self.computation = computation
        prefix = ""
        if computation and instruction:
            prefix = f"in %{computation}, instruction %{instruction}: "
        elif instruction:
            prefix = f"instruction %{instruction}: "
        elif computation:
            prefix = f"in %{computation}: "
        super().__init__(prefix + message)


class HloImportError(HlotkError):
    """StableHLO/JAX input that cannot be imported. Exported as ``hlo.ImportError``."""

    def __init__(self, message: str, op: str | None = None, location: str | None = None):
        if location is not None and not isinstance(location, str):
            location = str(location)        # a location made when asked (LazyLocation)
        self.message = message
        self.op = op
        self.location = location
        text = message
        if op:
            text = f"{op}: {text}"
        if location:
            text = f"{location}: {text}"
        super().__init__(text)


class ShapeError(HlotkError):
    """Shape inference failed: operands do not fit the op's rules."""


class EvaluationError(HlotkError):
    """The reference interpreter cannot evaluate an instruction (or its input is invalid)."""


class UnimplementedError(HlotkError):
    """A feature that is valid HLO but not supported yet; names the op or attribute."""


class InvalidArgumentError(HlotkError):
    """A call received arguments that do not match the compiled signature."""
