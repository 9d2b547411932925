"""May these be one kernel? XLA's fusion rules, each "no" with a reason.

Legality is apart from profitability: a policy asks ``can_merge`` / ``can_duplicate`` /
``can_fuse_siblings`` and gets a ``Decision``; it never has to know why fusing a reduction
into its consumer or duplicating an ``exp`` is not allowed.

The rules (XLA's, simplified where noted):
- some instructions never fuse: parameters, big constants, tuples, control flow, calls,
  custom calls (library calls), collectives, rng, sort, convolution, fft, linear algebra;
- a reduction, a scatter and a tiled transpose ("heroes") may only be outputs of their
  fusion (kInput roots): nothing in the same loop fusion consumes them, except inside a
  normalization fusion (softmax/layer norm);
- a normalization fusion takes in elementwise producers and index maps computed at the
  row's index (broadcast, reshape, slice, dynamic-slice, gather: a cross-entropy's label
  logit is read beside its row); several outputs only if each is row-shaped;
- outputs of a multi-output fusion share one iteration space (same dimensions; for an
  input fusion, the reduction's input dimensions);
- a GEMM fusion holds one dot with operand prologues and an elementwise epilogue, and has
  one output;
- expensive instructions (exp, log, tanh, divide, dot, reduce, gather ...) are never
  duplicated into several consumers;
- at most ``max_operands`` operands+outputs and ``max_size`` instructions per fusion;
- in-place ops (dynamic-update-slice, scatter) keep their updated operand a parameter, and
  nothing else in the fusion reads that buffer;
- no cycles: two groups joined by a path through a third node cannot fuse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hlo.ir import Instruction
from hlo.layout_util import minor_dim
from hlo.ops import COLLECTIVE, CONTROL_FLOW, ELEMENTWISE

from ..layout_assignment import eight_bit_dot
from .cost_model import array_bytes, elements, is_free
from .rewrite import SMALL_CONSTANT_ELEMENTS, FusionState, Group


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


YES = Decision(True, "legal")


# A flash-attention group is one hand-shaped kernel (passes/fusion/attention.py).
ATTENTION = "attention"
ATTENTION_FINAL = ("a flash-attention fusion is one fixed kernel: nothing fuses into, after "
                   "or beside it")

def no(reason: str) -> Decision:
    return Decision(False, reason)


_NEVER = {
    "parameter": "parameters are kernel inputs, not computations",
    "tuple": "tuples build no data (they are pointer tables)",
    "get-tuple-element": "get-tuple-element is a view, not a computation",
    "custom-call": "custom calls are library calls or opaque kernels",
    "rng": "rng has hidden state and is never fused",
    "rng-bit-generator": "rng-bit-generator is expanded or run on its own",
    "rng-get-and-update-state": "rng state updates are never fused",
    "sort": "sort is emitted as its own kernel",
    "topk": "topk is a library call",
    "convolution": "convolution is a library call (cuDNN)",
    "fft": "fft is a library call (cuFFT)",
    "cholesky": "cholesky is a library call (cuSOLVER)",
    "triangular-solve": "triangular-solve is a library call",
    "fusion": "already a fusion",
    "select-and-scatter": "select-and-scatter is emitted as its own kernel",
    "optimization-barrier": "optimization barriers keep their operands apart on purpose",
    "after-all": "tokens carry ordering, not data",
    "batch-norm-training": "batch norm ops are expanded before fusion",
    "batch-norm-inference": "batch norm ops are expanded before fusion",
    "batch-norm-grad": "batch norm ops are expanded before fusion",
}

# Data movement and cheap ops that a GEMM fusion may apply to its dot's operands.
GEMM_PROLOGUE = {"convert", "bitcast", "reshape", "transpose", "broadcast", "slice", "copy",
                 "iota", "constant", "negate", "multiply", "add", "subtract", "select",
                 "compare", "maximum", "minimum"}


def fusible(inst: Instruction) -> Decision:
    """Can ``inst`` be part of any fusion at all?"""
    op = inst.opcode
    if op in _NEVER:
        return no(_NEVER[op])
    if op == "constant":
        if elements(inst.shape) <= SMALL_CONSTANT_ELEMENTS:
            return no("small constants are cloned into each fusion that reads them")
        return no("big constants are read from their own buffers")
    if inst.op.category == CONTROL_FLOW:
        return no(f"{op} is control flow: its bodies are fused on their own")
    if inst.op.category == COLLECTIVE:
        return no(f"{op} is a collective")
    if inst.is_side_effecting:
        return no(f"{op} has side effects")
    if op in ("async-start", "async-update", "async-done", "copy-start", "copy-done",
              "domain", "add-dependency", "get-dimension-size", "set-dimension-size",
              "dynamic-reshape", "ragged-dot"):
        return no(f"{op} is not fusible")
    if inst.shape.is_tuple and op not in ("reduce",):
        return no(f"{op} returns a tuple")
    return YES


def is_tiled_transpose(inst: Instruction) -> bool:
    """A transpose that moves the minor-most dimension of something big enough to need
    shared-memory tiles (XLA's transpose hero)."""
    if inst.opcode != "transpose":
        return False
    src = inst.operands[0].shape
    perm = tuple(inst.attrs.get("dimensions", ()))
    if not perm or src.rank < 2:
        return False
    out_minor, in_minor = minor_dim(inst.shape), minor_dim(src)
    moved = perm[out_minor] != in_minor
    return moved and src.dims[in_minor] >= 32 and inst.shape.dims[out_minor] >= 32


def is_hero(inst: Instruction) -> bool:
    """Instructions that must be roots of their fusion (outside normalization fusions)."""
    return inst.opcode in ("reduce", "scatter") or is_tiled_transpose(inst)


def expensive(inst: Instruction) -> bool:
    return inst.op.expensive


def _hero_space(inst: Instruction) -> tuple:
    if inst.opcode == "reduce":
        return inst.operands[0].shape.dims
    if inst.opcode == "scatter":
        return inst.operands[-1].shape.dims
    return inst.operands[0].shape.dims if inst.opcode == "transpose" else inst.shape.dims


def check_group(state: FusionState, instances: list[Instruction], members: list[Instruction],
                inside: set[int], kind: str, max_operands: int, max_size: int) -> Decision:
    """Rules on the contents of a would-be group (everything but cycles)."""
    ids = {id(i) for i in instances}
    dots = [i for i in instances if i.opcode == "dot"]
    outs = state.outputs(members, inside)
    if len(instances) > max_size:
        return no(f"fusion would have {len(instances)} instructions (limit {max_size})")
    inputs = [o for o in state.external_inputs(instances)
              if not (o.opcode == "constant" and elements(o.shape) <= SMALL_CONSTANT_ELEMENTS)]
    if len(inputs) + len(outs) > max_operands:
        return no(f"fusion would have {len(inputs)} operands + {len(outs)} outputs "
                  f"(limit {max_operands})")
    # In-place ops: the updated buffer stays a parameter that nothing else reads.
    for i in instances:
        if i.opcode in ("dynamic-update-slice", "scatter"):
            buf = i.operands[0]
            if id(buf) in ids:
                return no(f"%{i.name} updates its operand %{buf.name} in place; the "
                          f"producer of that buffer cannot fuse into it")
            others = [r.name for r in instances if r is not i and any(o is buf for o in r.operands)]
            if others:
                return no(f"%{i.name} updates %{buf.name} in place; %{others[0]} also reads "
                          f"%{buf.name} in the same kernel and could see overwritten values")
    if kind == "normalization":
        if dots:
            return no("a normalization fusion holds no dot")
        # A gather is elemental in the row kernel (codegen/triton/gather.py): its operand
        # is read at the gathered index, e.g. a cross-entropy's label logit beside the row.
        bad = [i for i in instances if i.opcode in ("scatter", "reduce-window",
                                                      "dynamic-update-slice", "pad", "concatenate")]
        if bad:
            return no(f"%{bad[0].name} ({bad[0].opcode}) does not fit a row-wise Triton kernel")
        rows = {_hero_space(i) for i in instances if i.opcode == "reduce"}
        if len(outs) > 1 and not (len(rows) == 1 and all(
                o.shape.is_array and o.shape.dims in rows for o in outs)):
            # Several outputs are stored from the row tile the kernel holds (a residual
            # sum beside the layer norm it feeds); each must be row-shaped for that.
            return no("a Triton normalization fusion stores several outputs only where each "
                      "is row-shaped; " + ", ".join("%" + o.name for o in outs)
                      + " are all read outside")
        return YES
    if dots:
        if len(dots) > 1:
            return no(f"a GEMM fusion holds one dot; %{dots[0].name} and %{dots[1].name} "
                      "would both be in it")
        dot = dots[0]
        bad = [i for i in instances if i is not dot and i.opcode not in GEMM_PROLOGUE
               and i.op.category != ELEMENTWISE]
        if bad:
            return no(f"%{bad[0].name} ({bad[0].opcode}) cannot be a GEMM prologue/epilogue")
        relayout = [o for o in dot.operands if id(o) in ids and o.opcode in ("copy", "transpose")
                    and eight_bit_dot(dot)]
        if relayout:
            return no(f"%{relayout[0].name} lays out an 8-bit operand of %{dot.name} K-major "
                      "for the tensor cores; fused back, the GEMM would read it in the old order")
        moved = [o for o in dot.operands if id(o) in ids and _moves_minor_dim(o)]
        if moved:
            return no(f"%{moved[0].name} ({moved[0].opcode}) changes which dim of %{dot.name}'s "
                      "operand is contiguous; fused back, the GEMM would read its tiles across "
                      "the old order (one element per memory segment): it runs as its own "
                      "transpose kernel")
        moved = [i for i in instances if i is not dot and id(i) not in
                 {id(o) for o in dot.operands} and _moves_minor_dim(i)]
        if moved:
            return no(f"%{moved[0].name} ({moved[0].opcode}) re-lays out %{dot.name}'s result "
                      "with another dim contiguous; in the epilogue the GEMM would store its "
                      "tiles across that order: it runs as its own transpose kernel")
        if len(outs) > 1:
            return no("a GEMM fusion has one output; "
                      + ", ".join("%" + o.name for o in outs) + " are all read outside")
        return YES
    # Loop and input fusions.
    heroes = [i for i in instances if is_hero(i)]
    for h in heroes:
        for u in h.users:
            if id(u) in ids:
                return no(f"%{h.name} ({h.opcode}) must be the root of its fusion; "
                          f"%{u.name} would consume it inside (only a normalization fusion "
                          "may do that)")
    spaces = {_hero_space(h) for h in heroes}
    if len(spaces) > 1:
        return no("reductions with different input shapes cannot share an input fusion")
    if len({h.opcode for h in heroes}) > 1:
        return no("an input fusion has one kind of hero (reduce, scatter or transpose)")
    if heroes:
        space = next(iter(spaces))
        red_dims = {tuple(h.attrs.get("dimensions", ())) for h in heroes if h.opcode == "reduce"}
        if len(red_dims) > 1:
            return no("reductions over different dimensions cannot share an input fusion")
        for o in outs:
            if not is_hero(o) and o.shape.is_array and o.shape.dims != space:
                return no(f"output %{o.name} {o.shape} does not iterate like the "
                          f"reduction's input {list(space)}")
    else:
        dims = {o.shape.dims for o in outs if o.shape.is_array}
        if len(dims) > 1:
            return no("multi-output loop fusion outputs must have the same dimensions: "
                      + ", ".join(f"%{o.name} {o.shape}" for o in outs))
    return YES


def can_merge(state: FusionState, producer: Group, consumer: Group,
              max_operands: int = 96, max_size: int = 256) -> Decision:
    """May ``producer`` be fused into ``consumer`` (multi-output if it is read elsewhere)?"""
    if ATTENTION in (producer.kind, consumer.kind):
        return no(ATTENTION_FINAL)
    if consumer.kind == "normalization" or producer.kind == "normalization":
        norm, other = (consumer, producer) if consumer.kind == "normalization" else (producer, consumer)
        if norm is producer:
            return no("a normalization fusion's result is final: nothing fuses it in")
        bad = [i for i in other.instances()
               if i.op.category != ELEMENTWISE and i.opcode not in (
                   "broadcast", "iota", "convert", "bitcast", "reshape", "constant", "gather",
                   "slice", "dynamic-slice")]
        if bad:
            return no(f"%{bad[0].name} ({bad[0].opcode}) cannot join a normalization fusion")
    members = producer.members + consumer.members
    inside = {producer.id, consumer.id}
    instances = members + [c for c in producer.copies + consumer.copies if c not in members]
    kind = "normalization" if "normalization" in (producer.kind, consumer.kind) else ""
    d = check_group(state, instances, members, inside, kind, max_operands, max_size)
    if not d:
        return d
    via = state.path_via_outside(producer, consumer)
    if via is not None:
        name = via.label if isinstance(via, Group) else via.name
        return no(f"fusing would create a cycle: %{name} is on another path from "
                  f"%{producer.label} to %{consumer.label}")
    return YES


def _moves_minor_dim(inst: Instruction) -> bool:
    """Whether a copy or transpose makes another logical dim the contiguous one: element i
    of its result's minor dim sits a whole row apart from element i+1 in its operand. (A
    mixture-of-experts einsum's [T, D, E] operand re-laid out E-major for a batched GEMM:
    fused as the GEMM's prologue it ran at a tenth of the library's rate.)"""
    if inst.opcode not in ("copy", "transpose") or not inst.shape.is_array or \
            inst.shape.rank < 2:
        return False
    src = inst.operands[0]
    if not src.shape.is_array:
        return False
    out_minor = minor_dim(inst.shape)
    if inst.opcode == "transpose":
        out_minor = tuple(inst.attrs.get("dimensions", ()))[out_minor]
    src_minor = minor_dim(src.shape)
    size = inst.operands[0].shape.dims
    # Moving a dim of size 1 changes no addresses.
    return out_minor != src_minor and size[src_minor] > 1 and size[out_minor] > 1


def can_duplicate(state: FusionState, producer: Group, consumer: Group,
                  max_operands: int = 96, max_size: int = 256) -> Decision:
    """May ``producer`` be recomputed inside ``consumer`` (the original stays for others)?"""
    if ATTENTION in (producer.kind, consumer.kind):
        return no(ATTENTION_FINAL)
    costly = [i for i in producer.instances() if expensive(i)]
    if costly and not _cheaper_to_recompute(state, producer):
        return no(f"%{costly[0].name} ({costly[0].opcode}) is expensive and is not duplicated "
                  "into several consumers")
    heroes = [i for i in producer.instances() if is_hero(i)]
    if heroes:
        return no(f"%{heroes[0].name} ({heroes[0].opcode}) is not duplicated")
    if consumer.kind == "normalization":
        bad = [i for i in producer.instances()
               if i.op.category != ELEMENTWISE and i.opcode not in (
                   "broadcast", "iota", "convert", "bitcast", "reshape")]
        if bad:
            return no(f"%{bad[0].name} ({bad[0].opcode}) cannot join a normalization fusion")
    instances = consumer.instances() + [i for i in producer.instances() if i not in consumer]
    # No cycle check: the copy reads only the producer's inputs, which come before the
    # producer and so cannot depend on the consumer.
    return check_group(state, instances, consumer.members, {consumer.id}, consumer.kind,
                       max_operands, max_size)


_RECOMPUTED_VIEWS = frozenset({"broadcast", "reshape", "bitcast", "convert", "iota",
                               "constant", "slice", "transpose"})


def _cheaper_to_recompute(state: FusionState, producer: Group) -> bool:
    """Whether recomputing ``producer`` (elementwise ops, some transcendental, and views)
    may cost less than the bytes its output moves: it writes more than it reads (an exp of
    a bf16 tensor written in f32: the softmax's numerator a cross-entropy gradient reads
    again), so each consumer reading its inputs instead saves memory traffic, and the
    predicted time of the copies (the cost model counts the transcendentals at the SFU's
    rate) decides. Otherwise expensive ops are not duplicated, as in XLA's instruction
    fusion."""
    if any(i.op.category != ELEMENTWISE and i.opcode not in _RECOMPUTED_VIEWS
           for i in producer.instances()):
        return False                 # a GEMM, a reduction, a gather: never recomputed
    outs = state.outputs(producer.members, {producer.id})
    out_bytes = sum(array_bytes(o.shape) for o in outs)
    in_bytes = sum(array_bytes(o.shape) for o in state.external_inputs(producer.instances()))
    return out_bytes > in_bytes


def can_fuse_siblings(state: FusionState, a: Group, b: Group,
                      max_operands: int = 96, max_size: int = 256) -> Decision:
    """May two groups that read the same input become one multi-output fusion?"""
    if "normalization" in (a.kind, b.kind):
        return no("normalization fusions are not merged with siblings")
    if ATTENTION in (a.kind, b.kind):
        return no(ATTENTION_FINAL)
    if any(i.opcode == "dot" for i in a.instances() + b.instances()):
        return no("GEMM fusions are not merged with siblings")
    updates = [i for i in a.instances() + b.instances() if i.opcode == "dynamic-update-slice"]
    if updates:
        return no(f"%{updates[0].name} writes a window of its operand in place (a scan's "
                  "stacked output); merged with siblings, the fusion would write the whole "
                  "operand every step")
    relayouts = [next((i for i in g.instances() if _moves_minor_dim(i)), None) for g in (a, b)]
    if all(relayouts) and minor_dim(relayouts[0].shape) != minor_dim(relayouts[1].shape):
        return no(f"%{relayouts[0].name} and %{relayouts[1].name} re-lay out data with "
                  "different contiguous dims; together no tile reads and writes whole runs, "
                  "apart each is a transpose kernel")
    members = a.members + b.members
    instances = members + [c for c in a.copies + b.copies if c not in members]
    d = check_group(state, instances, members, {a.id, b.id}, "", max_operands, max_size)
    if not d:
        return d
    for x, y in ((a, b), (b, a)):
        via = state.path_via_outside(x, y)
        if via is not None or any(isinstance(n, Group) and n is y for n in state.consumers(x)):
            return no(f"%{x.label} and %{y.label} are connected; sibling fusion needs "
                      "independent groups")
    return YES


def why_not_fusible(inst: Instruction) -> Optional[str]:
    """The reason ``inst`` can never fuse, or None; free views say so too."""
    d = fusible(inst)
    if not d:
        return d.reason
    if is_free(inst) and inst.opcode != "reshape":
        return f"{inst.opcode} is free"
    return None
