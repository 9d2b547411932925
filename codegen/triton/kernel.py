"""``compile_fusion``: one fusion instruction -> a ``TritonKernel`` (source file + launcher).

The generated source is a standalone Python file (Triton's JIT reads the source of the
function it compiles, so it must live in a real file): it is written into the kernel cache
(``codegen.cache``, ``$HLOTK_CACHE_DIR/triton/<name>_<hash>.py``) and imported by path.

Kernel arguments: input pointers (fusion parameters in order), output pointers, hidden
constant arrays, then the strides of each of those tensors in elements, then the
``tl.constexpr`` block sizes. Strides are read from the tensors at launch time, so a caller
that passes logical-shape views with physical strides (any layout) gets the right answer.
A flat loop kernel (``flat_loop.py``: purely elementwise, its source free of shapes) takes
the element count ``n`` instead of the strides; ``launch`` hands it dense views.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from hlo.ir import Computation, Instruction
from hlo.layout_util import dense_strides
from hlo.same import attrs_key, structure_key
from codegen.cache import KernelCache, cache_root, content_key

from . import direct_launch, jit_hash
from . import pdl as pdl_mod
from .pdl import Pdl
from .autotune import autotune_level, needs_timing, tune, tuned_config
from .canonical import canonical_text
from .elemental import Emitter, TritonCodegenError, helpers_for
from .flat_loop import dense_views, int_specialization
from .reductions import Split, legacy as legacy_reductions
from .reductions import rows_template as reduction_rows_template
from .templates import (NotTileable, Plan, gemm_template, loop_template, outputs_of, rows_template,
                        transpose_tile_dims, transpose_template)
from .update_slice import update_slice_template

GENERATOR_VERSION = "triton-1"
_CACHE = KernelCache("triton")
_MODULES: dict[str, Any] = {}

_NAME_SKIP = {"parameter", "constant", "tuple", "get-tuple-element", "broadcast", "bitcast",
              "reshape", "copy"}


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_name(comp: Computation) -> str:
    ops: list[str] = []
    for inst in comp.instructions:
        op = inst.opcode.replace("-", "_")
        if inst.opcode not in _NAME_SKIP and op not in ops:
            ops.append(op)
    suffix = "_finish" if comp.name.endswith(".finish") else ""   # a split reduction's 2nd kernel
    return "fused_" + "_".join(ops[:4] or ["copy"]) + suffix


def classify(fusion: Instruction) -> str:
    """Which template to try first: gemm | rows | update_slice | transpose | loop."""
    try:
        from passes.fusion.kinds import fusion_kind
        kind = fusion_kind(fusion)
    except ImportError:    # the fusion pass may not exist yet: look at the computation
        kind = ""
    comp = fusion.attrs["calls"]
    opcodes = {i.opcode for i in comp.instructions}
    if kind == "gemm" or "dot" in opcodes:
        return "gemm"
    if kind in ("normalization", "input") or "reduce" in opcodes:
        return "rows"
    root = comp.root
    if root.opcode == "dynamic-update-slice" and root.operands[0].opcode == "parameter" \
            and len(root.operands[0].users) == 1:
        return "update_slice"
    return "transpose" if transpose_tile_dims(comp) is not None else "loop"


def check_operand_shapes(kernel: Any, tensors: Sequence[Any], shapes: list, what: str,
                         error: type) -> None:
    """Raise ``error`` unless ``tensors`` are as many as ``shapes`` and of their dims: the
    launch check of a generated kernel (Triton's here, CUDA C's in codegen/cuda_c), naming
    the kernel, its fusion and the operand."""
    if len(tensors) != len(shapes):
        raise error(f"kernel {kernel.name} (fusion %{kernel.fusion_name}) takes "
                    f"{len(shapes)} {what}, got {len(tensors)}")
    for i, (t, s) in enumerate(zip(tensors, shapes)):
        if tuple(t.shape) != tuple(s.dims):
            raise error(f"kernel {kernel.name}: {what[:-1]} {i} has shape "
                        f"{tuple(t.shape)}, expected {tuple(s.dims)} ({s})")


@dataclass
class TritonKernel:
    """A generated Triton kernel for one fusion, loaded from its cached source file."""
    name: str
    source: str
    path: Path
    template: str
    config: dict
    plan: Plan
    fusion_name: str
    input_shapes: list
    output_shapes: list
    constants: list[np.ndarray]
    key: str
    autotune: int = 0             # level still to run at the first launch (autotune.py)
    target: str = "h100"
    predicted_us: float = 0.0     # the fusion cost model's time for this kernel
    predicted_bytes: int = 0
    predicted_flops: float = 0.0
    fusion_kind: str = ""
    _fn: Any = None
    _hash_primed: bool = False     # fn.hash set from / recorded in jit_hash's table
    _const_tensors: dict = field(default_factory=dict)
    _strides: Optional[list] = None   # a flat kernel's dense strides per input and output

    @property
    def grid(self) -> tuple:
        return self.plan.grid(self.config)

    @property
    def fn(self) -> Any:
        if self._fn is None:
            self._fn = getattr(_load_module(self.path), self.name)
            self._hash_primed = jit_hash.prime(self._fn, self.path, self.name)
        return self._fn

    def _check(self, tensors: Sequence[Any], shapes: list, what: str) -> None:
        check_operand_shapes(self, tensors, shapes, what, TritonCodegenError)

    @property
    def flat_n(self) -> Optional[int]:
        """The element count a flat loop kernel takes (``flat_loop.py``); None: strided."""
        return self.plan.flat_n

    @property
    def variant_tag(self) -> str:
        """What besides the source and config tells this kernel's Triton compiles apart
        (``parallel.variant_key``): a flat kernel's ``n`` by how Triton specializes it."""
        return "" if self.flat_n is None else "n=" + int_specialization(self.flat_n)

    def _args(self, outputs: Sequence[Any], inputs: Sequence[Any]) -> list:
        device = outputs[0].device
        consts = self._const_tensors.get(str(device))
        if consts is None:
            consts = [_to_torch(c).to(device) for c in self.constants]
            self._const_tensors[str(device)] = consts
        tensors = list(inputs) + list(outputs) + consts
        args: list = [_as_triton(t) for t in tensors]
        if self.flat_n is not None:
            args.append(self.flat_n)
            return args
        for t in tensors:
            args.extend(int(s) for s in t.stride())
        return args

    def _dense(self, outputs: Sequence[Any], inputs: Sequence[Any]
               ) -> tuple[list, list, list]:
        """A flat kernel reads and writes memory order: (outputs, inputs, pending copies)
        with every view not dense in its HLO layout replaced (``flat_loop.dense_views``)."""
        want = self._strides
        if want is None:
            want = self._strides = [dense_strides(s) for s in
                                    list(self.input_shapes) + list(self.output_shapes)]
        return dense_views(outputs, inputs, want)

    def launch(self, outputs: Sequence[Any], inputs: Sequence[Any], stream: Any = None,
               config: Optional[dict] = None) -> None:
        """Run the kernel: ``outputs``/``inputs`` are torch tensors of the logical shapes
        (views with any strides). ``stream``: a torch stream to launch on."""
        self._check(inputs, self.input_shapes, "inputs")
        self._check(outputs, self.output_shapes, "outputs")
        if any(math.prod(s.dims) == 0 for s in self.output_shapes):
            return
        pending: list = []
        if self.flat_n is not None:
            outputs, inputs, pending = self._dense(outputs, inputs)
        args = self._args(outputs, inputs)
        if config is None and self.autotune and not interpret_mode() and outputs[0].is_cuda:
            level, self.autotune = self.autotune, 0
            self.config = tune(self, list(outputs), list(inputs), args, level)
        cfg = dict(config or self.config)
        warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 1)
        grid = self.plan.grid(dict(cfg))
        # through the CUDA driver where it can, else Triton's launcher (direct_launch.py)
        kwargs = {**cfg, "num_warps": warps, "num_stages": stages}
        if stream is not None:
            import torch
            with torch.cuda.stream(stream):
                direct_launch.launch(self.fn, grid, args, kwargs)
        else:
            direct_launch.launch(self.fn, grid, args, kwargs)
        for dst, src in pending:
            dst.copy_(src)
        if not self._hash_primed:       # Triton's key for this function: next process reads it
            self._hash_primed = True
            jit_hash.record(self._fn, self.path, self.name)

    def __repr__(self) -> str:
        return f"<TritonKernel {self.name} ({self.template}) {self.config} at {self.path}>"


def _to_torch(arr: np.ndarray) -> Any:
    import torch
    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _as_triton(t: Any) -> Any:
    return t


def _load_module(path: Path) -> Any:
    key = str(path)
    mod = _MODULES.get(key)
    if mod is None:
        mod_name = f"hlotk_triton_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise TritonCodegenError(f"cannot import generated kernel {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
        _MODULES[key] = mod
    return mod


def _header(fusion: Instruction, comp: Computation, template: str, name: str) -> str:
    text = comp.to_text(print_metadata=False, print_large_constants=False)
    try:
        finst = fusion.to_text(print_metadata=False, print_large_constants=False,
                               print_backend_config=True)
    except Exception:   # noqa: BLE001  (printing is best effort for the comment)
        finst = f"%{fusion.name} = fusion(...)"
    lines = [f'"""{name}: Triton kernel generated by hlotk (codegen/triton, {GENERATOR_VERSION}).',
             "", f"Template: {template}. From the fusion", "", "    " + finst, "",
             "whose fused computation is:", ""]
    lines += ["    " + ln for ln in text.splitlines()]
    lines.append('"""')
    return "\n".join(line.replace('"""', "'''") if 0 < i < len(lines) - 1 else line
                     for i, line in enumerate(lines))


def _generate(fusion: Instruction, template: str, round_narrow: bool,
              split: Optional[Split] = None, pdl: Pdl = pdl_mod.NONE
              ) -> tuple[str, Plan, Emitter]:
    comp: Computation = fusion.attrs["calls"]
    em = Emitter(fusion.name, round_narrow)
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    for p in params:
        em.params[p.parameter_number] = f"p{p.parameter_number}"
        em.param_strides[p.parameter_number] = [f"s{p.parameter_number}_{d}" for d in range(p.shape.rank)]
    outs = outputs_of(comp)
    sizes = [math.prod(p.shape.dims) for p in params] + [math.prod(o.shape.dims) for o in outs]
    big = max(sizes, default=0) >= 2 ** 31 - 1
    try:
        if template == "gemm":
            plan = gemm_template(em, comp, big)
        elif template == "rows":
            # issue 14's one-pass and split reduction templates, unless asked for the old
            # ones (HLOTK_REDUCTION_TEMPLATES=legacy) to compare
            plan = (rows_template(em, comp, big) if legacy_reductions() and split is None
                    else reduction_rows_template(em, comp, big, split=split))
        elif template == "transpose":
            plan = transpose_template(em, comp, big)
        elif template == "update_slice":
            plan = update_slice_template(em, comp, big)
        else:
            plan = loop_template(em, comp, big, generic=(template == "generic"))
    except TritonCodegenError as e:
        e.partial_source = "\n".join(em.lines)   # type: ignore[attr-defined]
        raise
    name = kernel_name(comp) + ("_partials" if split is not None else "")
    if plan.output_shapes is not None:
        outs = plan.output_shapes    # type: ignore[assignment]
    args = [f"p{p.parameter_number}" for p in params] + [f"out{k}" for k in range(len(outs))]
    args += [f"const{k}" for k in range(len(em.extra_constants))]
    if plan.flat_n is not None:       # a flat loop kernel: the element count, no strides
        strides = ["n"]
    else:
        strides = [s for p in params for s in em.param_strides[p.parameter_number]]
        strides += [f"so{k}_{d}" for k, o in enumerate(outs)
                    for d in range(len(getattr(o, "shape", o).dims))]
        strides += [f"sc{k}_{d}" for k, c in enumerate(em.extra_constants) for d in range(c.ndim)]
    sig = ", ".join(args + strides + [f"{c}: tl.constexpr" for c in plan.constexprs])
    what = plan.template + (" (flat: the element count n is a launch argument)"
                            if plan.flat_n is not None else "")
    parts = [_header(fusion, comp, what, name), "",
             "import triton", "import triton.language as tl"]
    parts.append("from triton.language.extra import libdevice" if not interpret_mode() else "")
    if pdl:
        parts.append(pdl_mod.IMPORT)
    helpers = helpers_for("\n".join(list(em.combine_fns.values()) + em.lines), interpret_mode())
    if helpers:
        parts += ["", "", helpers]
    for src in em.combine_fns.values():
        parts += ["", src]
    parts += ["", "@triton.jit", f"def {name}({sig}):"]
    parts += pdl_mod.prologue(pdl)    # before any load (pdl.py)
    parts += em.lines
    return "\n".join(parts) + "\n", plan, em


def _write_partial(fusion: Instruction, err: TritonCodegenError) -> Path:
    partial = getattr(err, "partial_source", "")
    path = cache_root() / "triton" / "failed" / f"{fusion.name}.py"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# FAILED: {err}\n# partial kernel body for fusion %{fusion.name}:\n{partial}\n")
    except OSError:
        pass
    return path


@dataclass
class _Generated:
    """What ``compile_fusion`` makes of one fused computation, whatever fusion instruction
    holds it: the kernel's name, source (the cache's copy), file, cache key, launch plan
    and hidden constants."""
    name: str
    source: str
    path: Path
    key: str
    plan: Plan
    constants: list


def compile_fusion(fusion_inst: Instruction, *, target: str = "h100", autotune: bool | int = 0,
                   round_narrow_each_op: bool = True, template: Optional[str] = None,
                   split: Optional[Split] = None, pdl: Optional[Pdl] = None,
                   memo: Optional[dict] = None) -> TritonKernel:
    """Generate (or fetch from the cache) the Triton kernel for one ``fusion`` instruction.

    ``template``: force gemm | rows | loop | generic (default: chosen from the fusion).
    ``round_narrow_each_op``: round bf16/f16 after each elementwise op (our interpreter's
    numerics) instead of keeping f32 between ops. ``autotune``: 0/1/2 (off, pruned,
    exhaustive; ``codegen.triton.autotune``); a config already tuned for this kernel
    source, device and Triton version is used without measuring. ``split``: the partials
    kernel of a split reduction (``reductions.split_of``); its outputs are the partials.
    ``pdl``: the kernel's part in programmatic dependent launch (``pdl.py``); None: what
    ``HLOTK_PDL`` gives a kernel (a split reduction's partials kernel, with ``split``).
    Dropped where PDL is unavailable (Triton's interpreter).
    ``memo``: a dict the caller keeps for one executable's build (the same environment
    throughout): a fusion whose instruction and fused computation are an earlier one's up
    to instruction names and metadata (``hlo.same.structure_key``) takes that one's
    generated source, file and plan instead of generating, canonicalizing and looking up
    the same text again (issue 13: the Adam step's 25 fusions are 6 distinct kernels); its
    own kernel object still has its fusion's name and predicted cost.
    """
    if fusion_inst.opcode != "fusion":
        raise TritonCodegenError(f"%{fusion_inst.name} is a {fusion_inst.opcode}, not a fusion")
    comp: Computation = fusion_inst.attrs["calls"]
    if pdl is None:
        pdl = pdl_mod.role("split_partials" if split is not None else "kernel")
    elif pdl and pdl_mod.unavailable():
        pdl = pdl_mod.NONE
    mkey = None
    if memo is not None:
        try:
            mkey = (_structure(fusion_inst, comp), template, round_narrow_each_op, split, pdl,
                    target)
            hash(mkey)
        except TypeError:      # an attribute value with no hashable form: generate
            mkey = None
    gen = memo.get(mkey) if mkey is not None else None   # type: ignore[union-attr]
    if gen is None:
        gen = _generate_kernel(fusion_inst, comp, template, round_narrow_each_op, split, pdl,
                               target)
        if mkey is not None:
            memo[mkey] = gen                                 # type: ignore[index]
    plan = copy.copy(gen.plan)   # each kernel its own (config dicts are copied below)
    plan.config = dict(plan.config)
    plan.candidates = [dict(c) for c in plan.candidates]
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    cfg = dict(plan.config)
    level = autotune_level(autotune)
    tuned = tuned_config(gen.key) if level else None
    if tuned is not None and pdl.wait:
        tuned = dict(tuned, launch_pdl=True)
    from passes.fusion.cost_model import get_device, predict
    from passes.fusion.kinds import fusion_kind
    est = predict(fusion_inst, target)
    kernel = TritonKernel(name=gen.name, source=gen.source, path=gen.path,
                          template=plan.template, config=tuned or cfg, plan=plan,
                          fusion_name=fusion_inst.name,
                          input_shapes=[p.shape for p in params],
                          output_shapes=(list(plan.output_shapes) if plan.output_shapes is not None
                                         else [o.shape for o in outputs_of(comp)]),
                          constants=list(gen.constants), key=gen.key,
                          autotune=0 if tuned else level, target=target,
                          predicted_us=est.time_us, predicted_bytes=est.bytes_moved,
                          predicted_flops=est.flops, fusion_kind=fusion_kind(fusion_inst))
    if kernel.autotune and not needs_timing(kernel, kernel.autotune, get_device(target)):
        kernel.autotune = 0      # one config to try (a loop kernel at level 1): nothing to time
    return kernel


def _structure(fusion_inst: Instruction, comp: Computation) -> tuple:
    """What of a fusion instruction the generated kernel depends on, but its names: its
    shape and attributes (kind, backend config) and its fused computation's structure;
    of the computation's own name, whether it is a split reduction's finish."""
    return (fusion_inst.shape, comp.name.endswith(".finish"), structure_key(comp),
            attrs_key(fusion_inst.attrs, frozenset({"calls", "metadata"})))


def _generate_kernel(fusion_inst: Instruction, comp: Computation, template: Optional[str],
                     round_narrow_each_op: bool, split: Optional[Split], pdl: Pdl,
                     target: str) -> _Generated:
    first = template or classify(fusion_inst)
    order = [first] + (["loop"] if first in ("transpose", "update_slice") else []) + \
        (["generic"] if first != "generic" else [])
    if split is not None:
        order = ["rows"]
    last_err: Optional[Exception] = None
    for t in order:
        try:
            source, plan, em = _generate(fusion_inst, t, round_narrow_each_op, split, pdl)
            break
        except NotTileable as e:
            last_err = e
            continue
        except TritonCodegenError as e:
            path = _write_partial(fusion_inst, e)
            raise TritonCodegenError(f"{e} (partial source kept at {path})") from e
    else:
        raise TritonCodegenError(f"fusion %{fusion_inst.name}: no template fits ({last_err})")
    name = kernel_name(comp) + ("_partials" if split is not None else "")
    # Keyed by the code without the HLO names (canonical.py): a fusion computing what an
    # earlier one computes, over the same shapes, loads that one's file (its names in the
    # comments) and shares its Triton compile.
    key = f"{name}_{content_key(canonical_text(source), GENERATOR_VERSION, target)[:16]}"
    generated = source
    source = _CACHE.get_or_create(key, lambda: generated)
    path = _CACHE.path(key)
    if not path.exists():   # an unwritable cache: keep a private copy so Triton can read it
        import tempfile
        path = Path(tempfile.mkdtemp(prefix="hlotk_triton_")) / f"{key}.py"
        path.write_text(source)
    if pdl.wait:
        # launched with the PDL attribute (Triton's compile option; the metadata carries it
        # to the launch): in every config, those autotuning tries included
        plan.config = dict(plan.config, launch_pdl=True)
        plan.candidates = [dict(c, launch_pdl=True) for c in plan.candidates]
    return _Generated(name, source, path, key, plan, list(em.extra_constants))
