"""How a Triton-compiled kernel's parameters are laid out for ``cuLaunchKernelEx``, and
whether hlotk can launch it itself (``direct_launch.py``) or must leave it to Triton.

Pure Python (no torch, no Triton, no CUDA): it works from the compiled kernel's signature
(parameter name -> Triton type string, in parameter order, as ``CompiledKernel.src.signature``
holds it) and metadata (a mapping or namedtuple with the fields Triton 3.6 writes). The rules
are Triton 3.6's C launcher's (``make_launcher`` in ``triton/backends/nvidia/driver.py``, read
for facts):

- a ``constexpr`` parameter is no kernel parameter;
- a pointer (``*fp32``, ...) is a 64-bit device address (``None`` is 0);
- ``i1``/``i8`` are one signed byte, ``u1``/``u8`` one unsigned byte, ``i16``/``u16`` two,
  ``i32``/``u32`` four, ``i64``/``u64`` eight bytes;
- ``fp16`` is the IEEE half (round to nearest even), ``bf16`` the upper 16 bits of the
  value as a float32 (truncated, not rounded), ``fp32`` a float32, ``fp64`` a double;
- after the signature's parameters come two 64-bit addresses: the global scratch buffer and
  the profiler's scratch buffer (0 where the kernel needs none).

Each parameter gets its own 8-byte slot in one host buffer (``pack``), and the launch passes
one pointer per slot (the driver copies ``size`` bytes from each, at the offsets the cubin
declares; ``runtime/cuda/native/patch.py`` then sees the same parameter bytes Triton's
launcher would have given the captured graph node).

Whatever this cannot express keeps Triton's launch (``unsupported`` says why): tensor
descriptors (host-built TMA maps), tuples of arguments, thread-block clusters
(``num_ctas > 1``), kernels that need a global or profiler scratch allocation per launch,
and any type or metadata field it does not know.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

SLOT = 8          # bytes per parameter slot in the host buffer

# Triton type -> (struct code, bytes the kernel reads)
SCALARS: dict[str, tuple[str, int]] = {
    "i1": ("b", 1), "i8": ("b", 1), "u1": ("B", 1), "u8": ("B", 1),
    "i16": ("h", 2), "u16": ("H", 2), "i32": ("i", 4), "u32": ("I", 4),
    "i64": ("q", 8), "u64": ("Q", 8),
    "fp16": ("e", 2), "bf16": ("H", 2), "fp32": ("f", 4), "f32": ("f", 4), "fp64": ("d", 8),
}

# Triton versions whose C launcher was read for these rules.
KNOWN_VERSIONS = ("3.6",)
ENV = "HLOTK_TRITON_LAUNCH"
MODES = ("direct", "triton")


def launch_mode(environ: Mapping[str, str]) -> str:
    """``HLOTK_TRITON_LAUNCH`` in ``environ``: ``direct`` (the default) or ``triton``;
    raises ValueError for anything else."""
    raw = (environ.get(ENV) or "direct").strip().lower()
    if raw not in MODES:
        raise ValueError(f"{ENV}={environ.get(ENV)!r}: expected one of {', '.join(MODES)}")
    return raw


@dataclass(frozen=True)
class Param:
    """One kernel parameter: where its value comes from in the launch's bound arguments
    (``index``: position in the function's parameter list), its Triton type, and how it is
    stored (``code``: struct code; ``size``: bytes the kernel reads)."""
    index: int
    name: str
    ty: str
    code: str
    size: int


@dataclass(frozen=True)
class ParamPlan:
    """The parameter slots of one compiled kernel, the two scratch addresses last."""
    params: tuple[Param, ...]
    fmt: str                       # struct format of the whole buffer (little-endian)

    @property
    def count(self) -> int:
        """Kernel parameters, the two scratch addresses included."""
        return len(self.params) + 2

    @property
    def nbytes(self) -> int:
        return SLOT * self.count

    def sizes(self) -> list[int]:
        """Bytes of each kernel parameter (what ``cuFuncGetParamInfo`` should report)."""
        return [p.size for p in self.params] + [8, 8]


class Unsupported(Exception):
    """This kernel keeps Triton's launch; the message says why."""


def plan_params(signature: Mapping[str, Any]) -> ParamPlan:
    """The slots for a compiled kernel's ``signature`` (name -> Triton type, parameter
    order); raises Unsupported for what this launcher does not express."""
    params: list[Param] = []
    fmt = ["<"]
    for index, (name, ty) in enumerate(signature.items()):
        if isinstance(ty, (tuple, list)):
            raise Unsupported(f"parameter {name!r} is a tuple of arguments")
        if not isinstance(ty, str):
            raise Unsupported(f"parameter {name!r} has a type this launcher does not know: {ty!r}")
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc") or ty == "nvTmaDesc":
            raise Unsupported(f"parameter {name!r} is a tensor descriptor ({ty}): its TMA map "
                              "is built on the host by Triton's launcher")
        if ty.startswith("*"):
            code, size = "Q", 8
        elif ty in SCALARS:
            code, size = SCALARS[ty]
        else:
            raise Unsupported(f"parameter {name!r} has a type this launcher does not know: {ty!r}")
        params.append(Param(index, name, ty, code, size))
        fmt.append(code + (f"{SLOT - struct.calcsize(code)}x" if struct.calcsize(code) < SLOT
                           else ""))
    fmt.append("QQ")       # global scratch, profile scratch
    return ParamPlan(tuple(params), "".join(fmt))


def _field(metadata: Any, name: str, default: Any = None) -> Any:
    if isinstance(metadata, Mapping):
        return metadata.get(name, default)
    return getattr(metadata, name, default)


@dataclass(frozen=True)
class LaunchMeta:
    """What a launch needs from the compiled kernel's metadata."""
    name: str
    num_warps: int
    shared: int
    launch_pdl: bool
    cooperative: bool


def launch_meta(metadata: Any) -> LaunchMeta:
    """The launch fields of Triton's metadata; raises Unsupported for clusters, scratch
    memory and tensor-descriptor metadata."""
    name = _field(metadata, "name")
    if not name:
        raise Unsupported("the metadata names no kernel")
    num_ctas = int(_field(metadata, "num_ctas", 1) or 1)
    if num_ctas != 1:
        raise Unsupported(f"num_ctas={num_ctas}: a thread-block cluster launch")
    cluster = _field(metadata, "cluster_dims", None)
    if cluster is not None and tuple(cluster) not in ((), (1,), (1, 1), (1, 1, 1)):
        raise Unsupported(f"cluster_dims={tuple(cluster)}: a thread-block cluster launch")
    for what in ("global_scratch", "profile_scratch"):
        size = int(_field(metadata, what + "_size", 0) or 0)
        if size > 0:
            raise Unsupported(f"{what}_size={size}: Triton's launcher allocates that per launch")
    tmem = int(_field(metadata, "tmem_size", 0) or 0)
    if tmem > 512:       # columns; Triton's launch raises OutOfResources
        raise Unsupported(f"tmem_size={tmem} columns of tensor memory")
    if _field(metadata, "tensordesc_meta", None):
        raise Unsupported("tensor descriptors (tensordesc_meta)")
    return LaunchMeta(name=str(name), num_warps=int(_field(metadata, "num_warps", 4)),
                      shared=int(_field(metadata, "shared", 0) or 0),
                      launch_pdl=bool(_field(metadata, "launch_pdl", False)),
                      cooperative=bool(_field(metadata, "launch_cooperative_grid", False)))


def supported_version(version: str) -> Optional[str]:
    """None where Triton ``version``'s launcher layout is the one this module follows, else
    why not (another version may add or reorder parameters)."""
    if any(version == v or version.startswith(v + ".") for v in KNOWN_VERSIONS):
        return None
    return (f"Triton {version}: this launcher follows the parameter layout of Triton "
            f"{', '.join(KNOWN_VERSIONS)} only")


def bf16_bits(value: float) -> int:
    """Triton 3.6's bf16 argument: the upper half of the float32's bits (truncation)."""
    return struct.unpack("<I", struct.pack("<f", value))[0] >> 16


def values(plan: ParamPlan, bound: Sequence[Any]) -> list:
    """The slot values for the bound arguments (one per function parameter, in order):
    pointers as addresses (``data_ptr()``, an int, or None), scalars as given (bf16 as its
    bits), then the two scratch addresses (0)."""
    out: list = []
    for p in plan.params:
        v = bound[p.index]
        if p.code == "Q" and p.ty.startswith("*"):
            if v is None:
                v = 0
            elif not isinstance(v, int):
                if getattr(v, "is_cuda", True) is False:
                    raise ValueError(f"pointer argument {p.name!r} is not on a CUDA device "
                                     "(a CPU tensor?)")
                v = v.data_ptr()
        elif p.ty == "bf16":
            v = bf16_bits(float(v))
        elif p.code in ("e", "f", "d"):
            v = float(v)
        else:
            v = int(v)
        out.append(v)
    out += [0, 0]
    return out


def pack(plan: ParamPlan, bound: Sequence[Any]) -> bytes:
    """The host buffer for ``bound`` (tests; the launch packs into a buffer it keeps)."""
    return struct.pack(plan.fmt, *values(plan, bound))


def check_layout(plan: ParamPlan, declared: Sequence[tuple[int, int]]) -> Optional[str]:
    """None where the cubin's parameters (``declared``: (offset, size) per parameter, as
    ``cuFuncGetParamInfo`` reports them) are as many and as large as the plan's, else why
    not (a Triton whose kernels take other parameters than this plan assumes)."""
    sizes = [s for _, s in declared]
    if sizes != plan.sizes():
        return (f"the cubin declares {len(sizes)} parameters of sizes {sizes}; the plan has "
                f"{plan.count} of sizes {plan.sizes()}")
    return None


def direct_reason(signature: Mapping[str, Any], metadata: Any, version: str,
                  environ: Mapping[str, str]) -> Optional[str]:
    """None where a kernel compiled by Triton ``version`` with this ``signature`` and
    ``metadata`` will be launched directly (the cubin's own parameter check aside, which
    needs the driver), else why Triton launches it. Compile workers ask this to skip
    building Triton's C launcher for such kernels."""
    try:
        if launch_mode(environ) != "direct":
            return f"{ENV}={environ.get(ENV)}"
    except ValueError as e:
        return str(e)
    if environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Triton's interpreter"
    why = supported_version(version)
    if why:
        return why
    try:
        plan_params(signature)
        launch_meta(metadata)
    except Unsupported as e:
        return str(e)
    return None
