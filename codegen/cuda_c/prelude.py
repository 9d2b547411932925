"""The C helpers every generated CUDA C kernel starts with.

Portable C (no CUDA header: NVRTC compiles it as it is, and the host compiler compiles it
through ``host.py``'s shim, which defines the few CUDA names used here):

- bf16/f16 <-> f32 by bit manipulation. Narrow floats are *held* in a ``float`` between
  ops and *stored* as their 16 bits (``unsigned short``); rounding is to nearest even, NaN
  stays NaN (quiet), f16 overflow goes to inf and tiny values to f16 subnormals.
- f64 -> narrow float in one rounding: through f32 rounded to odd (an f32 with at least two
  more mantissa bits than bf16/f16 keeps the information the final rounding needs).
- max/min that propagate NaN (HLO's semantics; ``fmaxf`` returns the other operand).

Only the helpers a kernel calls are emitted (``prelude_for``), so a kernel's source, and
with it its cache key, does not change when an unrelated helper does.
"""
from __future__ import annotations

import re

# name -> definition; order matters (a helper before the helpers that call it).
_HELPERS: dict[str, str] = {
    "hl_bf16_to_f32": """\
__device__ __forceinline__ float hl_bf16_to_f32(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}""",
    "hl_f32_to_bf16": """\
__device__ __forceinline__ unsigned short hl_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest, ties to even */
  return (unsigned short)(u >> 16);
}""",
    "hl_f16_to_f32": """\
__device__ __forceinline__ float hl_f16_to_f32(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
  unsigned int e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));   /* inf, NaN */
  if (e == 0u) {                                   /* zero or subnormal: m * 2^-24, exact */
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}""",
    "hl_f32_to_f16": """\
__device__ __forceinline__ unsigned short hl_f32_to_f16(float f) {
  unsigned int u = __float_as_uint(f);
  unsigned int sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);        /* NaN */
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);       /* >= 65520: inf */
  if (a >= 0x38800000u) {                                              /* a normal f16 */
    unsigned int r = a - 0x38000000u;                                  /* exponent rebiased */
    r += 0xfffu + ((r >> 13) & 1u);
    return (unsigned short)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return (unsigned short)sign;                    /* <= 2^-25: zero */
  {                                                                    /* an f16 subnormal */
    unsigned int e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    unsigned int shift = 126u - e;                                     /* 14 .. 24 */
    unsigned int q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) q += 1u;
    return (unsigned short)(sign | q);
  }
}""",
    "hl_round_bf16": """\
__device__ __forceinline__ float hl_round_bf16(float x) { return hl_bf16_to_f32(hl_f32_to_bf16(x)); }""",
    "hl_round_f16": """\
__device__ __forceinline__ float hl_round_f16(float x) { return hl_f16_to_f32(hl_f32_to_f16(x)); }""",
    "hl_f64_to_f32_odd": """\
__device__ __forceinline__ float hl_f64_to_f32_odd(double d) {
  float f = (float)d;
  if ((double)f == d || f != f) return f;
  unsigned int u = __float_as_uint(f);
  if (fabs((double)f) > fabs(d)) u -= 1u;      /* toward zero (sign-magnitude bits) */
  return __uint_as_float(u | 1u);              /* inexact: the sticky bit */
}""",
    "hl_maxf": """\
__device__ __forceinline__ float hl_maxf(float a, float b) { return (a != a || a > b) ? a : b; }""",
    "hl_minf": """\
__device__ __forceinline__ float hl_minf(float a, float b) { return (a != a || a < b) ? a : b; }""",
    # IEEE f32 division and square root without their slow-path calls (flat.py,
    # ``DIVSQRT_ENV``): the instruction sequences of the fast paths NVRTC emits for ``a / b``
    # (div.rn) and ``sqrtf`` (sqrt.rn), correctly rounded wherever the operands pass the
    # ``_ok`` checks, so a chunk computes every value this way, ANDs the checks, and redoes
    # the chunk with ``/`` and ``sqrtf`` only where one failed. The host (host.py) has no
    # approximate reciprocal: there the seeds are exact quotients, which the same
    # refinement keeps exact.
    "hl_rcp_seed": """\
__device__ __forceinline__ float hl_rcp_seed(float b) {
#ifdef __CUDA_ARCH__
  float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b)); return r;
#else
  return 1.0f / b;
#endif
}""",
    "hl_rsqrt_seed": """\
__device__ __forceinline__ float hl_rsqrt_seed(float x) {
#ifdef __CUDA_ARCH__
  float r; asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
#else
  return 1.0f / sqrtf(x);
#endif
}""",
    "hl_mul_rn": """\
__device__ __forceinline__ float hl_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);   /* never contracted into an FMA */
#else
  return a * b;
#endif
}""",
    # 2^-62 <= |a|, |b| < 2^62: the quotient and every intermediate of hl_div_fast is a
    # normal float (no overflow, no subnormal), so the sequence rounds as it does for the
    # operands' significands in [1, 2), where it is NVRTC's own fast path. A zero
    # numerator passes (hl_div_fast returns a * r's signed zero); a zero divisor,
    # subnormals, inf and NaN fail.
    "hl_div_ok": """\
__device__ __forceinline__ bool hl_div_ok(float a, float b) {
  return ((fabsf(a) >= 0x1p-62f) | (a == 0.0f)) & (fabsf(a) < 0x1p62f) &
         (fabsf(b) >= 0x1p-62f) & (fabsf(b) < 0x1p62f);   /* &, |: one predicate chain */
}""",
    # 2^-62 <= x < 2^62 (inside sqrt.rn's own fast range, 2^-101 up to the largest float),
    # or a zero (hl_sqrt_fast returns it).
    "hl_sqrt_ok": """\
__device__ __forceinline__ bool hl_sqrt_ok(float x) {
  return ((x >= 0x1p-62f) | (x == 0.0f)) & (x < 0x1p62f);
}""",
    "hl_div_fast": """\
__device__ __forceinline__ float hl_div_fast(float a, float b) {
  float r = hl_rcp_seed(b);
  r = fmaf(r, fmaf(-b, r, 1.0f), r);          /* one Newton step on 1/b */
  float q = hl_mul_rn(a, r);                  /* a zero: the quotient's signed zero */
  return a == 0.0f ? q : fmaf(r, fmaf(-b, q, a), q);   /* q + r (a - b q), rounded once */
}""",
    "hl_sqrt_fast": """\
__device__ __forceinline__ float hl_sqrt_fast(float x) {
  float y = hl_rsqrt_seed(x);
  float s = hl_mul_rn(x, y), h = hl_mul_rn(y, 0.5f);
  float r = fmaf(fmaf(-s, s, x), h, s);       /* s + (x - s^2) / (2 sqrt x), rounded once */
  return x == 0.0f ? x : r;                   /* sqrt(+-0) = +-0 */
}""",
    # Triton's f32 division and square root (div.full.f32, sqrt.approx.ftz.f32: ~2 ulp),
    # for ``DIVSQRT_ENV=approx`` (a measurement: not the CUDA C kernels' numerics).
    "hl_div_full": """\
__device__ __forceinline__ float hl_div_full(float a, float b) {
#ifdef __CUDA_ARCH__
  float q; asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b)); return q;
#else
  return a / b;
#endif
}""",
    "hl_sqrt_approx": """\
__device__ __forceinline__ float hl_sqrt_approx(float x) {
#ifdef __CUDA_ARCH__
  float r; asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
#else
  return sqrtf(x);
#endif
}""",
    "hl_max": """\
__device__ __forceinline__ double hl_max(double a, double b) { return (a != a || a > b) ? a : b; }""",
    "hl_min": """\
__device__ __forceinline__ double hl_min(double a, double b) { return (a != a || a < b) ? a : b; }""",
}

_CALL = re.compile(r"\b(hl_\w+)\(")


def prelude_for(body: str) -> str:
    """The helper definitions ``body`` needs (and those they call), in dependency order."""
    need: set[str] = set()
    todo = [n for n in _CALL.findall(body) if n in _HELPERS]
    while todo:
        n = todo.pop()
        if n in need:
            continue
        need.add(n)
        todo += [m for m in _CALL.findall(_HELPERS[n]) if m in _HELPERS and m != n]
    return "\n".join(src for name, src in _HELPERS.items() if name in need)
