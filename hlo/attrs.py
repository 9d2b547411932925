"""Typed instruction attributes and how XLA spells them in HLO text.

An instruction's ``attrs`` is an ordered dict from XLA's attribute name (``dimensions``,
``window``, ``to_apply`` ...) to a typed value. ``ATTR_KINDS`` says which kind each known
name has, so the parser knows how to read it; unknown names are kept as ``Raw`` text and
printed back verbatim, which keeps round trips exact for attributes hlotk does not model.
Insertion order is printing order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Raw:
    """An attribute value kept verbatim (``backend_config={...}``, unknown attributes)."""
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class WindowDim:
    size: int
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 1   # XLA: rhs_dilate
    base_dilation: int = 1     # XLA: lhs_dilate
    window_reversal: bool = False


@dataclass(frozen=True)
class Window:
    dims: tuple[WindowDim, ...]

    def __str__(self) -> str:
        if not self.dims:
            return "{}"
        parts = ["size=" + "x".join(str(d.size) for d in self.dims)]
        if any(d.stride != 1 for d in self.dims):
            parts.append("stride=" + "x".join(str(d.stride) for d in self.dims))
        if any(d.padding_low or d.padding_high for d in self.dims):
            parts.append("pad=" + "x".join(f"{d.padding_low}_{d.padding_high}" for d in self.dims))
        if any(d.base_dilation != 1 for d in self.dims):
            parts.append("lhs_dilate=" + "x".join(str(d.base_dilation) for d in self.dims))
        if any(d.window_dilation != 1 for d in self.dims):
            parts.append("rhs_dilate=" + "x".join(str(d.window_dilation) for d in self.dims))
        if any(d.window_reversal for d in self.dims):
            parts.append("rhs_reversal=" + "x".join("1" if d.window_reversal else "0"
                                                     for d in self.dims))
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True)
class SliceDim:
    start: int
    limit: int
    stride: int = 1

    def __str__(self) -> str:
        if self.stride == 1:
            return f"[{self.start}:{self.limit}]"
        return f"[{self.start}:{self.limit}:{self.stride}]"


@dataclass(frozen=True)
class SliceSpec:
    dims: tuple[SliceDim, ...]

    def __str__(self) -> str:
        return "{" + ", ".join(str(d) for d in self.dims) + "}"


@dataclass(frozen=True)
class PadDim:
    low: int
    high: int
    interior: int = 0


@dataclass(frozen=True)
class PaddingConfig:
    dims: tuple[PadDim, ...]

    def __str__(self) -> str:
        def one(d: PadDim) -> str:
            return f"{d.low}_{d.high}" + (f"_{d.interior}" if d.interior else "")
        return "x".join(one(d) for d in self.dims)


@dataclass(frozen=True)
class ConvDimLabels:
    """Convolution dimension numbers, printed as XLA's ``dim_labels=b01f_01io->b01f``.

    Spatial dims are listed in spatial order (the digits 0, 1, 2, ... in the labels).
    """
    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]

    @staticmethod
    def _labels(rank: int, a: int, a_ch: str, b: int, b_ch: str, spatial: tuple[int, ...]) -> str:
        chars = ["?"] * rank
        chars[a] = a_ch
        chars[b] = b_ch
        for i, d in enumerate(spatial):
            chars[d] = str(i)
        return "".join(chars)

    def __str__(self) -> str:
        n = len(self.input_spatial) + 2
        lhs = self._labels(n, self.input_batch, "b", self.input_feature, "f", self.input_spatial)
        rhs = self._labels(n, self.kernel_input_feature, "i", self.kernel_output_feature, "o",
                           self.kernel_spatial)
        out = self._labels(n, self.output_batch, "b", self.output_feature, "f", self.output_spatial)
        return f"{lhs}_{rhs}->{out}"

    @staticmethod
    def parse(text: str) -> "ConvDimLabels":
        """Parse ``b01f_01io->b01f``; raises ValueError on malformed labels."""
        try:
            lhs_rhs, out = text.split("->")
            lhs, rhs = lhs_rhs.split("_")
        except ValueError:
            raise ValueError(f"malformed dim_labels {text!r}; expected like b01f_01io->b01f")

        def spatial(s: str) -> tuple[int, ...]:
            digits = sorted((int(c), i) for i, c in enumerate(s) if c.isdigit())
            if [d for d, _ in digits] != list(range(len(digits))):
                raise ValueError(f"malformed dim_labels {text!r}: spatial digits in {s!r}")
            return tuple(i for _, i in digits)

        def find(s: str, c: str) -> int:
            if s.count(c) != 1:
                raise ValueError(f"malformed dim_labels {text!r}: need one {c!r} in {s!r}")
            return s.index(c)

        if not (len(lhs) == len(rhs) == len(out)):
            raise ValueError(f"malformed dim_labels {text!r}: ranks differ")
        return ConvDimLabels(find(lhs, "b"), find(lhs, "f"), spatial(lhs),
                             find(rhs, "i"), find(rhs, "o"), spatial(rhs),
                             find(out, "b"), find(out, "f"), spatial(out))


@dataclass(frozen=True)
class ReplicaGroups:
    """Explicit replica groups ``{{0,1},{2,3}}``."""
    groups: tuple[tuple[int, ...], ...]

    def expand(self, total: int | None = None) -> list[list[int]]:
        if not self.groups and total is not None:
            return [list(range(total))]
        return [list(g) for g in self.groups]

    def __str__(self) -> str:
        return "{" + ",".join("{" + ",".join(str(i) for i in g) + "}" for g in self.groups) + "}"


@dataclass(frozen=True)
class IotaReplicaGroups:
    """Compact replica groups ``[2,2]<=[4]`` or ``[2,2]<=[2,2]T(1,0)`` (XLA's iota list)."""
    group_dims: tuple[int, int]           # (number of groups, group size)
    reshape_dims: tuple[int, ...]
    transpose: tuple[int, ...] | None = None

    def expand(self, total: int | None = None) -> list[list[int]]:
        import numpy as np
        ids = np.arange(int(np.prod(self.reshape_dims))).reshape(self.reshape_dims)
        if self.transpose is not None:
            ids = ids.transpose(self.transpose)
        return ids.reshape(self.group_dims).tolist()

    def __str__(self) -> str:
        s = f"[{','.join(map(str, self.group_dims))}]<=[{','.join(map(str, self.reshape_dims))}]"
        if self.transpose is not None:
            s += f"T({','.join(map(str, self.transpose))})"
        return s


@dataclass(frozen=True)
class MeshReplicaGroups:
    """Newer XLA's mesh spelling ``mesh['x'=2,'y'=4] {'y'}``, optionally with
    ``, device_ids=([2,4]T(1,0))`` after the mesh: the devices of a mesh (its ids laid out
    by ``device_ids``, iota when absent) grouped along the named axes."""
    axes: tuple[tuple[str, int], ...]       # (name, size), major to minor
    group_axes: tuple[str, ...]
    device_ids: tuple[tuple[int, ...], tuple[int, ...] | None] | None = None  # (dims, perm)

    def expand(self, total: int | None = None) -> list[list[int]]:
        import numpy as np
        sizes = [n for _, n in self.axes]
        count = int(np.prod(sizes)) if sizes else 1
        ids = np.arange(count)
        if self.device_ids is not None:
            dims, perm = self.device_ids
            ids = ids.reshape(dims)
            if perm is not None:
                ids = ids.transpose(perm)
        ids = ids.reshape(sizes)
        names = [a for a, _ in self.axes]
        grouped = [names.index(a) for a in self.group_axes]
        other = [i for i in range(len(sizes)) if i not in grouped]
        size = int(np.prod([sizes[i] for i in grouped])) if grouped else 1
        return ids.transpose(other + grouped).reshape(-1, size).tolist()

    def __str__(self) -> str:
        s = "mesh[" + ",".join(f"'{a}'={n}" for a, n in self.axes) + "]"
        if self.device_ids is not None:
            dims, perm = self.device_ids
            s += f", device_ids=([{','.join(map(str, dims))}]"
            s += (f"T({','.join(map(str, perm))}))" if perm is not None else ")")
        return s + " {" + ",".join(f"'{a}'" for a in self.group_axes) + "}"


@dataclass(frozen=True)
class Metadata:
    """``metadata={op_name="..." source_file="..." source_line=12 ...}``; order kept."""
    fields: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.fields:
            if k == key:
                return v
        return default

    def __str__(self) -> str:
        # Immutable, and shared by the ops of one source line (the importer makes one per
        # location): printed once (issue 13: the compile cache's key prints the module)
        cached = self.__dict__.get("_text")
        if cached is not None:
            return cached
        parts = []
        for k, v in self.fields:
            if isinstance(v, str):
                parts.append(f"{k}={quote(v)}")
            elif isinstance(v, bool):
                parts.append(f"{k}={'true' if v else 'false'}")
            else:
                parts.append(f"{k}={v}")
        text = "{" + " ".join(parts) + "}"
        object.__setattr__(self, "_text", text)
        return text


@dataclass(frozen=True)
class FrontendAttributes:
    items: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.items).get(key, default)

    def __str__(self) -> str:
        return "{" + ",".join(f"{k}={quote(v)}" for k, v in self.items) + "}"


# A character quote() escapes (a backslash, a double quote, a control character).
_ESCAPED = re.compile(r'[\\"\x00-\x1f]')


def quote(s: str) -> str:
    """A C-escaped, double-quoted string as XLA prints it."""
    if _ESCAPED.search(s) is None:
        return '"' + s + '"'        # most strings (metadata's op names and files)
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# Which kind of value each known attribute name holds. The parser dispatches on this; a
# name not listed is kept as Raw. Kinds:
#   ints {1,2}  int 3  bool true  ident LT  string "x"  float 1e-05
#   computation %c  computations {%a, %b}  window  slice  padding  dim_labels
#   replica_groups  int_pairs {{0,1},{1,0}}  idents {default,highest}  metadata
#   frontend_attributes  sharding  raw
ATTR_KINDS: dict[str, str] = {
    # shapes and dimensions
    "dimensions": "ints", "iota_dimension": "int", "index": "int", "slice": "slice",
    "dynamic_slice_sizes": "ints", "padding": "padding", "window": "window",
    "dim_labels": "dim_labels", "feature_group_count": "int", "batch_group_count": "int",
    "lhs_contracting_dims": "ints", "rhs_contracting_dims": "ints",
    "lhs_batch_dims": "ints", "rhs_batch_dims": "ints",
    "lhs_ragged_dims": "ints", "rhs_group_dims": "ints",
    "operand_precision": "idents", "algorithm": "ident",
    # gather / scatter
    "offset_dims": "ints", "collapsed_slice_dims": "ints", "start_index_map": "ints",
    "operand_batching_dims": "ints", "start_indices_batching_dims": "ints",
    "index_vector_dim": "int", "slice_sizes": "ints", "indices_are_sorted": "bool",
    "update_window_dims": "ints", "inserted_window_dims": "ints",
    "scatter_dims_to_operand_dims": "ints", "input_batching_dims": "ints",
    "scatter_indices_batching_dims": "ints", "unique_indices": "bool",
    # comparison, sort, topk
    "direction": "ident", "type": "ident", "is_stable": "bool", "k": "int", "largest": "bool",
    # called computations
    "to_apply": "computation", "calls": "computation", "condition": "computation",
    "body": "computation", "true_computation": "computation",
    "false_computation": "computation", "branch_computations": "computations",
    "select": "computation", "scatter": "computation",
    # fusion, custom call
    "kind": "ident", "custom_call_target": "string", "backend_config": "raw",
    "api_version": "ident", "custom_call_has_side_effect": "bool",
    "output_to_operand_aliasing": "raw", "operand_layout_constraints": "raw",
    "custom_call_schedule": "ident", "schedule": "ident",
    "called_computations": "computations",   # custom-call's called computations
    # rng, fft, precision, linalg
    "distribution": "ident", "fft_type": "ident", "fft_length": "ints",
    "exponent_bits": "int", "mantissa_bits": "int", "lower": "bool", "left_side": "bool",
    "unit_diagonal": "bool", "transpose_a": "ident", "epsilon": "float",
    "feature_index": "int",
    # collectives
    "replica_groups": "replica_groups", "channel_id": "int", "use_global_device_ids": "bool",
    "source_target_pairs": "int_pairs", "constrain_layout": "bool",
    "split_dimension": "int", "scatter_dimension": "int", "all_gather_dimension": "int",
    "is_host_transfer": "bool",
    # everywhere
    "metadata": "metadata", "frontend_attributes": "frontend_attributes",
    "sharding": "sharding", "statistics": "raw", "origin": "raw",
    "control-predecessors": "instructions", "infeed_config": "string",
    "outfeed_config": "string", "outfeed_shape": "raw", "result_accuracy": "raw",
}

# Attributes whose value refers to other computations (for ``called_computations``).
COMPUTATION_ATTRS = tuple(k for k, v in ATTR_KINDS.items() if v in ("computation", "computations"))


def format_value(value: Any) -> str:
    """Text of one attribute value (not including ``name=``)."""
    from .ir import Computation, Instruction  # local: ir imports this module
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Computation):
        return "%" + value.name
    if isinstance(value, Instruction):
        return "%" + value.name
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(v, Computation) for v in value):
            return "{" + ", ".join("%" + c.name for c in value) + "}"
        if value and all(isinstance(v, Instruction) for v in value):
            return "{" + ", ".join("%" + c.name for c in value) + "}"
        if value and all(isinstance(v, (tuple, list)) for v in value):
            return "{" + ",".join("{" + ",".join(str(i) for i in g) + "}" for g in value) + "}"
        return "{" + ",".join(str(v) for v in value) + "}"
    if isinstance(value, float):
        return format_float(value)
    return str(value)


def format_float(x: float) -> str:
    r = repr(float(x))
    if r.endswith(".0"):
        r = r[:-2]
    return r


def format_attr(name: str, value: Any) -> str:
    """``name=value`` as XLA prints it."""
    if ATTR_KINDS.get(name) == "string" and isinstance(value, str):
        return f"{name}={quote(value)}"
    return f"{name}={format_value(value)}"
