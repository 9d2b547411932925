"""XLA's fusion decisions beside hlotk's, for one program (``hlotk compare-xla``).

Both modules are cut into *kernels* (what launches: fusions, library calls, unfused
non-free instructions; control flow contributes its bodies' kernels). Each kernel is known
by the original JAX operations it computes: the ``op_name`` of every instruction inside
it, without the ``jit(f)/`` prefix (the two sides may name the function differently), plus
the source line when both modules point into the same file. A key found in exactly as
many kernels on both sides pairs them in program order; a key shared unevenly joins all
of its kernels. The connected components of that bipartite graph (networkx) are the
aligned groups: 1:1 means the same kernel, 1:n "XLA fused, hlotk split", m:1 "hlotk
fused, XLA split". Bytes and predicted µs of every kernel come from hlotk's cost model
(``passes/fusion/cost_model.py``) on the same device spec, so the two sides are comparable
however the real kernels were timed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import hlo
from hlo.errors import HlotkError
from hlo.graph import source_location
from hlo.ir import Instruction, Module

from .inputs import InputFileError


class CompareError(HlotkError):
    """Bad input to ``compare-xla`` (a function spec, an argument shape, a dump)."""


_JIT_PREFIX = re.compile(r"^(?:jit\([^)]*\)/)+")
_CONTROL = ("while", "conditional", "call")


@dataclass
class Kernel:
    side: str                 # "xla" | "hlotk"
    name: str                 # the top-level instruction
    what: str                 # fusion kind, custom-call target or opcode
    keys: list[str]           # original operations inside, in order (with repeats)
    bytes_moved: int
    predicted_us: Optional[float]   # None where the cost model does not know the op
    members: list[str] = field(default_factory=list)   # instruction names inside (viewer)


@dataclass
class Group:
    xla: list[Kernel]
    hlotk: list[Kernel]

    @property
    def verdict(self) -> str:
        m, n = len(self.xla), len(self.hlotk)
        if m == 1 and n == 1:
            return "same"
        if m == 0:
            return "only hlotk"
        if n == 0:
            return "only XLA"
        if m == 1:
            return "XLA fused, hlotk split"
        if n == 1:
            return "hlotk fused, XLA split"
        return "regrouped"


@dataclass
class Comparison:
    xla_module: Module
    hlotk_module: Module
    target: str
    groups: list[Group]
    use_lines: bool

    def kernels(self, side: str) -> list[Kernel]:
        return [k for g in self.groups for k in (g.xla if side == "xla" else g.hlotk)]

    def totals(self, side: str) -> tuple[int, int, float]:
        ks = self.kernels(side)
        return len(ks), sum(k.bytes_moved for k in ks), sum(k.predicted_us or 0.0 for k in ks)

    def differing(self) -> list[Group]:
        return [g for g in self.groups if g.verdict != "same"]

    def report(self) -> str:
        """The comparison as text: totals, then one block per group that differs."""
        xk, xb, xt = self.totals("xla")
        hk, hb, ht = self.totals("hlotk")
        lines = [f"XLA ({self.xla_module.name}) vs hlotk ({self.hlotk_module.name}), cost model "
                 f"for {self.target}; aligned by op_name"
                 + (" and source line" if self.use_lines else " (source lines differ: op_name only)"),
                 f"{'':14}{'kernels':>8}{'MB moved':>12}{'pred. µs':>11}",
                 f"{'XLA':14}{xk:>8}{xb / 1e6:>12.2f}{xt:>11.1f}",
                 f"{'hlotk':14}{hk:>8}{hb / 1e6:>12.2f}{ht:>11.1f}"]
        verdicts: dict[str, int] = {}
        for g in self.groups:
            verdicts[g.verdict] = verdicts.get(g.verdict, 0) + 1
        lines.append("groups: " + ", ".join(f"{n} {v}" for v, n in verdicts.items()))
        for g in self.groups:
            if g.verdict == "same":
                continue
            lines.append("")
            lines.append(f"[{g.verdict}]")
            for k in g.xla + g.hlotk:
                us = "?" if k.predicted_us is None else f"{k.predicted_us:.2f}"
                ops = ", ".join(dict.fromkeys(k.keys)) or "(no op_name)"
                lines.append(f"  {k.side:5} %{k.name} ({k.what}): {k.bytes_moved / 1e6:.3f} MB, "
                             f"{us} µs; {_clip(ops, 110)}")
        same = [g for g in self.groups if g.verdict == "same"]
        if same:
            lines.append("")
            lines.append(f"[same] {len(same)} kernel{'s' * (len(same) != 1)}: " + _clip(", ".join(
                f"%{g.xla[0].name}={g.hlotk[0].name}" for g in same), 400))
        return "\n".join(lines) + "\n"

    def viewer(self, title: Optional[str] = None) -> Any:
        """Both graphs side by side; a selection follows its group to the other side."""
        from .viewer import Pair, ViewerData
        data = ViewerData(title or f"XLA vs hlotk: {self.hlotk_module.name}")
        left = data.add_module(self.xla_module, "XLA", target=self.target)
        right = data.add_module(self.hlotk_module, "hlotk", target=self.target)
        for k, side in ((left, "xla"), (right, "hlotk")):   # the comparison's costs
            costs = {kern.name: kern for kern in self.kernels(side)}
            for comp in data.snapshots[k]["comps"]:
                for node in comp["nodes"]:
                    kern = costs.get(node["n"])
                    if kern is not None:
                        node["mb"] = kern.bytes_moved
                        if kern.predicted_us is None:
                            node.pop("pred", None)
                        else:
                            node["pred"] = round(kern.predicted_us, 3)
        pair = Pair("XLA | hlotk (kernels aligned by the operations they compute)", left, right)
        marks = {"same": "", "only XLA": "removed", "only hlotk": "added"}
        for gid, g in enumerate(self.groups):
            mark = marks.get(g.verdict, "changed")
            for k in g.xla:
                for n in [k.name] + k.members:
                    pair.groups_left[n] = gid
                if mark:
                    pair.marks_left[k.name] = mark
            for k in g.hlotk:
                for n in [k.name] + k.members:
                    pair.groups_right[n] = gid
                if mark:
                    pair.marks_right[k.name] = mark
        xk, xb, _ = self.totals("xla")
        hk, hb, _ = self.totals("hlotk")
        pair.notes = [f"kernels: XLA {xk}, hlotk {hk}", f"bytes moved: XLA {xb / 1e6:.2f} MB, "
                      f"hlotk {hb / 1e6:.2f} MB", f"{len(self.differing())} groups differ"]
        data.add_pair(pair)
        data.notes.append("orange: kernels grouped differently by the two compilers; green/red: "
                          "kernels only hlotk / only XLA launches")
        return data


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


# --- kernels of a module ---------------------------------------------------------------------
def op_key(inst: Instruction, use_lines: bool) -> Optional[str]:
    """The original operation an instruction computes: its op_name without the ``jit(f)/``
    prefix (+ ``@file:line`` when ``use_lines``); None without one."""
    name = inst.metadata.get("op_name")
    if not name:
        return None
    key = _JIT_PREFIX.sub("", str(name))
    if not key or _JIT_PREFIX.match(key + "/"):     # the whole function: says nothing
        return None
    if use_lines:
        src = source_location(inst)
        if src:
            key += "@" + os.path.basename(src)
    return key


def _inside(inst: Instruction) -> list[Instruction]:
    """The instructions a kernel computes (a fusion's body, nested fusions included)."""
    if inst.opcode != "fusion":
        return [inst]
    out = []
    for i in inst.attrs["calls"].instructions:
        if i.opcode == "fusion":
            out.extend(_inside(i))
        elif i.opcode != "parameter":
            out.append(i)
    return out


def _cost(inst: Instruction, spec: Any) -> tuple[int, Optional[float]]:
    """(bytes moved, predicted µs) by hlotk's cost model; a cuBLAS custom-call is costed
    as the dot it computes (its scratch workspace is not data moved)."""
    from passes.fusion.cost_model import predict
    est = predict(inst, spec)
    if inst.opcode != "custom-call":
        return est.bytes_moved, est.time_us
    moved, out_elements = est.bytes_moved, 0
    shape = inst.shape
    if shape.is_tuple and shape.elements:
        last = shape.elements[-1]
        if last.is_array and last.dtype.name in ("s8", "u8") and len(shape.elements) > 1:
            moved -= last.byte_size
        shape = shape.elements[0]
    if shape.is_array:
        out_elements = shape.size
    k = _gemm_contracting_size(inst)
    if k is None:
        return moved, None          # an unknown library call: bytes only
    from passes.fusion.cost_model import _tensor_kind
    rate = spec.tensor_rate(_tensor_kind(inst))
    return moved, spec.kernel_launch_us + max(moved / spec.bytes_per_us,
                                              2.0 * out_elements * k / rate)


def _gemm_contracting_size(inst: Instruction) -> Optional[int]:
    """K of a ``__cublas$...`` GEMM custom-call, from its backend_config."""
    import json
    import math
    if "cublas" not in str(inst.attrs.get("custom_call_target", "")):
        return None
    try:
        cfg = json.loads(str(inst.attrs.get("backend_config")))
        dims = cfg["gemm_backend_config"]["dot_dimension_numbers"]["lhs_contracting_dimensions"]
        lhs = inst.operands[0].shape
        return math.prod(lhs.dims[int(d)] for d in dims)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def kernels_of(module: Module, side: str, spec: Any, use_lines: bool) -> list[Kernel]:
    from passes.fusion.cost_model import is_free
    out: list[Kernel] = []

    def walk(comp: Any) -> None:
        for inst in comp.instructions:
            if inst.opcode in _CONTROL:
                for c in inst.called_computations:
                    walk(c)
                continue
            if is_free(inst):
                continue
            inside = _inside(inst)
            keys = [k for i in inside if (k := op_key(i, use_lines))]
            what = (inst.attrs.get("kind") if inst.opcode == "fusion" else
                    str(inst.attrs.get("custom_call_target")) if inst.opcode == "custom-call"
                    else inst.opcode)
            moved, us = _cost(inst, spec)
            out.append(Kernel(side, inst.name, str(what), keys, moved, us,
                              [i.name for i in inside if i is not inst]))
    walk(module.entry)
    return out


def _lines_agree(a: Module, b: Module) -> bool:
    """Use source lines only when they identify the same operations on both sides: at
    least half the op_names the two modules share must also share their file:line (not
    so when the program was re-typed in another file, or its lines moved)."""
    def keys(m: Module, lines: bool) -> set[str]:
        return {k for i in m.all_instructions() if (k := op_key(i, lines))}
    common = keys(a, False) & keys(b, False)
    return bool(common) and 2 * len(keys(a, True) & keys(b, True)) >= len(common)


def align(xla_kernels: list[Kernel], hlotk_kernels: list[Kernel]) -> list[Group]:
    import networkx as nx
    g = nx.Graph()
    for side, ks in (("xla", xla_kernels), ("hlotk", hlotk_kernels)):
        g.add_nodes_from((side, i) for i in range(len(ks)))
    where: dict[str, tuple[list[int], list[int]]] = {}
    for side, ks in ((0, xla_kernels), (1, hlotk_kernels)):
        for i, k in enumerate(ks):
            for key in dict.fromkeys(k.keys):
                where.setdefault(key, ([], []))[side].append(i)
    for xs, hs in where.values():
        if len(xs) == len(hs):
            g.add_edges_from((("xla", a), ("hlotk", b)) for a, b in zip(xs, hs))
        else:
            g.add_edges_from((("xla", a), ("hlotk", b)) for a in xs for b in hs)
    groups = []
    for comp in nx.connected_components(g):
        xs = sorted(i for s, i in comp if s == "xla")
        hs = sorted(i for s, i in comp if s == "hlotk")
        groups.append(Group([xla_kernels[i] for i in xs], [hlotk_kernels[i] for i in hs]))
    # program order: by the first kernel of either side
    groups.sort(key=lambda gr: (min([xla_kernels.index(k) for k in gr.xla], default=10**9),
                                min([hlotk_kernels.index(k) for k in gr.hlotk], default=10**9)))
    return groups


def compare(xla_module: Module, hlotk_module: Module, target: str) -> Comparison:
    """Align the kernels of the two modules; costs on ``target``'s device spec (the CPU
    pipeline fuses with the h100 model, so ``cpu`` is costed as h100)."""
    from passes.fusion.cost_model import get_device
    target = cost_target(target)
    spec = get_device(target)
    use_lines = _lines_agree(xla_module, hlotk_module)
    xk = kernels_of(xla_module, "xla", spec, use_lines)
    hk = kernels_of(hlotk_module, "hlotk", spec, use_lines)
    return Comparison(xla_module, hlotk_module, target, align(xk, hk), use_lines)


def cost_target(target: str) -> str:
    return "h100" if target == "cpu" else target


def looks_like_gpu(module: Module) -> bool:
    """XLA:GPU output: cuBLAS/cuDNN custom-calls or Triton fusions."""
    for inst in module.all_instructions():
        t = str(inst.attrs.get("custom_call_target", ""))
        if t.startswith(("__cublas", "__cudnn")) or "__triton" in str(inst.attrs.get("backend_config", "")):
            return True
    return False


# --- inputs ----------------------------------------------------------------------------------
def load_function(spec: str) -> Any:
    """``path/to/file.py:function`` -> the function object."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise CompareError(f"{spec!r}: expected FILE.py:FUNCTION")
    if not os.path.isfile(path):
        raise InputFileError(f"{path}: no such file")
    mod_name = f"_hlotk_compare_{Path(path).stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:   # the user's file: report where, without our traceback
        raise CompareError(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CompareError(f"{path} has no function {name!r}")
    return fn


def parse_arg_specs(specs: Sequence[str]) -> list[Any]:
    """``f32[8,16]`` ... -> ``jax.ShapeDtypeStruct`` (no memory is allocated)."""
    import jax
    out = []
    for k, s in enumerate(specs):
        try:
            shape = hlo.parse_shape(s)
        except HlotkError as e:
            raise CompareError(f"--args[{k}] {s!r}: not a shape such as f32[8,16]: {e}") from None
        if not shape.is_array:
            raise CompareError(f"--args[{k}] {s!r}: expected an array shape such as f32[8,16]")
        out.append(jax.ShapeDtypeStruct(tuple(shape.dims), shape.dtype.np_dtype))
    return out


def read_xla_dump(path: str) -> Module:
    """XLA's optimized module: a file (``compile().as_text()``), or a ``--xla_dump_to``
    directory (its ``*after_optimizations.txt``; the biggest when there are several)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("*after_optimizations.txt"), key=lambda f: f.stat().st_size)
        if not found:
            raise InputFileError(f"{path}: no *after_optimizations.txt in this directory "
                                 "(dump with XLA_FLAGS=--xla_dump_to=DIR)")
        p = found[-1]
    if not p.is_file():
        raise InputFileError(f"{path}: no such file or directory")
    return hlo.parse_hlo(p.read_text(), filename=str(p))


def hlotk_module_for(program: str, args: Sequence[str], target: str) -> tuple[Module, Any, list]:
    """hlotk's module, compiled through the default pipeline for ``target``; also the
    function and argument specs when ``program`` is ``file.py:fn``."""
    from passes import run_pipeline
    from passes.fusion.pass_ import with_target
    from passes.pipelines import pipeline_spec
    from .inputs import load_module
    fn, arg_specs = None, []
    if re.search(r"\.py:[A-Za-z_]\w*$", program):
        fn = load_function(program)
        arg_specs = parse_arg_specs(args)
        module = hlo.from_jax(fn, *arg_specs)
    else:
        if args:
            raise CompareError("--args only goes with FILE.py:FUNCTION")
        module = load_module(program)
    backend = "cpu" if target == "cpu" else "cuda"
    spec = pipeline_spec("default", backend)
    if target != "cpu":
        spec = with_target(spec, target)
    run_pipeline(module, spec)
    return module, fn, arg_specs


def xla_module_for(fn: Any, arg_specs: list) -> Module:
    """XLA's own optimized module for ``fn`` on the local JAX backend."""
    import jax
    text = jax.jit(fn).lower(*arg_specs).compile().as_text()
    return hlo.parse_hlo(text, filename="jax.jit(...).compile().as_text()")
