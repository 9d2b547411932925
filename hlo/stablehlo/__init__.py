"""Import StableHLO / JAX programs into hlotk's HLO IR (see ``importer``)."""
from .importer import from_exported, from_jax, from_stablehlo  # noqa: F401
