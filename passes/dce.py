"""Dead code elimination: drop instructions nothing needs, then unreachable computations."""
from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Module

from .base import register_pass


@register_pass
@dataclass(frozen=True)
class DCE:
    """Remove instructions whose results reach no root and that have no side effects."""
    name = "dce"
    remove_computations: bool = True

    def run(self, module: Module) -> bool:
        removed = 0
        for comp in module.computations:
            removed += comp.remove_dead()
        if self.remove_computations:
            removed += module.remove_unreachable_computations()
        return removed > 0
