"""SPMD partitioning: ``sharding-propagation`` and ``spmd-partitioner``.

    passes.run_pipeline(module, "sharding-propagation,spmd-partitioner")

turns a module whose parameters/root/constraints carry shardings into the program each
device runs, with the collectives XLA's SPMD partitioner would insert.
"""
from .tiling import SpmdError, Tiling  # noqa: F401
from .propagation import ShardingPropagation, propagate  # noqa: F401
from .partitioner import COLLECTIVES, SpmdPartitioner, collective_stats  # noqa: F401
from . import control, handlers, indexing  # noqa: F401,E402  (register the op rules)
