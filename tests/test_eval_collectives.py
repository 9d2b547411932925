"""Collectives on one device and on 2/4 simulated devices (hand-computed expectations)."""
from __future__ import annotations

import numpy as np
import pytest

import hlo
from hlo import Builder, IotaReplicaGroups, ReplicaGroups
from hlo.errors import EvaluationError
from hlo.evaluator import evaluate
from hlo.evaluator.collectives import device_groups, simulate
from hlo.shape import array, scalar, tuple_shape

def add_comp(dtype="f32", opcode="add") -> hlo.Computation:
    b = Builder(f"{opcode}_red")
    p0, p1 = b.parameter(scalar(dtype)), b.parameter(scalar(dtype))
    b.op(opcode, p0, p1, shape=scalar(dtype))
    return b.build()


def one_op(opcode, in_shape, out_shape, called=(), n_operands=1, **attrs) -> hlo.Module:
    b = Builder("main")
    ps = [b.parameter(in_shape) for _ in range(n_operands)]
    b.op(opcode, *ps, shape=out_shape, **attrs)
    return b.module(called=called)


# --- single device ----------------------------------------------------------------------
def test_single_device_collectives_are_group_of_one():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = array("f32", (2, 3))
    g = ReplicaGroups(((0,),))
    comp = add_comp()
    assert (evaluate(one_op("all-reduce", s, s, (comp,), replica_groups=g, to_apply=comp),
                     [x]) == x).all()
    assert (evaluate(one_op("all-gather", s, s, dimensions=(0,), replica_groups=g), [x]) == x).all()
    assert (evaluate(one_op("all-to-all", s, s, dimensions=(1,), replica_groups=g), [x]) == x).all()
    assert (evaluate(one_op("collective-permute", s, s, source_target_pairs=((0, 0),)),
                     [x]) == x).all()
    assert (evaluate(one_op("collective-permute", s, s, source_target_pairs=()),
                     [x]) == 0).all()


def test_single_device_async_pairs():
    x = np.arange(4, dtype=np.float32)
    s = array("f32", (4,))
    comp = add_comp()
    b = Builder("main")
    p = b.parameter(s)
    st = b.all_reduce_start(p, to_apply=comp, replica_groups=ReplicaGroups(()), shape=s)
    b.all_reduce_done(st, shape=s)
    assert (evaluate(b.module(called=(comp,)), [x]) == x).all()
    b = Builder("main")
    p = b.parameter(s)
    st = b.all_gather_start(p, dimensions=(0,), replica_groups=ReplicaGroups(()),
                            shape=tuple_shape(s, s))
    b.all_gather_done(st, shape=s)
    assert (evaluate(b.module(), [x]) == x).all()


def test_single_device_needs_simulator_for_real_groups():
    s = array("f32", (2,))
    comp = add_comp()
    m = one_op("all-reduce", s, s, (comp,), replica_groups=ReplicaGroups(((0, 1),)), to_apply=comp)
    with pytest.raises(EvaluationError, match="simulate"):
        evaluate(m, [np.zeros(2, np.float32)], num_replicas=2)


# --- group modes ----------------------------------------------------------------------------
def test_group_modes_follow_xla():
    s = array("f32", (2,))
    rg = ReplicaGroups(((0, 1),))
    cross_replica = one_op("all-reduce", s, s, replica_groups=rg).entry.root
    assert device_groups(cross_replica, 2, 2) == [[0, 2], [1, 3]]
    both = one_op("all-reduce", s, s, replica_groups=rg, channel_id=1).entry.root
    assert device_groups(both, 2, 2) == [[0, 1, 2, 3]]
    flat = one_op("all-reduce", s, s, replica_groups=ReplicaGroups(((0, 3), (1, 2))),
                  channel_id=1, use_global_device_ids=True).entry.root
    assert device_groups(flat, 2, 2) == [[0, 3], [1, 2]]
    a2a = one_op("all-to-all", s, s, replica_groups=rg, channel_id=1, dimensions=(0,)).entry.root
    assert device_groups(a2a, 2, 2) == [[0, 1], [2, 3]]        # cross-partition
    iota = one_op("all-reduce", s, s, replica_groups=IotaReplicaGroups((2, 2), (2, 2), (1, 0)),
                  channel_id=1, use_global_device_ids=True).entry.root
    assert device_groups(iota, 1, 4) == [[0, 2], [1, 3]]


# --- simulated devices --------------------------------------------------------------------
def test_all_reduce_two_replicas():
    s = array("f32", (3,))
    comp = add_comp()
    m = one_op("all-reduce", s, s, (comp,), replica_groups=ReplicaGroups(((0, 1),)), to_apply=comp)
    a, b = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32)
    out = simulate(m, [[a], [b]], num_replicas=2)
    for o in out:
        np.testing.assert_array_equal(o, [11, 22, 33])


def test_all_reduce_four_devices_two_groups_max_iota():
    s = array("s32", (2,))
    comp = add_comp("s32", "maximum")
    # [2,2]<=[4]: groups {0,1},{2,3}
    m = one_op("all-reduce", s, s, (comp,), to_apply=comp, channel_id=1,
               use_global_device_ids=True, replica_groups=IotaReplicaGroups((2, 2), (4,)))
    args = [[np.array([d, 10 - d], np.int32)] for d in range(4)]
    out = simulate(m, args, num_replicas=1, num_partitions=4)
    assert [o.tolist() for o in out] == [[1, 10], [1, 10], [3, 8], [3, 8]]


def test_all_gather_and_reduce_scatter_four_replicas():
    x = [np.full((1, 2), d, np.float32) for d in range(4)]
    g = ReplicaGroups(((0, 1, 2, 3),))
    m = one_op("all-gather", array("f32", (1, 2)), array("f32", (4, 2)), dimensions=(0,),
               replica_groups=g)
    out = simulate(m, [[v] for v in x], num_replicas=4)
    for o in out:
        np.testing.assert_array_equal(o[:, 0], [0, 1, 2, 3])
    comp = add_comp()
    m = one_op("reduce-scatter", array("f32", (4, 2)), array("f32", (1, 2)), (comp,),
               dimensions=(0,), replica_groups=ReplicaGroups(((3, 2, 1, 0),)), to_apply=comp)
    args = [[np.arange(8, dtype=np.float32).reshape(4, 2) * (d + 1)] for d in range(4)]
    out = simulate(m, args, num_replicas=4)
    # sum over devices = arange * 10; device 3 has rank 0 and gets row 0, device 0 row 3.
    np.testing.assert_array_equal(out[3], [[0, 10]])
    np.testing.assert_array_equal(out[0], [[60, 70]])


def test_all_to_all_array_and_tuple_forms():
    m = one_op("all-to-all", array("s32", (4,)), array("s32", (4,)), dimensions=(0,),
               replica_groups=ReplicaGroups(((0, 1),)))
    args = [[np.array([0, 1, 2, 3], np.int32)], [np.array([10, 11, 12, 13], np.int32)]]
    out = simulate(m, args, num_replicas=2)
    assert out[0].tolist() == [0, 1, 10, 11] and out[1].tolist() == [2, 3, 12, 13]
    s = array("s32", (1,))
    m = one_op("all-to-all", s, tuple_shape(s, s), n_operands=2,
               replica_groups=ReplicaGroups(((0, 1),)))
    args = [[np.array([0], np.int32), np.array([1], np.int32)],
            [np.array([10], np.int32), np.array([11], np.int32)]]
    out = simulate(m, args, num_replicas=2)
    assert [v.tolist() for v in out[0]] == [[0], [10]]
    assert [v.tolist() for v in out[1]] == [[1], [11]]


def test_collective_permute_ring_and_missing_source_cross_partition():
    s = array("f32", (2,))
    m = one_op("collective-permute", s, s, channel_id=1,
               source_target_pairs=((0, 1), (1, 2), (2, 3)))
    args = [[np.full(2, d + 1, np.float32)] for d in range(4)]
    out = simulate(m, args, num_replicas=1, num_partitions=4)
    assert [o.tolist() for o in out] == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_collective_broadcast_and_replica_partition_ids():
    s = array("f32", (1,))
    m = one_op("collective-broadcast", s, s, replica_groups=ReplicaGroups(((1, 0),)))
    out = simulate(m, [[np.array([5.0])], [np.array([7.0])]], num_replicas=2)
    assert [o.tolist() for o in out] == [[7.0], [7.0]]        # rank 0 of the group is 1


def test_collective_inside_loop_body_executes_repeatedly():
    # Two all-reduces of the same instruction object meet separately (sequence numbers).
    s = array("f32", (1,))
    comp = add_comp()
    b = Builder("main")
    p = b.parameter(s)
    r1 = b.all_reduce(p, to_apply=comp, replica_groups=ReplicaGroups(()), shape=s)
    b.all_reduce(r1, to_apply=comp, replica_groups=ReplicaGroups(()), shape=s)
    out = simulate(b.module(called=(comp,)), [[np.array([1.0])], [np.array([2.0])]], 2)
    assert [o.tolist() for o in out] == [[6.0], [6.0]]


def test_device_that_skips_a_collective_times_out_clearly():
    s = array("f32", (1,))
    comp = add_comp()
    m = one_op("all-reduce", s, s, (comp,), replica_groups=ReplicaGroups(((0, 1, 2),)),
               to_apply=comp)
    # 3 devices in the group but only 2 devices exist in the run -> device 2 never arrives.
    with pytest.raises(EvaluationError, match=r"timed out .* devices \[2\] never reached"):
        simulate(m, [[np.array([1.0])], [np.array([2.0])]], num_replicas=2, timeout=0.5)


def test_waiting_device_times_out_when_peer_takes_another_path():
    # Device 1's argument count is wrong, so it fails at once; device 0 must not hang.
    s = array("f32", (1,))
    comp = add_comp()
    m = one_op("all-reduce", s, s, (comp,), replica_groups=ReplicaGroups(((0, 1),)),
               to_apply=comp)
    with pytest.raises(EvaluationError, match="arguments"):
        simulate(m, [[np.array([1.0])], []], num_replicas=2, timeout=5)


def test_cross_replica_and_partition_rank_order_by_numerics_mode():
    # StableHLO's all_gather test (issue 1933): 2 replicas x 2 partitions, channel set, no
    # global ids, replica_groups {{0,1}}: one group of all 4 devices. XLA ranks them replica
    # by replica ((0,0),(0,1),(1,0),(1,1)); the spec partition by partition
    # ((0,0),(1,0),(0,1),(1,1)). Device (r=1, p=0) holds [[1,2],[3,4]], the rest [[5,6],[7,8]].
    s_in, s_out = array("s64", (2, 2)), array("s64", (2, 8))
    both = one_op("all-gather", s_in, s_out, dimensions=(1,),
                  replica_groups=ReplicaGroups(((0, 1),)), channel_id=1)
    assert device_groups(both.entry.root, 2, 2, "spec") == [[0, 2, 1, 3]]
    a = np.array([[1, 2], [3, 4]], np.int64)
    b = np.array([[5, 6], [7, 8]], np.int64)
    args = [[b], [b], [a], [b]]
    spec = simulate(both, args, num_replicas=2, num_partitions=2, numerics="spec")
    xla = simulate(both, args, num_replicas=2, num_partitions=2)
    for out in spec:
        np.testing.assert_array_equal(out, [[5, 6, 1, 2, 5, 6, 5, 6], [7, 8, 3, 4, 7, 8, 7, 8]])
    for out in xla:
        np.testing.assert_array_equal(out, [[5, 6, 5, 6, 1, 2, 5, 6], [7, 8, 7, 8, 3, 4, 7, 8]])
