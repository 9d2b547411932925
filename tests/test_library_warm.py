"""runtime/cuda/library_warm.py: pure library calls run once on scratch outputs while the
first call waits for its compiles. Torch's CPU convolution stands in for cuDNN (the same
library call, codegen/library/cudnn.py): what is checked is which thunks run, that the
arena's bytes are never written, and that the real call afterwards gives the same result."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jax import lax  # noqa: E402

import hlo  # noqa: E402
from codegen.library.cublas import cublas_dot  # noqa: E402
from codegen.library.cudnn import cudnn_convolution  # noqa: E402
from runtime.cuda import library_warm  # noqa: E402
from runtime.cuda.arena import Memory  # noqa: E402
from runtime.cuda.thunks import LibraryThunk  # noqa: E402
from runtime.thunks import Slot  # noqa: E402

SENTINEL = 0x5A


def _conv():
    """An NHWC 3x3 convolution instruction (2x6x6x4 by 3x3x4x5), as from_jax makes it."""
    x, k = np.zeros((2, 6, 6, 4), np.float32), np.zeros((3, 3, 4, 5), np.float32)
    dn = lax.conv_dimension_numbers(x.shape, k.shape, ("NHWC", "HWIO", "NHWC"))
    m = hlo.from_jax(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "SAME",
                                                           dimension_numbers=dn), x, k)
    (inst,) = [i for c in m.computations for i in c.instructions if i.opcode == "convolution"]
    return inst


def _arena(inst):
    """One allocation holding both operands and the output (offsets 256 apart), filled
    with SENTINEL bytes; the operands then written with known values."""
    slots, offset = [], 0
    for shape in [o.shape for o in inst.operands] + [inst.shape]:
        slots.append(Slot(0, offset, shape))
        offset += (shape.byte_size + 255) // 256 * 256
    buf = torch.full((offset,), SENTINEL, dtype=torch.uint8)
    mem = Memory([buf], frozenset(), {})
    rng = np.random.default_rng(3)
    for s in slots[:2]:
        mem.view(s).copy_(torch.from_numpy(rng.standard_normal(s.shape.dims).astype(np.float32)))
    return mem, slots[:2], slots[2]


def test_pure_calls_run_on_scratch_and_leave_the_arena_alone():
    inst = _conv()
    mem, ins, out = _arena(inst)
    ran = []

    def impure(inst, operands, out=None):
        ran.append("impure")
        return out
    thunks = [LibraryThunk(inst, cudnn_convolution, ins, [out]),
              LibraryThunk(inst, impure, ins, [out])]
    before = mem.buffers[0].clone()
    stats = library_warm.warm(thunks, mem)
    assert (stats["calls"], stats["skipped"], stats["failed"]) == (1, 0, 0)
    assert ran == []                              # not marked pure: never called early
    assert torch.equal(mem.buffers[0], before)    # the output slot still holds SENTINEL
    # the launch afterwards writes the arena: the convolution of the operands
    thunks[0].run(mem, None)
    want = torch.nn.functional.conv2d(mem.view(ins[0]).permute(0, 3, 1, 2),
                                      mem.view(ins[1]).permute(3, 2, 0, 1), padding=1)
    torch.testing.assert_close(mem.view(out), want.permute(0, 2, 3, 1))


def test_large_outputs_and_failures_are_left_to_the_launch(monkeypatch):
    inst = _conv()
    mem, ins, out = _arena(inst)

    def broken(inst, operands, out=None):
        raise RuntimeError("no such engine")
    broken.pure = True
    thunks = [LibraryThunk(inst, cudnn_convolution, ins, [out]),
              LibraryThunk(inst, broken, ins, [out])]
    stats = library_warm.warm(thunks, mem)
    assert (stats["calls"], stats["skipped"], stats["failed"]) == (1, 0, 1)
    monkeypatch.setattr(library_warm, "MAX_OUTPUT_BYTES", inst.shape.byte_size - 1)
    stats = library_warm.warm(thunks, mem)
    assert (stats["calls"], stats["skipped"], stats["failed"]) == (0, 2, 0)


def test_the_library_calls_say_they_are_pure(monkeypatch):
    assert cudnn_convolution.pure and cublas_dot.pure
    monkeypatch.setenv("HLOTK_WARM_LIBRARIES", "0")
    assert not library_warm.enabled()
    monkeypatch.setenv("HLOTK_WARM_LIBRARIES", "1")
    assert library_warm.enabled()
