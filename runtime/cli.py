"""The ``hlotk`` command line: import, compile, run, diff and check programs.

    hlotk import prog.mlir -o prog.hlo      # print (or write) the HLO text
    hlotk compile prog.hlo --passes default --dump out/dump   # passes, per-pass dump
    hlotk run prog.hlo --inputs x.npy       # run on the CPU, summarize the outputs
    hlotk diff a.hlo b.hlo --html d.html    # what changed, aligned by instruction name
    hlotk view dump/                        # the interactive viewer (module file or dump)
    hlotk compare-xla f.py:fn --args f32[8,16]   # XLA's kernels beside hlotk's
    hlotk check suite/*.mlir                # the StableHLO interpreter conformance files
    hlotk calibrate --target h200           # fit the cost model to measured kernels (GPU)

Errors the user can cause print ``hlotk: error: ...`` on stderr and exit with 2 (1 when
``check`` finds failures); no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence, TextIO

import numpy as np

from hlo.errors import HlotkError

from . import inputs as inputs_mod

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` via a temp file and a rename: never a partial file (see dump.atomic_write)."""
    from .dump import atomic_write
    atomic_write(Path(path), text)


# --- subcommands ------------------------------------------------------------------------------
def cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    module = inputs_mod.load_module(args.file)
    text = module.to_text()
    if args.output:
        try:
            write_atomically(args.output, text)
        except OSError as e:
            raise inputs_mod.InputFileError(f"{args.output}: cannot write: {e.strerror}") from None
    else:
        out.write(text)
        if not text.endswith("\n"):
            out.write("\n")
    return EXIT_OK


def _summary(x: np.ndarray, first: int = 6) -> str:
    flat = x.reshape(-1)
    head = ", ".join(str(v) for v in flat[:first]) + (", ..." if flat.size > first else "")
    if flat.size == 0:
        return "empty"
    if x.dtype == np.bool_:
        return f"true={int(flat.sum())}/{flat.size}  first=[{head}]"
    wide = flat.astype(np.complex128 if np.iscomplexobj(flat) else np.float64)
    if np.iscomplexobj(wide):
        return f"mean={wide.mean():.6g}  first=[{head}]"
    return (f"min={wide.min():.6g}  max={wide.max():.6g}  mean={wide.mean():.6g}  "
            f"first=[{head}]")


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from . import client as make_client

    module = inputs_mod.load_module(args.file)
    c = make_client("cpu")
    exe = c.compile(module)
    if args.inputs:
        values = inputs_mod.load_npy(args.inputs)
    else:
        values = inputs_mod.random_inputs(exe.parameter_shapes, seed=args.seed)
        out.write(f"inputs: {len(values)} random (seed {args.seed})\n")

    def to_buffers(v):
        return tuple(to_buffers(e) for e in v) if isinstance(v, tuple) else c.buffer_from_pyval(v)
    results = exe.execute([to_buffers(v) for v in values])
    for i, (buf, shape) in enumerate(zip(results, exe.result_shapes)):
        arr = buf.to_numpy()
        out.write(f"output {i}: {shape.to_text(print_layout=False)}  {_summary(arr)}\n")
    if args.save_outputs:
        os.makedirs(args.save_outputs, exist_ok=True)
        for i, buf in enumerate(results):
            path = os.path.join(args.save_outputs, f"output_{i}.npy")
            np.save(path, buf.to_numpy())
        out.write(f"saved {len(results)} outputs to {args.save_outputs}\n")
    return EXIT_OK


def cmd_compile(args: argparse.Namespace, out: TextIO) -> int:
    from .tools import compile_module, format_records
    module = inputs_mod.load_module(args.file)
    spec = args.passes
    if getattr(args, "target", None):
        from passes.fusion.pass_ import with_target
        from passes.pipelines import pipeline_spec
        spec = with_target(pipeline_spec(spec, "cpu"), args.target)
    records, index = compile_module(module, spec, backend="cpu", dump_dir=args.dump,
                                    verify=args.verify, render_svg=not args.no_svg)
    if args.output:
        write_atomically(args.output, module.to_text())
    elif not args.quiet:
        out.write(module.to_text())
    err = sys.stderr if not args.quiet else None
    if err is not None:
        err.write(format_records(records) + "\n")
    if index is not None:
        (err or out).write(f"dump: {index}\n")
        from hlo.render import DOT_MISSING_HINT, dot_available
        if not dot_available() and err is not None:
            err.write(DOT_MISSING_HINT + "\n")
    return EXIT_OK


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    from .tools import diff_texts
    texts = []
    for p in (args.a, args.b):
        try:
            with open(p, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError as e:
            raise inputs_mod.InputFileError(f"{p}: {e.strerror}") from None
    return diff_texts(texts[0], texts[1], name_a=args.a, name_b=args.b, html_out=args.html, out=out)


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from .conformance import main_check
    for p in args.files:
        if not os.path.exists(p):
            raise inputs_mod.InputFileError(f"{p}: no such file")
    return int(main_check(list(args.files), out=out))


def cmd_explain_fusion(args: argparse.Namespace, out: TextIO) -> int:
    """Simplify, fuse a copy, and print every considered (producer, consumer) decision."""
    from hlo.render import to_dot
    from passes.fusion.explain import explain
    module = inputs_mod.load_module(args.file)
    options = {}
    if getattr(args, "backend", "") == "cuda":
        # Decide as the CUDA pipeline's fusion does: f32 dots are cuBLAS calls, GEMM
        # fusions the Triton template cannot tile are priced as split kernels.
        from passes.pipelines import CUDA_LIBRARY_DOTS
        options = {"library_dots": CUDA_LIBRARY_DOTS, "split_gemms": True}
    fused, report = explain(module, args.target, args.policy, **options)
    if args.dot:
        write_atomically(args.dot, to_dot(module, edge_styles=report.edge_styles(),
                                          title=f"fusion decisions ({report.policy}, {args.target})"))
    out.write(report.table(only_unfused=args.unfused_only).rstrip("\n") + "\n")
    if args.measured:
        from codegen.triton.autotune import records_path
        from passes.fusion.calibration import load_records
        from .calibrate import measured_table
        path = Path(args.records or records_path())
        records = load_records([path]) if path.exists() else []
        out.write(f"\nmeasured on the GPU ({path}, {len(records)} records):\n")
        out.write(measured_table(fused, report, args.target, records))
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace, out: TextIO) -> int:
    from .calibrate import calibrate
    output = args.output or f"{args.target}-calibrated.json"
    calibrate(args.target, args.records or [], output, run=not args.no_run,
              device=args.device, out=out)
    return EXIT_OK


def _open_in_browser(path: Path, args: argparse.Namespace, out: TextIO) -> None:
    """Print where the page is; open it when a person is at a terminal (not --no-open)."""
    out.write(f"viewer: {path}\n")
    if not getattr(args, "no_open", False) and sys.stdout.isatty():
        import webbrowser
        webbrowser.open(path.resolve().as_uri())


def cmd_view(args: argparse.Namespace, out: TextIO) -> int:
    """The interactive viewer of a module file or a ``--dump`` directory."""
    from .viewer import load_profile, viewer_for_module, viewer_from_dump, write_viewer
    profile = load_profile(args.profile) if args.profile else None
    src = Path(args.file)
    if src.is_dir():
        if args.passes:
            raise inputs_mod.InputFileError(f"{src}: --passes goes with a module file, not a dump")
        data = viewer_from_dump(src, profile=profile)
        target = Path(args.output) if args.output else src / "viewer.html"
    else:
        module = inputs_mod.load_module(args.file)
        target = Path(args.output) if args.output else src.with_name(src.name + ".view.html")
        if args.passes:
            import tempfile
            from .tools import compile_module
            with tempfile.TemporaryDirectory(prefix="hlotk-view-") as tmp:
                compile_module(module, args.passes, dump_dir=tmp, render_svg=False)
                data = viewer_from_dump(tmp, profile=profile)
            data.title = f"hlotk: {module.name} through {args.passes}"
        else:
            data = viewer_for_module(module, profile=profile, label=src.name)
    _open_in_browser(write_viewer(data, target), args, out)
    return EXIT_OK


def cmd_compare_xla(args: argparse.Namespace, out: TextIO) -> int:
    """XLA's kernels beside hlotk's for one program."""
    from . import compare_xla as cx
    xla_module = cx.read_xla_dump(args.xla_dump) if args.xla_dump else None
    target = args.target or ("h100" if xla_module is not None and cx.looks_like_gpu(xla_module)
                             else "cpu")
    module, fn, arg_specs = cx.hlotk_module_for(args.program, args.args or [], target)
    if xla_module is None:
        if fn is None:
            raise cx.CompareError("without --xla-dump the program must be FILE.py:FUNCTION "
                                  "(XLA compiles it here, on JAX's local backend)")
        xla_module = cx.xla_module_for(fn, arg_specs)
    comparison = cx.compare(xla_module, module, target)
    out.write(comparison.report())
    if args.html:
        from .viewer import write_viewer
        _open_in_browser(write_viewer(comparison.viewer(), args.html), args, out)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hlotk", description="Import, run and check HLO programs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    imp = sub.add_parser("import", help="print the HLO text of an Exported/.mlir/.hlo file")
    imp.add_argument("file", help="Exported.serialize() bytes, .mlir (text or bytecode), "
                                  ".hlo/.txt HLO text")
    imp.add_argument("-o", "--output", help="write the HLO text to this file instead")
    imp.set_defaults(func=cmd_import)

    run = sub.add_parser("run", help="run a program on the CPU and summarize its outputs")
    run.add_argument("file")
    run.add_argument("--inputs", nargs="+", metavar="NPY", help="one .npy file per parameter")
    run.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    run.add_argument("--save-outputs", metavar="DIR", help="write output_<i>.npy files here")
    run.set_defaults(func=cmd_run)

    comp = sub.add_parser("compile", help="run a pass pipeline; optionally dump every pass")
    comp.add_argument("file")
    comp.add_argument("--passes", default="default",
                      help="pipeline name (none, default, simplify) or spec such as "
                           "'inline,fixpoint(simplify,cse,dce)' (default: default)")
    comp.add_argument("--dump", metavar="DIR", help="write per-pass HLO, graphs and index.html")
    comp.add_argument("--verify", action="store_true", help="verify the module after every pass")
    comp.add_argument("--no-svg", action="store_true", help="write .dot files only")
    comp.add_argument("-o", "--output", help="write the final HLO text here instead of stdout")
    comp.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    comp.add_argument("--target", help="GPU spec fusion decides for (h100, h200, a100)")
    comp.set_defaults(func=cmd_compile)

    exf = sub.add_parser("explain-fusion", help="fuse a program and print every decision")
    exf.add_argument("file")
    exf.add_argument("--target", default="h100", help="device spec (h100, h200, a100)")
    exf.add_argument("--policy", default="priority",
                     help="priority, greedy, none or module:Class")
    exf.add_argument("--backend", default="", choices=["", "cuda"],
                     help="cuda: decide as the CUDA pipeline does (f32 dots as cuBLAS calls, "
                          "GEMM fusions the Triton template cannot tile priced as split)")
    exf.add_argument("--unfused-only", action="store_true", help="only pairs left apart")
    exf.add_argument("--dot", metavar="FILE",
                     help="write the unfused graph, edges coloured by decision, as DOT")
    exf.add_argument("--measured", action="store_true",
                     help="also measured µs per fusion from the calibration records")
    exf.add_argument("--records", help="calibration records (default: the cache's)")
    exf.set_defaults(func=cmd_explain_fusion)

    calp = sub.add_parser("calibrate", help="fit the cost model's device coefficients to "
                          "measured kernels; write a device file --target accepts")
    calp.add_argument("--target", default="h200", help="the device spec to start from")
    calp.add_argument("--records", nargs="*", help="record files (default: the cache's)")
    calp.add_argument("--no-run", action="store_true",
                      help="no microbenchmarks: fit the records only (no GPU needed)")
    calp.add_argument("--device", help="only records measured on this device name")
    calp.add_argument("-o", "--output", help="device file (default: TARGET-calibrated.json)")
    calp.set_defaults(func=cmd_calibrate)

    dif = sub.add_parser("diff", help="compare two HLO text files by instruction name")
    dif.add_argument("a")
    dif.add_argument("b")
    dif.add_argument("--html", metavar="FILE", help="also write a side-by-side HTML view")
    dif.set_defaults(func=cmd_diff)

    view = sub.add_parser("view", help="the interactive HTML viewer of a module or a dump")
    view.add_argument("file", help="a module (.hlo/.txt, .mlir, Exported bytes) or a "
                                   "directory written by `compile --dump`")
    view.add_argument("--passes", help="run this pipeline first and view every pass "
                                       "(module files only)")
    view.add_argument("--profile", metavar="JSON",
                      help="measured times: {instruction: µs} or [[thunk, ms], ...]")
    view.add_argument("-o", "--output", help="where to write the page (default: "
                                             "DIR/viewer.html or FILE.view.html)")
    view.add_argument("--no-open", action="store_true", help="do not open a browser")
    view.set_defaults(func=cmd_view)

    cmp = sub.add_parser("compare-xla", help="XLA's fusion decisions beside hlotk's")
    cmp.add_argument("program", help="FILE.py:FUNCTION (with --args), or a module file")
    cmp.add_argument("--args", nargs="+", metavar="SHAPE", help="argument shapes, e.g. f32[8,16]")
    cmp.add_argument("--xla-dump", metavar="DIR_OR_FILE",
                     help="XLA's optimized HLO: a --xla_dump_to directory or the text of "
                          "jax.jit(f).lower(...).compile().as_text() (default: compile here)")
    cmp.add_argument("--target", help="cpu, h100, h200 or a100 (default: h100 for an XLA:GPU "
                                      "dump, else cpu)")
    cmp.add_argument("--html", metavar="FILE", help="write both graphs side by side (viewer)")
    cmp.add_argument("--no-open", action="store_true", help="do not open a browser")
    cmp.set_defaults(func=cmd_compare_xla)

    chk = sub.add_parser("check", help="run StableHLO conformance files (check.* ops)")
    chk.add_argument("files", nargs="+", metavar="FILE")
    chk.set_defaults(func=cmd_check)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed usage; keep its code (2 for misuse)
        return int(e.code or 0)
    try:
        return args.func(args, sys.stdout)
    except HlotkError as e:
        print(f"hlotk: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("hlotk: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
