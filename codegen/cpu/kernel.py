"""The Kernel object: one generated numpy function for one fusion, ready to call."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hlo.errors import InvalidArgumentError


class Kernel:
    """A compiled fusion. ``kernel(*operands)`` takes the fusion's operands as logical
    numpy arrays and returns an array (a tuple for multi-output fusions).

    ``source``: the generated Python; ``name``: the function's name (after the ops it
    fuses); ``fusion_text``: the fused computation's HLO text it was generated from;
    ``key``: its content hash in the kernel cache.
    """

    def __init__(self, name: str, source: str, fusion_text: str, key: str,
                 fn: Callable[..., Any], num_operands: int):
        self.name = name
        self.source = source
        self.fusion_text = fusion_text
        self.key = key
        self._fn = fn
        self.num_operands = num_operands

    def __call__(self, *operands: np.ndarray) -> np.ndarray | tuple:
        if len(operands) != self.num_operands:
            raise InvalidArgumentError(f"kernel {self.name} takes {self.num_operands} operands, "
                                       f"got {len(operands)}")
        return self._fn(*operands)

    def __repr__(self) -> str:
        return f"<Kernel {self.name} ({self.num_operands} operands) key={self.key[:12]}>"
