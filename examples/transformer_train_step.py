"""A transformer training step (forward, backward, SGD update) and its interactive view.

    .venv/bin/python examples/transformer_train_step.py [--layers N] [--out DIR]

Compiles the step with hlotk's default pipeline, dumping every pass to
``out/train_step.dump/`` (``index.html`` and the interactive ``viewer.html``), with
measured per-kernel times from a profiled CPU run, and checks the loss and the updated
parameters against ``jax.jit``. The tests and the README's screenshot use ``train_step``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HEADS = 4


def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def block(x, p):
    b, s, d = x.shape
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = jnp.split(h @ p["w_qkv"], 3, axis=-1)
    heads = lambda t: t.reshape(b, s, HEADS, d // HEADS).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // HEADS)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    ctx = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    x = x + ctx @ p["w_out"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + jax.nn.gelu(h @ p["w_up"]) @ p["w_down"]


def loss_fn(params, x, labels):
    for p in params["layers"]:
        x = block(x, p)
    logits = x @ params["head"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1))


def train_step(params, x, labels):
    """One SGD step: (loss, updated parameters)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
    return loss, jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, params, grads)


def make_args(layers: int = 1, batch: int = 2, seq: int = 8, width: int = 32, vocab: int = 16,
              seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / math.sqrt(s[0])).astype(np.float32)  # noqa: E731
    one, zero = np.ones(width, np.float32), np.zeros(width, np.float32)
    layer = lambda: {"ln1_g": one.copy(), "ln1_b": zero.copy(), "w_qkv": w(width, 3 * width),  # noqa: E731
                     "w_out": w(width, width), "ln2_g": one.copy(), "ln2_b": zero.copy(),
                     "w_up": w(width, 4 * width), "w_down": w(4 * width, width)}
    params = {"layers": [layer() for _ in range(layers)], "head": w(width, vocab)}
    x = rng.standard_normal((batch, seq, width)).astype(np.float32)
    labels = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    return params, x, labels


def main(argv: list[str] | None = None) -> int:
    import runtime
    from runtime.viewer import profile_by_name, viewer_from_dump, write_viewer
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "out" / "train_step.dump"))
    args = ap.parse_args(argv)
    call_args = make_args(args.layers)
    compiled = runtime.jit(train_step).lower(*call_args).compile(dump_dir=args.out)
    loss, new_params = compiled(*call_args)
    ref_loss, ref_params = jax.jit(train_step)(*call_args)
    err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
        jax.tree_util.tree_leaves((loss, new_params)), jax.tree_util.tree_leaves((ref_loss, ref_params))))
    flat = jax.tree_util.tree_leaves(call_args)
    profile = compiled.executable.profile(flat)
    write_viewer(viewer_from_dump(args.out, profile=profile_by_name(profile)),
                     Path(args.out) / "viewer.html")
    n = sum(len(c.instructions) for c in compiled.module.computations)
    print(f"train_step ({args.layers} layer{'s' * (args.layers != 1)}): {n} instructions after the "
          f"pipeline, loss {float(loss):.6f}, max abs error vs jax.jit {err:.3g}")
    print(f"wrote {Path(args.out) / 'viewer.html'} (and index.html)")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
