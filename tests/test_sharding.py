"""hlo.sharding: every spelling XLA's text format has, parsed, queried and printed back."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hlo import ParseError, Raw
from hlo.sharding import Sharding, parse_sharding

SPELLINGS = [
    "{replicated}",
    "{maximal device=3}",
    "{manual}",
    "{unknown}",
    "{unreduced}",
    "{devices=[2,1]0,1}",
    "{devices=[4]3,2,1,0}",
    "{devices=[2,2]0,2,1,3}",
    "{devices=[2,2]<=[4]}",
    "{devices=[2,2]<=[2,2]T(1,0)}",
    "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
    "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
    "{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,2]<=[4] last_tile_dims={manual}}",
    "{{replicated}, {devices=[2]0,1}}",
    "{{replicated}, {replicated}, {replicated}, {replicated}, {replicated}, /*index=5*/{manual}}",
    "{}",
    "{devices=[2]0,1 shard_as 1}",
    "{replicated shard_like 2}",
    '{replicated metadata={op_name="a"}}',
    '{devices=[2]0,1 metadata={{op_name="a"}, {op_name="b"}}}',
]


@pytest.mark.parametrize("text", SPELLINGS)
def test_round_trip(text):
    s = parse_sharding(text)
    assert str(s) == text
    assert parse_sharding(str(s)) == s


def test_xla_agrees_with_our_spelling():
    """XLA's HloSharding parses each spelling and prints what we print (sans metadata)."""
    try:
        from jaxlib import _hlo  # noqa: F401
    except ImportError:
        pytest.skip("jaxlib._hlo not available")
    code = ("import json,sys\nfrom jaxlib import _hlo\n"
            "print(json.dumps([str(_hlo.HloSharding.from_string(t)) "
            "for t in json.load(sys.stdin)]))")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(SPELLINGS),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    for text, xla in zip(SPELLINGS, json.loads(r.stdout)):
        assert parse_sharding(text).to_text(include_metadata=False) == xla


def test_kinds_and_queries():
    r = parse_sharding("{replicated}")
    assert r == Sharding.replicated() and r.is_replicated and r.num_tiles == 1
    m = parse_sharding("{maximal device=3}")
    assert m.is_maximal and m.device == 3 and m.tile_assignment.tolist() == [3]
    assert parse_sharding("{manual}").is_manual
    assert parse_sharding("{unknown}").kind == "unknown"

    t = parse_sharding("{devices=[2,1]0,1}")
    assert t.is_tiled and not t.is_iota and not t.is_replicated
    assert t.tile_assignment.tolist() == [[0], [1]] and t.num_tiles == 2
    assert t == Sharding.tiled(np.array([[0], [1]]))

    iota = parse_sharding("{devices=[2,2]<=[4]}")
    assert iota.is_iota and iota.tile_assignment.tolist() == [[0, 1], [2, 3]]
    assert iota == Sharding.iota((2, 2))
    tr = parse_sharding("{devices=[2,2]<=[2,2]T(1,0)}")
    assert tr.tile_assignment.tolist() == [[0, 2], [1, 3]]
    # A transposed iota and the same devices listed out denote the same placement.
    assert np.array_equal(tr.tile_assignment,
                          parse_sharding("{devices=[2,2]0,2,1,3}").tile_assignment)
    odd = parse_sharding("{devices=[2,4]<=[2,2,2]T(2,0,1)}")
    assert odd.tile_assignment.tolist() == \
        np.arange(8).reshape(2, 2, 2).transpose(2, 0, 1).reshape(2, 4).tolist()


def test_partial_replication():
    s = parse_sharding("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}")
    assert s.last_tile_dim_replicate and s.num_subgroup_dims == 1
    assert s.data_tile_dims == (2, 1) and s.num_tiles == 2 and s.num_devices == 4
    assert s.tile_assignment.shape == (2, 1, 2)
    # Tiled only along the replicated dim: every device holds everything.
    assert parse_sharding("{devices=[1,1,4]<=[4] last_tile_dim_replicate}").is_replicated
    g = parse_sharding("{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert g.last_tile_dims == ("manual", "replicated")
    assert g.data_tile_dims == (2, 1) and g.num_tiles == 2 and not g.is_replicated


def test_tuple_and_extras():
    t = parse_sharding("{{replicated}, {devices=[2]0,1}, {maximal device=1}}")
    assert t.is_tuple and len(t.elements) == 3
    assert t.elements[1].tile_assignment.tolist() == [0, 1]
    assert not t.is_replicated
    assert parse_sharding("{{replicated}, {replicated}}").is_replicated
    assert parse_sharding("{}") == Sharding.tuple(())
    with pytest.raises(ValueError):
        t.num_tiles
    g = parse_sharding("{devices=[2]0,1 shard_as 1}")
    assert g.shard_group == "shard_as 1"
    md = parse_sharding('{replicated metadata={op_name="x" source_line=3}}')
    assert md.metadata == Raw('{op_name="x" source_line=3}')
    assert md.to_text(include_metadata=False) == "{replicated}"
    with pytest.raises(ValueError):
        parse_sharding("{replicated}").tile_assignment


@pytest.mark.parametrize("text,col,message", [
    ("{devices=[2,1]0}", 15, "tile grid [2,1] needs 2 device ids but found 1"),
    ("{foo}", 2, "expected 'replicated', 'maximal', 'manual', 'unknown' or 'devices=' but "
                 "found 'foo'"),
    ("{devices=[2]<=[3]}", 16, "expected iota dims with 2 devices but found '3'"),
    ("{replicated", 12, "expected '}' or a sharding option but found end of text"),
    ("{maximal device=x}", 17, "expected an integer but found 'x'"),
    ("{devices=[2,2]<=[4]T(0,0)}", 22, "expected a permutation of 1 dims"),
    ("{replicated} x", 14, "expected end of sharding but found 'x'"),
    ("{devices=[2]0,1 last_tile_dims={bogus}}", 33, "expected 'manual' or 'replicated'"),
    ("replicated", 1, "expected '{' but found 'replicated'"),
])
def test_errors(text, col, message):
    with pytest.raises(ParseError) as e:
        parse_sharding(text)
    assert (e.value.line, e.value.column) == (1, col), str(e.value)
    assert message in e.value.message


def test_error_position_is_offset_into_a_larger_file():
    with pytest.raises(ParseError) as e:
        parse_sharding("{foo}", filename="m.hlo", line=7, column=30)
    assert str(e.value).startswith("m.hlo:7:31: ")
