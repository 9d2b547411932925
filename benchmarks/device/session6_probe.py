"""Sixth session, last probe: the suite transformer's kernels (its device time rose from
0.385 to 0.420 ms between two calls: which kernel?) and the LSTM gradient's per-kernel
time per step (34 ms of device time for 256 loop iterations, XLA 7.5 ms in all)."""
import sys

import numpy as np

from benchmarks.gpu_suite import programs
from benchmarks.heldout_programs import lstm_grad, more_args
from benchmarks.kernel_profile import kernel_table

which = sys.argv[1]
if which == "transformer":
    p = [p for p in programs() if p[0] == "transformer"][0]
    fn, args = p[2], p[3]
else:
    fn, args = lstm_grad, more_args(np.random.default_rng(0), "lstm_grad")
r = kernel_table(fn, args, steps=3)
for tag in ("hlotk", "xla"):
    s = r[tag]
    print(f"== {which} {tag}: kernel sum {s['sum_us']:.1f} us, span {s['span_us']:.1f}, "
          f"launches {s['launches']:.0f}")
    for k in s["kernels"][:14]:
        print(f"  {k['us']:9.1f} us  {k['calls']:6.0f} calls  {k['mean_us']:7.2f} us each  "
              f"{k['name'][:70]}  {','.join(k['thunks'][:2])[:40]}")
