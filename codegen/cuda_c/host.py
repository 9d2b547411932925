"""Run a generated CUDA C kernel on the CPU: the host C++ compiler and a small shim.

The emitter's output is portable C apart from a few CUDA names; ``SHIM`` defines them for
the host (``__global__``/``__device__`` as nothing, ``blockIdx``/``threadIdx``/``blockDim``
as globals, the bit-cast and bit-count intrinsics through ``memcpy`` and GCC builtins,
``rsqrtf`` as ``1 / sqrtf``) and a driver function loops over every block and thread of
the launch, one after another. Each thread of a loop kernel reads its inputs and writes
its own output elements only, so running them in sequence computes what the GPU does.

This is the kernel's interpret mode: tests run emitted kernels on numpy buffers through
ctypes where no GPU and no NVRTC exist (CPU CI). Math functions are the host libm's, so
transcendental results may differ from CUDA's by an ulp or two.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .emitter import CudaCodegenError, KernelSource

SHIM = r"""
#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
struct hl_uint3 { unsigned int x, y, z; };
static hl_uint3 blockIdx, threadIdx, blockDim, gridDim;
struct uint4 { unsigned int x, y, z, w; };
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline long long __double_as_longlong(double f) { long long u; memcpy(&u, &f, 8); return u; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
"""


def host_compiler() -> Optional[str]:
    """A C++ compiler on PATH (``$CXX`` first), or None."""
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _driver(ks: KernelSource) -> str:
    args = ", ".join(f"*({t}*)a[{k}]" for k, (t, _) in enumerate(ks.params))
    return f"""
extern "C" void hl_run(void** a, long long blocks, unsigned int threads) {{
  blockDim.x = threads; blockDim.y = blockDim.z = 1;
  gridDim.x = (unsigned int)blocks; gridDim.y = gridDim.z = 1;
  for (long long b = 0; b < blocks; ++b) {{
    blockIdx.x = (unsigned int)b;
    for (unsigned int t = 0; t < threads; ++t) {{
      threadIdx.x = t;
      {ks.name}({args});
    }}
  }}
}}
"""


_LIBS: dict[str, ctypes.CDLL] = {}


def build(ks: KernelSource, workdir: Optional[Path] = None) -> ctypes.CDLL:
    """The kernel compiled into a shared library with the shim and driver (memoized by
    source); raises CudaCodegenError with the compiler's message and the file's path."""
    text = SHIM + "\n" + ks.source + _driver(ks)
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    lib = _LIBS.get(key)
    if lib is not None:
        return lib
    cxx = host_compiler()
    if cxx is None:
        raise CudaCodegenError("no host C++ compiler (g++, c++, clang++) on PATH")
    d = Path(workdir or tempfile.mkdtemp(prefix="hlotk_cuda_c_host_"))
    d.mkdir(parents=True, exist_ok=True)
    src, so = d / f"{ks.name}_{key}.cc", d / f"{ks.name}_{key}.so"
    src.write_text(text)
    # -fwrapv: integer wrap-around as on the GPU; no contraction or fast math: IEEE ops
    # -fno-strict-aliasing: the flat form reads buffers as uint4 words (on the GPU a
    # vector load; here a plain copy that must not be reordered past the element stores)
    cmd = [cxx, "-std=c++17", "-O1", "-fwrapv", "-ffp-contract=off", "-fno-fast-math",
           "-fno-strict-aliasing",
           "-shared", "-fPIC", "-w", str(src), "-o", str(so), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CudaCodegenError(f"host compile of kernel {ks.name} failed ({src}):\n"
                               f"{r.stderr[:3000]}")
    lib = ctypes.CDLL(str(so))
    lib.hl_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong, ctypes.c_uint]
    lib.hl_run.restype = None
    _LIBS[key] = lib
    return lib


def run(ks: KernelSource, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray],
        workdir: Optional[Path] = None, blocks: Optional[int] = None,
        threads: Optional[int] = None) -> None:
    """Launch ``ks`` over numpy arrays (any strides; ``outputs`` written in place) as the
    GPU launch would: ``ks.blocks`` blocks of ``ks.threads`` (or ``blocks``/``threads``: a
    flat kernel's grid-stride loop takes any grid). A flat kernel's arrays must be dense
    in their layout (its ``input_shapes``/``output_shapes``), as the GPU launch makes them."""
    if len(inputs) != ks.n_inputs or len(outputs) != ks.n_outputs:
        raise CudaCodegenError(f"kernel {ks.name} takes {ks.n_inputs} inputs and "
                               f"{ks.n_outputs} outputs, got {len(inputs)} and {len(outputs)}")
    lib = build(ks, workdir)
    arrays = list(inputs) + list(outputs)
    for a, s in zip(arrays, ks.input_shapes + ks.output_shapes):
        if tuple(a.shape) != tuple(s.dims):
            raise CudaCodegenError(f"kernel {ks.name}: an array of shape {a.shape}, expected "
                                   f"{tuple(s.dims)}")
    keep: list = []
    for a in arrays:
        keep.append(ctypes.c_void_p(a.ctypes.data))
    if ks.flat:
        from hlo.layout_util import dense_strides
        from codegen.triton.flat_loop import is_dense
        for a, s in zip(arrays, ks.input_shapes + ks.output_shapes):
            if not is_dense(tuple(a.shape), tuple(st // a.itemsize for st in a.strides),
                            tuple(dense_strides(s))):
                raise CudaCodegenError(f"kernel {ks.name} (flat) needs arrays dense in their "
                                       f"layout: {s} got strides {a.strides}")
        keep.append(ctypes.c_longlong(ks.elements))
    else:
        for a in arrays:
            keep += [ctypes.c_longlong(st // a.itemsize) for st in a.strides]
    ptrs = (ctypes.c_void_p * len(keep))(*[ctypes.addressof(k) for k in keep])
    if ks.elements:
        lib.hl_run(ptrs, blocks or ks.blocks, threads or ks.threads)
