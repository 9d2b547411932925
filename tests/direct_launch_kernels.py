"""A Triton kernel with pointer, integer, float and boolean parameters, for
tests/test_direct_launch.py (Triton reads a kernel's source from its file)."""
import triton
import triton.language as tl


@triton.jit
def scaled_add(x_ptr, y_ptr, out_ptr, n, a, b, flag, c, BLOCK: tl.constexpr):
    # out = x * a + y * b + c where flag, else x * a + y * b - c
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    res = x * a + y * b
    res = tl.where(flag, res + c, res - c)
    tl.store(out_ptr + offs, res, mask=mask)
