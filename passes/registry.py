"""Imports every built-in pass so that each registers its name."""
from . import constant_folding, control_flow_simplify, cse, dce, flatten_call_graph, inline, simplify, tuple_simplify  # noqa: F401
from . import layout_assignment, layout_normalization  # noqa: F401
from . import spmd  # noqa: F401  (sharding-propagation, spmd-partitioner)
from . import collective_combiner  # noqa: F401  (all-reduce-combiner)
from . import dot_merger, fusion, gather_sinking, split_reductions  # noqa: F401  (dot-merger, fusion, sink-gathers, split-reductions)
from . import dataflow, scheduling  # noqa: F401  (copy-insertion, schedule)
from . import async_collectives, latency_hiding_scheduler  # noqa: F401,E402  (async pairs, LHS)
