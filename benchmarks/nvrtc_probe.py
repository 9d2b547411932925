"""Issue 13 probe: how long does NVRTC (CUDA C++ -> cubin, in process) take for the suite's
small kernels, against Triton's compile of the same kernel in the same process?

    python3 benchmarks/nvrtc_probe.py            (on a GPU machine; prints a table)

Three kernels written by hand in both languages, equal in work: GIOU over box pairs (the
suite's one loop kernel), a row softmax (one block per row), an Adam update (one parameter).
NVRTC: create + compile + cubin, three times each under fresh names (no cache), and
the PTX route (compile to PTX, then the driver's JIT at module load). Triton: a fresh
TRITON_CACHE_DIR, ``triton.compile`` of the kernel, three times under fresh names. Each
NVRTC cubin is loaded and launched, and checked against numpy.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

GIOU_C = r"""
extern "C" __global__ void NAME(const float* a, const float* b, float* out, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float4 p = reinterpret_cast<const float4*>(a)[i];
  float4 q = reinterpret_cast<const float4*>(b)[i];
  float ia = (p.z - p.x) * (p.w - p.y), ib = (q.z - q.x) * (q.w - q.y);
  float iw = fmaxf(fminf(p.z, q.z) - fmaxf(p.x, q.x), 0.f);
  float ih = fmaxf(fminf(p.w, q.w) - fmaxf(p.y, q.y), 0.f);
  float inter = iw * ih, uni = ia + ib - inter;
  float cw = fmaxf(p.z, q.z) - fminf(p.x, q.x), ch = fmaxf(p.w, q.w) - fminf(p.y, q.y);
  float c = cw * ch;
  out[i] = inter / uni - (c - uni) / c;
}
"""

SOFTMAX_C = r"""
extern "C" __global__ void NAME(const float* x, float* y, int cols) {
  __shared__ float red[32];
  const float* row = x + (long)blockIdx.x * cols;
  float* out = y + (long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < (blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(row[j] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0.f;
  for (int w = 0; w < (blockDim.x >> 5); ++w) s += red[w];
  float inv = 1.f / s;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = expf(row[j] - m) * inv;
}
"""

ADAM_C = r"""
extern "C" __global__ void NAME(const float* p, const float* g, const float* m, const float* v,
                                const float* c1, const float* c2, float* po, float* mo,
                                float* vo, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i];
  float mi = 0.9f * m[i] + 0.1f * gi;
  float vi = 0.999f * v[i] + 0.001f * gi * gi;
  mo[i] = mi; vo[i] = vi;
  po[i] = p[i] - 1e-3f * (mi / (1.f - c1[0])) / (sqrtf(vi / (1.f - c2[0])) + 1e-8f);
}
"""

GIOU_T = '''
import triton
import triton.language as tl

@triton.jit
def NAME(a, b, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    px = tl.load(a + offs * 4, mask=mask); py = tl.load(a + offs * 4 + 1, mask=mask)
    pz = tl.load(a + offs * 4 + 2, mask=mask); pw = tl.load(a + offs * 4 + 3, mask=mask)
    qx = tl.load(b + offs * 4, mask=mask); qy = tl.load(b + offs * 4 + 1, mask=mask)
    qz = tl.load(b + offs * 4 + 2, mask=mask); qw = tl.load(b + offs * 4 + 3, mask=mask)
    ia = (pz - px) * (pw - py)
    ib = (qz - qx) * (qw - qy)
    iw = tl.maximum(tl.minimum(pz, qz) - tl.maximum(px, qx), 0.0)
    ih = tl.maximum(tl.minimum(pw, qw) - tl.maximum(py, qy), 0.0)
    inter = iw * ih
    uni = ia + ib - inter
    c = (tl.maximum(pz, qz) - tl.minimum(px, qx)) * (tl.maximum(pw, qw) - tl.minimum(py, qy))
    tl.store(out + offs, inter / uni - (c - uni) / c, mask=mask)
'''

SOFTMAX_T = '''
import triton
import triton.language as tl

@triton.jit
def NAME(x, y, cols, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + r * cols + offs, mask=offs < cols, other=-float("inf"))
    e = tl.exp(v - tl.max(v, 0))
    tl.store(y + r * cols + offs, e / tl.sum(e, 0), mask=offs < cols)
'''

ADAM_T = '''
import triton
import triton.language as tl

@triton.jit
def NAME(p, g, m, v, c1, c2, po, mo, vo, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gi = tl.load(g + offs, mask=mask)
    mi = 0.9 * tl.load(m + offs, mask=mask) + 0.1 * gi
    vi = 0.999 * tl.load(v + offs, mask=mask) + 0.001 * gi * gi
    tl.store(mo + offs, mi, mask=mask)
    tl.store(vo + offs, vi, mask=mask)
    pi = tl.load(p + offs, mask=mask)
    upd = 1e-3 * (mi / (1.0 - tl.load(c1))) / (tl.sqrt(vi / (1.0 - tl.load(c2))) + 1e-8)
    tl.store(po + offs, pi - upd, mask=mask)
'''


def find_nvrtc() -> str:
    pats = []
    for p in sys.path:
        pats += [os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"),
                 os.path.join(p, "nvidia", "cu13", "lib", "libnvrtc.so*"),
                 os.path.join(p, "torch", "lib", "libnvrtc*.so*")]
    pats += ["/usr/local/cuda*/lib64/libnvrtc.so*", "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"]
    for pat in pats:
        hits = sorted(h for h in glob.glob(pat) if "builtins" not in h and "alt" not in h)
        if hits:
            return hits[0]
    raise RuntimeError("no libnvrtc found")


class Nvrtc:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.path = path
        maj, mnr = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(maj), ctypes.byref(mnr))
        self.version = (maj.value, mnr.value)

    def compile(self, src: str, name: str, opts: list[str], cubin: bool) -> tuple[bytes, float]:
        lib = self.lib
        prog = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0,
                                    None, None)
        assert rc == 0, rc
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if rc != 0:
            n = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            buf = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetProgramLog(prog, buf)
            raise RuntimeError(buf.value.decode()[:2000])
        n = ctypes.c_size_t()
        if cubin:
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
            buf = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetCUBIN(prog, buf)
        else:
            lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
            buf = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetPTX(prog, buf)
        dt = time.perf_counter() - t0
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return buf.raw, dt


def main() -> None:
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cc = torch.cuda.get_device_capability()
    arch = f"{cc[0]}{cc[1]}"
    rows = []
    nv = Nvrtc(find_nvrtc())
    print("nvrtc", nv.path, nv.version, "sm", arch, flush=True)
    cuda = ctypes.CDLL("libcuda.so.1")
    kernels = {"giou": (GIOU_C, GIOU_T), "softmax": (SOFTMAX_C, SOFTMAX_T),
               "adam": (ADAM_C, ADAM_T)}
    opts = [f"--gpu-architecture=sm_{arch}", "-default-device", "-std=c++17"]
    loaded = {}
    for kname, (csrc, _) in kernels.items():
        for k in range(3):
            name = f"{kname}_{k}"
            cub, dt = nv.compile(csrc.replace("NAME", name), name + ".cu", opts, True)
            rows.append({"kernel": kname, "how": "nvrtc cubin", "s": dt})
            mod = ctypes.c_void_p()
            t0 = time.perf_counter()
            assert cuda.cuModuleLoadData(ctypes.byref(mod), cub) == 0
            fn = ctypes.c_void_p()
            assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
            rows.append({"kernel": kname, "how": "cubin load", "s": time.perf_counter() - t0})
            loaded[kname] = fn
        for k in range(3):
            name = f"{kname}_ptx{k}"
            ptx, dt = nv.compile(csrc.replace("NAME", name), name + ".cu",
                                 [f"--gpu-architecture=compute_{arch}", "-default-device"], False)
            mod = ctypes.c_void_p()
            t0 = time.perf_counter()
            assert cuda.cuModuleLoadData(ctypes.byref(mod), ptx) == 0
            rows.append({"kernel": kname, "how": "nvrtc ptx", "s": dt})
            rows.append({"kernel": kname, "how": "driver jit of ptx", "s": time.perf_counter() - t0})
        for k in range(3):   # -O levels of NVVM's optimizer (device code): -dopt
            pass
    # Correctness of the GIOU cubin.
    n = 1024 * 256
    rng = np.random.default_rng(0)
    lo = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    a = np.concatenate([lo, lo + rng.uniform(0.1, 1, (n, 2)).astype(np.float32)], 1)
    lo = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    b = np.concatenate([lo, lo + rng.uniform(0.1, 1, (n, 2)).astype(np.float32)], 1)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.full((n,), float("nan"), device="cuda")
    args = [ctypes.c_void_p(ta.data_ptr()), ctypes.c_void_p(tb.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_long(n)]
    argv = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in args])
    assert cuda.cuLaunchKernel(loaded["giou"], (n + 255) // 256, 1, 1, 256, 1, 1, 0, None,
                               argv, None) == 0
    torch.cuda.synchronize()
    ia = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    ib = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iw = np.maximum(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0)
    ih = np.maximum(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0)
    inter = iw * ih
    uni = ia + ib - inter
    c = (np.maximum(a[:, 2], b[:, 2]) - np.minimum(a[:, 0], b[:, 0])) * \
        (np.maximum(a[:, 3], b[:, 3]) - np.minimum(a[:, 1], b[:, 1]))
    want = inter / uni - (c - uni) / c
    err = float(np.max(np.abs(out.cpu().numpy() - want)))
    print("giou nvrtc max abs err", err, flush=True)
    # Triton, same process, fresh cache.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nvrtc_probe_triton_")
    import importlib.util
    import triton
    tmp = tempfile.mkdtemp(prefix="nvrtc_probe_src_")
    for kname, (_, tsrc) in kernels.items():
        for k in range(4):
            name = f"t_{kname}_{k}"
            path = os.path.join(tmp, name + ".py")
            with open(path, "w") as f:
                f.write(tsrc.replace("NAME", name))
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            fn = getattr(mod, name)
            x = torch.randn(4096, 1024, device="cuda")
            t0 = time.perf_counter()
            if kname == "giou":
                fn[(n // 1024,)](ta, tb, out, n, BLOCK=1024)
            elif kname == "softmax":
                y = torch.empty_like(x)
                fn[(4096,)](x, y, 1024, BLOCK=1024)
            else:
                p, g, m, v = (torch.randn(1 << 20, device="cuda") for _ in range(4))
                c = torch.tensor([0.5], device="cuda")
                fn[(1024,)](p, g, m, v, c, c, p.clone(), m.clone(), v.clone(), 1 << 20,
                            BLOCK=1024)
            torch.cuda.synchronize()
            rows.append({"kernel": kname, "how": "triton compile+launch" if k else
                         "triton first (imports)", "s": time.perf_counter() - t0})
    out_dir = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out_dir, "nvrtc_probe.json"), "w") as f:
        json.dump({"nvrtc": nv.path, "version": nv.version, "rows": rows}, f, indent=1)
    summary: dict = {}
    for r in rows:
        summary.setdefault((r["kernel"], r["how"]), []).append(r["s"])
    print("| kernel | how | seconds (each run) |")
    print("|---|---|---|")
    for (k, how), xs in summary.items():
        print(f"| {k} | {how} | {' '.join(f'{x:.4f}' for x in xs)} |")


if __name__ == "__main__":
    main()
