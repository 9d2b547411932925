"""Which host path the held-out GPT training step takes on the GPU, and why (session 6:
its native graph build had said "node 120 (memset) reads or writes an argument or
result"): the executable's native reason, the capture-local words the diff kept, and the
step's results against jax.jit's."""
import functools
import sys

import numpy as np

import jax
import runtime
from benchmarks.heldout_programs import gpt_args, gpt_train_step
from runtime.cuda import executable_of

size = sys.argv[1] if len(sys.argv) > 1 else "small"
b, s, d, layers, v, h = (4, 1024, 768, 2, 32000, 12) if size == "big" else \
    (2, 256, 256, 2, 4096, 4)
args = gpt_args(np.random.default_rng(0), b, s, d, layers, v)
f = functools.partial(gpt_train_step, heads=h)
jf = runtime.jit(f, backend="cuda")
got = jf(*args)
got = jf(*args)
exe = executable_of(jf.lower(*args).compile())
native = getattr(exe, "native", None)
print(f"{size}: native_reason={exe.native_reason[:400]!r}")
if native is not None:
    print("kept words:", getattr(native, "kept_words", [])[:12])
want = jax.jit(f)(*args)
print("loss", float(np.asarray(got[0])), float(want[0]))
worst = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
            for g, w in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])))
print("max |m - m_jax|", worst)
