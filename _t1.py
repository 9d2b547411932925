import numpy as np, jax, jax.numpy as jnp
import hlo
from passes import run_pipeline
from passes.pipelines import pipeline_spec
import passes.scheduling, passes.dataflow
from passes.buffer_assignment import assign_buffers
from runtime.executable import CpuExecutable
from tests.zoo import ZOO, x64_scope, flatten_value
import sys
bad=[]
for prog in ZOO:
    try:
      with x64_scope(prog):
        args = prog.args()
        flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        m = hlo.from_jax(prog.fn, *args)
        exp = flatten_value(hlo.evaluate(m, flat))
        run_pipeline(m, pipeline_spec("default","cpu")+",schedule", verify=True)
        exe = CpuExecutable.build(m, poison=True)
        got = exe.run(flat)
        exp=[np.asarray(e) for e in exp]
        ok = len(got)==len(exp) and all(np.allclose(np.asarray(g,np.float64) if g.dtype.kind!='c' else g, np.asarray(e,np.float64) if e.dtype.kind!='c' else e, rtol=1e-5, atol=1e-5, equal_nan=True) for g,e in zip(got,exp))
        print(prog.name, "OK" if ok else "WRONG", exe.assignment.temp_size, exe.assignment.lower_bound)
        if not ok: bad.append(prog.name)
    except Exception as e:
        import traceback; traceback.print_exc(limit=3)
        print(prog.name, "ERR", type(e).__name__, e); bad.append(prog.name)
print(bad)
