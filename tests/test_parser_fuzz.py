"""Parser and importer fuzzing: mutated HLO text and StableHLO MLIR give only ``HlotkError``
subclasses whose message names a ``file:line:col`` location: never another exception type,
a hang, or a huge allocation.

Seeds are real modules (XLA's HLO dumps in tests/data/hlo, MLIR that ``jax.jit`` lowers);
hypothesis mutates them: tokens deleted, duplicated and swapped, truncation, element types
swapped, dimensions made huge or negative, garbage bytes spliced in, deep nesting. A mutant
that still parses must also verify or fail with an HlotkError (no crash deeper in).

CI runs a fixed-seed slice (``derandomize``); ``HLOTK_FUZZ_PARSER_EXAMPLES=N`` runs N examples
per test instead (e.g. 20000 for a long run).
"""
from __future__ import annotations

import functools
import os
import re
import resource
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import hlo  # noqa: E402
from hlo.errors import HlotkError  # noqa: E402

EXAMPLES = int(os.environ.get("HLOTK_FUZZ_PARSER_EXAMPLES", "0") or 0)
LONG = EXAMPLES > 0
SETTINGS = settings(max_examples=EXAMPLES or 150, deadline=None, derandomize=not LONG,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SECONDS_PER_INPUT = 10          # a parse that takes longer than this is a hang
MEMORY_HEADROOM = 2 << 30       # address space a parse may add before it is "huge"

DATA = Path(__file__).parent / "data" / "hlo"
LOCATION = re.compile(r"[^\s:]*:\d+:\d+")
_TOKENS = re.compile(r"\s+|[A-Za-z_][\w.\-]*|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\"(?:[^\"\\]|\\.)*\"|.",
                     re.S)
DTYPES = ["f32", "f16", "bf16", "f64", "s32", "u8", "pred", "c64", "s4", "token", "f8e4m3fn"]
MLIR_DTYPES = ["f32", "f16", "bf16", "f64", "i32", "ui8", "i1", "complex<f32>", "index", "none"]
HUGE_DIMS = ["100000000000", "9223372036854775807", "18446744073709551616", "-1", "-7", "0",
             "4294967296", "99999999999999999999999999"]
GARBAGE = ["\x00", "\xff", "\u2603", "%", "{", "}", "(", ")", "[", "]", "=", ",", "\\", "\"",
           "ROOT", "ENTRY", "/*", "*/", "//", "->", "#", "^bb0", "0x", "1e999", "nan", "-inf",
           "dense<", ">", "<", "tensor<", "\n", "stablehlo.", "func.func"]


def _hlo_seeds() -> list[str]:
    # The smaller lowered/compiled dumps: enough op and attribute variety, fast to parse.
    files = sorted(DATA.glob("*.txt"), key=lambda p: p.stat().st_size)[:16]
    return [p.read_text() for p in files]


@functools.cache
def _mlir_seeds() -> list[str]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    x = np.ones((2, 3), np.float32)
    fns = [
        lambda a: jnp.tanh(a @ a.T).sum(axis=0),
        lambda a: jax.lax.fori_loop(0, 3, lambda i, v: v * 2 + i, a),
        lambda a: jax.lax.cond(a.sum() > 0, lambda v: jnp.sort(v, axis=1), lambda v: -v, a),
        lambda a: (jnp.cumsum(a, axis=1), a[:, ::-1], jnp.argmax(a, axis=1)),
        lambda a: jax.lax.dynamic_update_slice(a, a[:1, :2] * 3, (1, 1)).astype(jnp.bfloat16),
    ]
    return [jax.jit(f).lower(x).as_text() for f in fns]


@st.composite
def mutants(draw, seeds: Callable[[], list[str]], dtypes: list[str]) -> str:
    text = draw(st.sampled_from(seeds()))
    tokens = _TOKENS.findall(text)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "truncate", "dtype", "dim",
                                     "garbage", "nest", "replace"]))
        n = len(tokens)
        if n == 0:
            break
        i = draw(st.integers(0, n - 1))
        if kind == "delete":
            del tokens[i:i + draw(st.integers(1, 3))]
        elif kind == "duplicate":
            tokens[i:i] = tokens[i:i + draw(st.integers(1, 5))]
        elif kind == "swap":
            j = draw(st.integers(0, n - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == "truncate":
            tokens = tokens[:i]
        elif kind == "dtype":
            hits = [k for k, t in enumerate(tokens) if t in dtypes or t == "i64" or t == "s64"]
            if hits:
                tokens[draw(st.sampled_from(hits))] = draw(st.sampled_from(dtypes))
        elif kind == "dim":
            hits = [k for k, t in enumerate(tokens) if t.isdigit()]
            if hits:
                tokens[draw(st.sampled_from(hits))] = draw(st.sampled_from(HUGE_DIMS))
        elif kind == "garbage":
            tokens.insert(i, draw(st.one_of(st.sampled_from(GARBAGE),
                                            st.text(min_size=1, max_size=6))))
        elif kind == "nest":
            depth = draw(st.sampled_from([50, 1000, 20000]))
            opener = draw(st.sampled_from(["(", "{", "[", "tuple<", "tensor<"]))
            tokens.insert(i, opener * depth)
        elif kind == "replace":
            tokens[i] = draw(st.sampled_from(tokens))
    return "".join(tokens)


class _Hang(Exception):
    pass


@contextmanager
def _guarded() -> Iterator[None]:
    """A time limit (SIGALRM) and an address-space limit (the current size + headroom)."""
    def on_alarm(signum, frame):
        raise _Hang()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(SECONDS_PER_INPUT)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    cap = used + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)


def _must_fail_cleanly(parse: Callable[[str], object], text: str) -> None:
    try:
        with _guarded():
            module = parse(text)
            hlo.verify(module)
    except HlotkError as e:
        message = str(e)
        assert LOCATION.search(message) or _names_an_instruction(e), (
            f"{type(e).__name__} without a file:line:col location: {message[:500]}\n"
            f"--- input ---\n{text[:3000]}")
    except _Hang:
        pytest.fail(f"no answer in {SECONDS_PER_INPUT} s\n--- input ---\n{text[:3000]}")
    except RecursionError:
        pytest.fail(f"RecursionError (nesting)\n--- input ---\n{text[:300]}")
    except MemoryError:
        pytest.fail(f"MemoryError: a parse allocated over {MEMORY_HEADROOM >> 30} GiB\n"
                    f"--- input ---\n{text[:3000]}")
    except Exception as e:  # noqa: BLE001  (the point of the test)
        raise AssertionError(f"{type(e).__name__} escaped: {e}\n--- input ---\n"
                             f"{text[:3000]}") from e


def _names_an_instruction(e: HlotkError) -> bool:
    # The verifier checks a parsed module, whose text positions are gone: it names the
    # computation and instruction instead (``in %comp, instruction %name:``).
    return isinstance(e, hlo.VerifierError) and bool(getattr(e, "instruction", None))


@SETTINGS
@given(mutants(_hlo_seeds, DTYPES))
def test_mutated_hlo_text(text: str) -> None:
    _must_fail_cleanly(lambda t: hlo.parse_hlo(t, filename="fuzz.hlo"), text)


@SETTINGS
@given(mutants(_mlir_seeds, MLIR_DTYPES))
def test_mutated_mlir(text: str) -> None:
    _must_fail_cleanly(hlo.from_stablehlo, text)


@SETTINGS
@given(st.binary(max_size=200))
def test_garbage_bytes(data: bytes) -> None:
    _must_fail_cleanly(lambda t: hlo.parse_hlo(t.decode("utf-8", "replace"), filename="g.hlo"),
                       data)
    try:
        with _guarded():
            hlo.from_stablehlo(data)
    except HlotkError:
        pass


@pytest.mark.parametrize("text", [
    "HloModule m\nENTRY e {\n  ROOT c = f32[100000000000] constant({1})\n}\n",
    "HloModule m\nENTRY e {\n  ROOT c = f32[-1] parameter(0)\n}\n",
    # Found by the fuzzer: the computation reserved 1e11 parameter slots (a hang).
    "HloModule m\nENTRY e {\n  ROOT c = f32[] parameter(100000000000)\n}\n",
    "HloModule m\nENTRY e {\n  ROOT c = f32[18446744073709551616] parameter(0)\n}\n",
    "HloModule m\nENTRY e {\n  ROOT p = " + "(" * 20000 + "f32[]" + ")" * 20000
    + " parameter(0)\n}\n",
    "HloModule m\nENTRY e {\n  ROOT c = f32[3] constant(" + "{" * 20000 + "1" + "}" * 20000
    + ")\n}\n",
])
def test_hostile_hlo(text: str) -> None:
    with pytest.raises(HlotkError, match=r"fuzz\.hlo:\d+:\d+"):
        with _guarded():
            hlo.parse_hlo(text, filename="fuzz.hlo")


def _mlir_nested(kind: str, depth: int) -> str:
    if kind == "tuple":
        ty = "tuple<" * depth + "f32" + ">" * depth
        return (f"func.func @main(%a: {ty}) -> tensor<f32> {{\n"
                "  %0 = stablehlo.constant dense<1.0> : tensor<f32>\n"
                "  return %0 : tensor<f32>\n}\n")
    if kind == "dense":
        return ("func.func @main() -> tensor<1xf32> {\n  %0 = stablehlo.constant dense<"
                + "[" * depth + "1.0" + "]" * depth + "> : tensor<1xf32>\n"
                "  return %0 : tensor<1xf32>\n}\n")
    return ("func.func @main() -> tensor<f32> attributes {x = " + "[" * depth + "1"
            + "]" * depth + "} {\n  %0 = stablehlo.constant dense<1.0> : tensor<f32>\n"
            "  return %0 : tensor<f32>\n}\n")


@pytest.mark.parametrize("kind", ["tuple", "dense", "attr"])
def test_deeply_nested_mlir_is_refused_before_mlir_parses_it(kind: str) -> None:
    # 100000 levels crashed the process in MLIR's recursive parser (SIGSEGV); 1000 nested
    # tuple types ended in a RecursionError in the importer.
    with pytest.raises(hlo.HloImportError, match=r"-:\d+:\d+: brackets nest deeper than"):
        with _guarded():
            hlo.from_stablehlo(_mlir_nested(kind, 100000))
    with pytest.raises(hlo.HloImportError, match=r"-:\d+:\d+: brackets nest deeper than"):
        hlo.from_stablehlo(_mlir_nested(kind, 1000))


def test_entry_layout_mismatch_is_a_parse_error_at_the_header() -> None:
    # Found by the fuzzer (truncated text: the last computation became the entry): the
    # mismatch surfaced later as a VerifierError with no position in the text.
    text = ("HloModule m, entry_computation_layout={(f32[4]{0})->f32[]}\n\n"
            "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
            "  ROOT s = f32[] add(a, b)\n}\n")
    with pytest.raises(hlo.ParseError, match=r"fuzz\.hlo:1:14: .*has 1 parameters but the "
                                             r"entry takes 2"):
        hlo.parse_hlo(text, filename="fuzz.hlo")


def test_module_attribute_of_the_wrong_kind() -> None:
    # Found by the fuzzer: a ValueError from the MLIR bindings' IntegerAttr cast escaped.
    text = ("module @m attributes {mhlo.num_partitions = i32} {\n"
            "  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
            "    return %a : tensor<2xf32>\n  }\n}\n")
    with pytest.raises(hlo.HloImportError, match=r"-:1:1: cannot import: ValueError"):
        hlo.from_stablehlo(text)
