import numpy as np, jax, runtime
from passes.pipelines import SIMPLIFY
from tests.zoo import by_name, x64_scope
spec=f"inline,{SIMPLIFY},layout-assignment,fusion,schedule"
for n in ["softmax_f32","giou_boxes","gelu_exact_erf","transformer_block","mlp_train_step","scan_rnn","elementwise_math"]:
    p=by_name(n)
    with x64_scope(p):
        a=p.args()
        try:
            c=runtime.jit(p.fn,pipeline=spec,poison=True).lower(*a).compile()
            got=c(*a)
            want=jax.jit(p.fn)(*a)
            ok=all(np.allclose(np.asarray(g,np.float64),np.asarray(w,np.float64),rtol=1e-3,atol=1e-3) for g,w in zip(jax.tree_util.tree_leaves(got),jax.tree_util.tree_leaves(want)))
            print(n, c.memory_analysis().temp_size_in_bytes, jax.jit(p.fn).lower(*a).compile().memory_analysis().temp_size_in_bytes, ok, sum(1 for i in c.module.all_instructions() if i.opcode=="fusion"))
        except Exception as e:
            import traceback; traceback.print_exc(limit=4); print(n, "ERR", e)
