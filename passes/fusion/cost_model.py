"""An analytical GPU cost model: how long would one kernel take on a given device?

Per kernel::

    time = launch + max(memory_time, compute_time)          # compute/memory overlap
    memory_time  = (bytes_read + bytes_written) / (HBM bandwidth x memory_efficiency)
    compute_time = tensor_flops / tensor-core rate(dtype)   # dot/convolution
                 + flops / CUDA-core rate(dtype)            # other arithmetic
                 + transcendentals / SFU rate               # exp, log, tanh, rsqrt, ...

Cache effects: a kernel reads each distinct input once even when several of its
instructions read it (the repeats hit L1/L2), and an instruction that touches part of its
operand (slice, dynamic-slice, gather) is charged for the part it touches. A dot reads each
operand once (tiles are reused from shared memory/L2). Free instructions (parameters,
constants, tuples, get-tuple-element, bitcasts and row-major reshapes) launch nothing.

The launch term (``kernel_launch_us``, 2 us by default) is what a kernel costs inside a
CUDA-graph replay: about 1 us launch plus the inter-kernel gap and tail. It is what a
fusion saves besides the bytes of the intermediate.

Device specs live in ``devices.json`` next to this file; ``HLOTK_DEVICES=/path.json`` adds
or overrides entries, ``register_device`` does it from Python.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, Union

from hlo.errors import HlotkError
from hlo.ir import Computation, Instruction, Module
from hlo.ops import ELEMENTWISE
from hlo.shape import AnyShape, leaf_paths


class DeviceSpecError(HlotkError):
    """An unknown target name or a malformed device spec."""


# --- device specs ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceSpec:
    key: str
    name: str
    hbm_bandwidth_gbps: float
    sm_count: int
    clock_mhz: float
    l2_bytes: int
    shared_memory_per_sm_bytes: int
    tensor_tflops: dict[str, float]
    cuda_core_tflops: dict[str, float]
    sfu_ops_per_clock_per_sm: int = 16
    kernel_launch_us: float = 2.0
    memory_efficiency: float = 0.9
    memory_gib: float = 0.0
    aliases: tuple[str, ...] = ()
    # Device-to-device links, for the collective cost model (passes/latency_hiding_scheduler.py).
    link_bandwidth_gbps: float = 0.0      # one direction, per device (NVLink, ICI)
    collective_latency_us: float = 0.0    # fixed cost of one collective (launch + sync)
    # Throughput of hlotk's generated (Triton) GEMM kernels relative to the vendor library
    # on the same product, per tensor kind (1 where not given): the CUDA backend runs a
    # compute-bound GEMM fusion as the library's GEMM plus an epilogue kernel when that
    # difference outweighs writing the product out and reading it back
    # (split_gemm.library_gemm_reason).
    generated_gemm_efficiency: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def bytes_per_us(self) -> float:
        return self.hbm_bandwidth_gbps * 1e3 * self.memory_efficiency

    @property
    def sfu_ops_per_us(self) -> float:
        return self.sm_count * self.sfu_ops_per_clock_per_sm * self.clock_mhz

    def tensor_rate(self, kind: str) -> float:
        """Tensor-core ops per microsecond for ``kind`` (bf16, fp16, tf32, int8, fp8, fp64)."""
        tf = self.tensor_tflops.get(kind) or self.tensor_tflops.get("bf16", 0.0)
        return tf * 1e6

    def generated_gemm_scale(self, kind: str) -> float:
        """``generated_gemm_efficiency`` of ``kind`` (bf16, fp16, ...), 1 where not given."""
        return self.generated_gemm_efficiency.get(kind, 1.0)

    def cuda_rate(self, kind: str) -> float:
        tf = self.cuda_core_tflops.get(kind) or self.cuda_core_tflops["fp32"]
        return tf * 1e6


_DEVICES: dict[str, DeviceSpec] = {}


def _spec_from_dict(key: str, d: dict[str, Any]) -> DeviceSpec:
    known = {f for f in DeviceSpec.__dataclass_fields__} - {"key"}
    try:
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["aliases"] = tuple(d.get("aliases", ()))
        return DeviceSpec(key=key, **kwargs)
    except TypeError as e:
        raise DeviceSpecError(f"device spec {key!r}: {e}") from None


def _load_file(path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DeviceSpecError(f"cannot read device specs from {path}: {e}") from None
    for key, d in data.items():
        if key.startswith("_"):
            continue
        register_device(_spec_from_dict(key, d))


def register_device(spec: DeviceSpec) -> DeviceSpec:
    """Make ``spec`` available as a ``target`` by its key and aliases."""
    _DEVICES[spec.key.lower()] = spec
    for a in spec.aliases:
        _DEVICES[a.lower()] = spec
    return spec


def devices() -> dict[str, DeviceSpec]:
    _ensure_loaded()
    return {k: v for k, v in _DEVICES.items() if k == v.key}


def _ensure_loaded() -> None:
    if _DEVICES:
        return
    _load_file(Path(__file__).with_name("devices.json"))
    extra = os.environ.get("HLOTK_DEVICES")
    if extra:
        _load_file(Path(extra))


def resolve_target(target: str) -> str:
    """``target`` itself, or for a device file (``*.json`` in devices.json's form, e.g.
    what ``hlotk calibrate`` writes) the key of its entry, registered on the way."""
    _ensure_loaded()
    if not target.endswith(".json"):
        return target
    path = Path(target).expanduser()
    _load_file(path)
    keys = [k for k in json.loads(path.read_text()) if not k.startswith("_")]
    if len(keys) != 1:
        raise DeviceSpecError(f"device file {target}: expected one device, found {len(keys)}")
    return keys[0]


def get_device(target: Union[str, DeviceSpec]) -> DeviceSpec:
    """The spec for ``target`` ("h100", "h200", "a100", an alias, a device file's path, or
    a DeviceSpec)."""
    if isinstance(target, DeviceSpec):
        return target
    target = resolve_target(target)
    try:
        return _DEVICES[target.lower()]
    except KeyError:
        raise DeviceSpecError(f"unknown target {target!r}; known: "
                              f"{', '.join(sorted(devices()))}") from None


# --- per-instruction work -------------------------------------------------------------------
TRANSCENDENTAL = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one",
                            "power", "rsqrt", "sqrt", "cbrt", "tanh", "sine", "cosine", "tan",
                            "atan2", "logistic", "erf"})
_NO_FLOPS = frozenset({"copy", "bitcast-convert", "real", "imag", "convert"})
FREE_OPS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                      "after-all", "partition-id", "replica-id"})


def array_bytes(shape: AnyShape) -> int:
    if not shape.is_tuple:      # the common case, without leaf_paths' generator (hot in fusion)
        return shape.byte_size if shape.is_array else 0
    return sum(s.byte_size for _, s in leaf_paths(shape) if s.is_array)


def elements(shape: AnyShape) -> int:
    if not shape.is_tuple:
        return shape.size if shape.is_array else 0
    return sum(s.size for _, s in leaf_paths(shape) if s.is_array)


def is_free(inst: Instruction) -> bool:
    """True when ``inst`` launches no kernel: leaves, views and row-major reshapes."""
    if inst.opcode in FREE_OPS:
        return True
    if inst.opcode == "reshape":
        from hlo.layout_util import is_default
        s, o = inst.shape, inst.operands[0].shape
        return is_default(s.layout) and is_default(o.layout)
    return False


@dataclass(frozen=True)
class Work:
    tensor_flops: float = 0.0
    tensor_kind: str = ""
    flops: float = 0.0
    transcendentals: float = 0.0


def _tensor_kind(inst: Instruction) -> str:
    dt = inst.operands[0].shape.dtype.name
    if dt in ("bf16", "f16"):
        return "bf16" if dt == "bf16" else "fp16"
    if dt in ("s8", "u8", "s4", "u4"):
        return "int8"
    if dt.startswith("f8"):
        return "fp8"
    if dt == "f64":
        return "fp64"
    prec = inst.attrs.get("operand_precision") or ()
    if any(str(p).lower() == "highest" for p in prec):
        return ""            # full f32: CUDA cores
    return "tf32"            # XLA's default precision for f32 dots on Ampere and later


def work_of(inst: Instruction) -> Work:
    """Arithmetic of one (unfused) instruction; fusions sum their bodies."""
    op = inst.opcode
    if op == "fusion":
        total = Work()
        for i in inst.attrs["calls"].instructions:
            w = work_of(i)
            total = Work(total.tensor_flops + w.tensor_flops, w.tensor_kind or total.tensor_kind,
                         total.flops + w.flops, total.transcendentals + w.transcendentals)
        return total
    out = elements(inst.shape)
    if op == "dot":
        lhs = inst.operands[0].shape
        k = math.prod(lhs.dims[d] for d in inst.attrs.get("lhs_contracting_dims", ()))
        kind = _tensor_kind(inst)
        if kind:
            return Work(tensor_flops=2.0 * out * k, tensor_kind=kind)
        return Work(flops=2.0 * out * k)
    if op == "convolution":
        kernel = inst.operands[1].shape
        labels = inst.attrs.get("dim_labels")
        per = (kernel.size // max(1, kernel.dims[labels.kernel_output_feature])
               if labels is not None else kernel.size)
        return Work(tensor_flops=2.0 * out * per, tensor_kind=_tensor_kind(inst) or "tf32")
    if op in TRANSCENDENTAL:
        return Work(transcendentals=out)
    if op in ("reduce", "reduce-window"):
        return Work(flops=float(elements(inst.operands[0].shape)))
    if inst.op.category == ELEMENTWISE and op not in _NO_FLOPS:
        return Work(flops=float(out))
    return Work()


def touched_bytes(reader: Instruction, operand_index: int) -> int:
    """Bytes of operand ``operand_index`` that ``reader`` actually reads."""
    o = reader.operands[operand_index]
    full = array_bytes(o.shape)
    if reader.opcode in ("slice", "dynamic-slice") and operand_index == 0:
        return min(full, elements(reader.shape) * o.shape.dtype.itemsize)
    if reader.opcode == "gather" and operand_index == 0:
        return min(full, elements(reader.shape) * o.shape.dtype.itemsize)
    if reader.opcode == "dynamic-update-slice" and operand_index == 0:
        return 0      # updated in place: only the update is written
    return full


# --- estimates --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one kernel (or a sum of kernels when ``kernels`` > 1)."""
    time_us: float
    bytes_read: int
    bytes_written: int
    flops: float
    kernels: int = 1
    memory_us: float = 0.0
    compute_us: float = 0.0

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us > self.memory_us else "memory"

    def __add__(self, other: "Estimate") -> "Estimate":
        # The fields set directly (a frozen dataclass's __init__ sets each through
        # object.__setattr__: twice the time; the fusion pass adds ~10,000 estimates).
        out = _new(Estimate)
        out.__dict__.update(time_us=self.time_us + other.time_us,
                            bytes_read=self.bytes_read + other.bytes_read,
                            bytes_written=self.bytes_written + other.bytes_written,
                            flops=self.flops + other.flops,
                            kernels=self.kernels + other.kernels,
                            memory_us=self.memory_us + other.memory_us,
                            compute_us=self.compute_us + other.compute_us)
        return out

    def __str__(self) -> str:
        return (f"{self.time_us:.2f} us ({self.kernels} kernel{'s' * (self.kernels != 1)}, "
                f"{self.bytes_moved / 1e6:.2f} MB, {self.flops / 1e9:.3f} GFLOP, {self.bound}-bound)")


_new = object.__new__
ZERO = Estimate(0.0, 0, 0, 0.0, kernels=0)


def estimate_kernel(body: Sequence[Instruction], outputs: Sequence[Instruction],
                    spec: DeviceSpec, small_constant_elements: int = 0,
                    work: Callable[[Instruction], Work] = work_of) -> Estimate:
    """One kernel computing ``body`` and writing ``outputs``.

    Operands of body instructions that are not in ``body`` are the kernel's inputs; each is
    read once, at most its size, however many body instructions read it (cache reuse).
    Constants with at most ``small_constant_elements`` elements are folded into the kernel.
    ``work``: ``work_of``, or a cache of it (the fusion state's: the graph does not change
    while fusion estimates).
    """
    inside = {id(i) for i in body}
    if all(is_free(i) for i in body):
        return ZERO
    reads: dict[int, list[int]] = {}
    for inst in body:
        for k, o in enumerate(inst.operands):
            if id(o) in inside:
                continue
            if o.opcode == "constant" and elements(o.shape) <= small_constant_elements:
                continue
            cap_and_sum = reads.setdefault(id(o), [array_bytes(o.shape), 0])
            cap_and_sum[1] += touched_bytes(inst, k)
    read = sum(min(cap, s) for cap, s in reads.values())
    written = sum(array_bytes(o.shape) for o in outputs)
    for inst in body:          # in-place updates write only their update
        if inst.opcode == "dynamic-update-slice" and any(o is inst for o in outputs):
            written -= array_bytes(inst.shape) - array_bytes(inst.operands[1].shape)
    tensor = cuda = trans = 0.0
    kind = ""
    for inst in body:
        w = work(inst)
        tensor += w.tensor_flops
        kind = w.tensor_kind or kind
        cuda += w.flops
        trans += w.transcendentals
    memory_us = (read + written) / spec.bytes_per_us
    compute_us = ((tensor / spec.tensor_rate(kind) if tensor else 0.0)
                  + cuda / spec.cuda_rate("fp32") + trans / spec.sfu_ops_per_us)
    return Estimate(spec.kernel_launch_us + max(memory_us, compute_us), read, written,
                    tensor + cuda + trans, 1, memory_us, compute_us)


def external_reads(per_instruction: Iterable[Iterable[tuple[int, int, int]]],
                   inside: set[int]) -> dict[int, list[int]]:
    """operand id -> [its bytes, bytes touched summed over the readers]: the reads of a
    kernel's instructions (each a ``KernelFacts`` read list) from outside ``inside``."""
    reads: dict[int, list[int]] = {}
    for facts in per_instruction:
        for oid, cap, touched in facts:
            if oid in inside:
                continue
            e = reads.get(oid)
            if e is None:
                reads[oid] = [cap, touched]
            else:
                e[1] += touched
    return reads


class KernelFacts:
    """What ``estimate_kernel`` reads of one instruction, worked out once: a fusion pass
    estimates thousands of candidate kernels over the same instructions (issue 13: the
    Adam step's fusion made ~3,700 estimates, each re-deriving every member's operand
    sizes, touched bytes and arithmetic), and the graph does not change while it decides.
    ``estimate`` gives exactly ``estimate_kernel``'s answer (the same sums in the same
    order; every byte count is an int and every flop count an integral float, so the
    result is bit-identical): tests/test_fusion_caches.py compares them."""

    __slots__ = ("spec", "small", "work", "_facts")

    def __init__(self, spec: DeviceSpec, small_constant_elements: int = 0,
                 work: Callable[[Instruction], Work] = work_of):
        self.spec = spec
        self.small = small_constant_elements
        self.work = work
        # id(inst) -> (free, ((operand id, operand bytes, touched bytes), ...), work,
        #              own bytes, bytes a dynamic-update-slice output does not write or None)
        self._facts: dict[int, tuple] = {}

    def facts(self, inst: Instruction) -> tuple:
        f = self._facts.get(id(inst))
        if f is None:
            reads = tuple((id(o), array_bytes(o.shape), touched_bytes(inst, k))
                          for k, o in enumerate(inst.operands)
                          if not (o.opcode == "constant" and elements(o.shape) <= self.small))
            unwritten = array_bytes(inst.shape) - array_bytes(inst.operands[1].shape) \
                if inst.opcode == "dynamic-update-slice" else None
            f = self._facts[id(inst)] = (is_free(inst), reads, self.work(inst),
                                         array_bytes(inst.shape), unwritten)
        return f

    def estimate(self, body: Sequence[Instruction], outputs: Sequence[Instruction],
                 inside: Any = None) -> Estimate:
        """``estimate_kernel(body, outputs, spec, small_constant_elements, work)``;
        ``inside``: the ids of ``body`` as a set, when the caller has them."""
        facts = [self.facts(i) for i in body]
        if all(f[0] for f in facts):
            return ZERO
        if inside is None:
            inside = {id(i) for i in body}
        reads = external_reads((f[1] for f in facts), inside)
        read = sum(min(cap, s) for cap, s in reads.values())
        written = sum(self.facts(o)[3] for o in outputs)
        for inst, f in zip(body, facts):
            if f[4] is not None and any(o is inst for o in outputs):
                written -= f[4]
        tensor = cuda = trans = 0.0
        kind = ""
        for f in facts:
            w = f[2]
            tensor += w.tensor_flops
            kind = w.tensor_kind or kind
            cuda += w.flops
            trans += w.transcendentals
        spec = self.spec
        memory_us = (read + written) / spec.bytes_per_us
        compute_us = ((tensor / spec.tensor_rate(kind) if tensor else 0.0)
                      + cuda / spec.cuda_rate("fp32") + trans / spec.sfu_ops_per_us)
        return Estimate(spec.kernel_launch_us + max(memory_us, compute_us), read, written,
                        tensor + cuda + trans, 1, memory_us, compute_us)


def fusion_outputs(fused: Computation) -> list[Instruction]:
    root = fused.root
    assert root is not None
    return list(root.operands) if root.opcode == "tuple" else [root]


def predict(obj: Union[Instruction, Computation, Module],
            target: Union[str, DeviceSpec] = "h100") -> Estimate:
    """Predicted cost of an instruction (a fusion is one kernel), or of every kernel of a
    computation/module (its entry), summed."""
    spec = get_device(target)
    if isinstance(obj, Module):
        assert obj.entry is not None
        obj = obj.entry
    if isinstance(obj, Computation):
        total = ZERO
        for inst in obj.instructions:
            total = total + predict(inst, spec)
        return total
    inst = obj
    if inst.opcode == "fusion":
        fused = inst.attrs["calls"]
        body = [i for i in fused.instructions if i.opcode != "parameter"]
        return estimate_kernel(body, fusion_outputs(fused), spec,
                               small_constant_elements=10**18)
    if is_free(inst):
        return ZERO
    if inst.opcode in ("while", "conditional", "call"):
        total = ZERO
        for c in inst.called_computations:
            total = total + predict(c, spec)
        return total
    return estimate_kernel([inst], [inst], spec)


def count_kernels(obj: Union[Module, Computation]) -> int:
    """Kernels that would launch: fusions and non-free unfused instructions (entry only,
    plus bodies of control flow)."""
    comp = obj.entry if isinstance(obj, Module) else obj
    n = 0
    for inst in comp.instructions:
        if inst.opcode in ("while", "conditional", "call"):
            n += sum(count_kernels(c) for c in inst.called_computations)
        elif not is_free(inst):
            n += 1
    return n
