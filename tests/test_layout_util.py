"""hlo.layout_util: logical <-> physical arrays, and which transposes/reshapes are bitcasts.

Expected values are worked out by hand: a layout lists dims minor-most first, so f32[2,3]{0,1}
stores column by column."""
import itertools

import numpy as np
import pytest

from hlo import layout_util as lu
from hlo.errors import ShapeError
from hlo.shape import Layout, array

X = np.arange(6, dtype=np.float32).reshape(2, 3)   # [[0,1,2],[3,4,5]]


def test_physical_order_of_row_and_column_major():
    np.testing.assert_array_equal(lu.to_physical(X, (1, 0)).ravel(), [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(lu.to_physical(X, (0, 1)).ravel(), [0, 3, 1, 4, 2, 5])
    assert lu.to_physical(X, (0, 1)).flags.c_contiguous
    assert lu.physical_dims(array("f32", (2, 3), (0, 1))) == (3, 2)
    assert lu.physical_dims(array("f32", (2, 3))) == (2, 3)   # no layout: row-major


def test_from_physical_inverts_to_physical_for_every_rank3_layout():
    x = np.arange(24).reshape(2, 3, 4)
    for m2m in itertools.permutations(range(3)):
        shape = array("s64", (2, 3, 4), m2m)
        np.testing.assert_array_equal(lu.from_physical(lu.to_physical(x, m2m), shape), x)
        # Flat data is accepted too (what a byte buffer gives back).
        np.testing.assert_array_equal(lu.from_physical(lu.to_physical(x, m2m).ravel(), shape), x)


def test_scalars_stay_zero_dimensional():
    s = np.float32(3.0)
    assert lu.to_physical(np.asarray(s), ()).shape == ()
    assert lu.from_physical(np.array([3.0], np.float32), array("f32", (), ())).shape == ()


def test_errors_name_the_problem():
    with pytest.raises(ShapeError, match="not a permutation"):
        lu.to_physical(X, (0, 0))
    with pytest.raises(ShapeError, match="cannot hold"):
        lu.from_physical(np.zeros(5), array("f32", (2, 3)))


def test_is_default():
    assert lu.is_default(None) and lu.is_default(Layout((2, 1, 0)))
    assert not lu.is_default(Layout((0, 1)))


def test_transpose_is_bitcast_when_the_result_layout_is_the_permuted_one():
    a = array("f32", (3, 2), (1, 0))
    assert lu.permute_layout(a.layout, 2, (1, 0)) == Layout((0, 1))
    assert lu.transpose_is_bitcast(a, array("f32", (2, 3), (0, 1)), (1, 0))
    assert not lu.transpose_is_bitcast(a, array("f32", (2, 3), (1, 0)), (1, 0))
    # Rank 3: [B,K,M]{2,1,0} -> [B,M,K] keeps memory order B,K,M iff the layout is {1,2,0}.
    b = array("f32", (2, 3, 4), (2, 1, 0))
    assert lu.permute_layout(b.layout, 3, (0, 2, 1)) == Layout((1, 2, 0))


def _brute_reshape_bitcast(op, res) -> bool:
    probe = np.arange(op.size).reshape(op.dims)
    return bool(np.array_equal(lu.to_physical(probe, op.layout).ravel(),
                               lu.to_physical(probe.reshape(res.dims), res.layout).ravel()))


@pytest.mark.parametrize("in_dims,out_dims", [((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 12)),
                                              ((2, 1, 3), (3, 2)), ((4, 6), (2, 2, 3, 2)),
                                              ((2, 3, 1, 4), (1, 6, 4)), ((1, 6), (6, 1))])
def test_reshape_is_bitcast_agrees_with_moving_the_bytes(in_dims, out_dims):
    for pin in itertools.permutations(range(len(in_dims))):
        op = array("s32", in_dims, pin)
        for pout in itertools.permutations(range(len(out_dims))):
            res = array("s32", out_dims, pout)
            assert lu.reshape_is_bitcast(op, res) == _brute_reshape_bitcast(op, res), (pin, pout)
        found = lu.reshape_bitcast_layout(op, out_dims)
        possible = any(_brute_reshape_bitcast(op, array("s32", out_dims, p))
                       for p in itertools.permutations(range(len(out_dims))))
        assert (found is not None) == possible
        if found is not None:
            assert _brute_reshape_bitcast(op, array("s32", out_dims, found))


def test_reshape_bitcast_layout_examples():
    # Row-major in, row-major out.
    assert lu.reshape_bitcast_layout(array("f32", (2, 3, 4)), (6, 4)) == Layout((1, 0))
    # [2,3,4]{1,2,0}: memory order 0,2,1; merging dims 0 and 1 cannot keep that order...
    assert lu.reshape_bitcast_layout(array("f32", (2, 3, 4), (1, 2, 0)), (6, 4)) is None
    # ...but splitting the minor dim of a column-major matrix can: [6,4]{0,1} -> [2,3,4].
    assert lu.reshape_bitcast_layout(array("f32", (6, 4), (0, 1)), (2, 3, 4)) == Layout((1, 0, 2))
    # Symbolic: a huge shape is decided without touching its elements.
    assert lu.reshape_is_bitcast(array("f32", (8192, 4096)), array("f32", (8192, 64, 64)))
