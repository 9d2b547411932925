"""The row-reduction tile rule (codegen/triton/templates.row_tile_limit): a row whose input
fits in 64 KiB may be one tile (bf16 up to 32K elements, f32 up to 16K); wider rows loop.
The legacy templates use it for every row (the 32000-wide bf16 cross-entropy row as one
tile: 0.49x XLA against 0.84x with two 16K passes, benchmarks/NOTES.md issue 14 stage 3);
the one-pass templates (codegen/triton/reductions.py) only where a looped kernel would
read the row more than once (a softmax's output pass), since one 4096-wide pass over the
row measured faster still (NOTES, issue 14 reductions run 2)."""
from __future__ import annotations

import pytest

import hlo
from codegen.triton.templates import row_tile_limit


def _row_sum(params: str, root_operand: str, dims: tuple) -> hlo.Computation:
    text = ("HloModule m\n"
            "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n"
            " ROOT s = f32[] add(a, b) }\n"
            f"ENTRY e {{\n{params}\n  z = f32[] constant(0)\n"
            f"  ROOT r = f32[{dims[0]}] reduce({root_operand}, z), dimensions={{1}}, "
            "to_apply=add\n}\n")
    return hlo.parse_hlo(text).entry


@pytest.mark.parametrize("dtype,want", [("bf16", 32768), ("f16", 32768), ("f32", 16384),
                                        ("f64", 8192)])
def test_one_tile_holds_64_kib_of_the_widest_input(dtype, want):
    dims = (8, 32000)
    params = (f"  x = {dtype}[8,32000] parameter(0)\n"
              "  c = f32[8,32000] convert(x)" if dtype != "f32" else
              "  c = f32[8,32000] parameter(0)")
    assert row_tile_limit(_row_sum(params, "c", dims), dims) == want


def test_the_widest_full_shaped_input_decides():
    # A bf16 row read beside an f32 row of the same shape: the f32 one sets the tile.
    dims = (8, 32000)
    params = ("  x = bf16[8,32000] parameter(0)\n  y = f32[8,32000] parameter(1)\n"
              "  c = f32[8,32000] convert(x)\n  t = f32[8,32000] add(c, y)")
    assert row_tile_limit(_row_sum(params, "t", dims), dims) == 16384


def test_inputs_not_at_the_row_shape_do_not_count():
    # Only a broadcast row vector is read (f64[32000]): no full-shaped input, default 16K.
    dims = (8, 32000)
    params = ("  v = f64[32000] parameter(0)\n  c = f64[8,32000] broadcast(v), dimensions={1}\n"
              "  f = f32[8,32000] convert(c)")
    assert row_tile_limit(_row_sum(params, "f", dims), dims) == 16384
