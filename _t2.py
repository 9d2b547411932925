import numpy as np, jax
import hlo
from passes import run_pipeline
from passes.pipelines import pipeline_spec
from passes.buffer_assignment import assign_buffers
import passes.scheduling
from runtime.executable import CpuExecutable
from tests.zoo import by_name, x64_scope, flatten_value
prog=by_name("rng_threefry_exact")
with x64_scope(prog):
    args=prog.args(); flat=[np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    m=hlo.from_jax(prog.fn,*args)
    exp=flatten_value(hlo.evaluate(m,flat))
    run_pipeline(m, pipeline_spec("default","cpu")+",schedule", verify=True)
    print(flatten_value(hlo.evaluate(m,flat))[0][:4], exp[0][:4])
    for share in (True, False):
        for poison in (False, True):
            exe=CpuExecutable(m, assign_buffers(m, share_in_place=share), poison)
            got=exe.run(flat)
            print(share, poison, [np.array_equal(g,e) for g,e in zip(got,exp)], got[0].ravel()[:4], np.asarray(exp[0]).ravel()[:4])
    print(m.to_text())
