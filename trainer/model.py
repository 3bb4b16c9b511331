"""A decoder-only transformer language model in plain JAX (pre-LayerNorm, learned positions, tied embeddings).

Layers are stacked on a leading axis and run with `lax.scan`, so compile time does not grow with depth.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trainer.config import ModelSize
from trainer.data import VOCAB

Params = dict[str, Any]


def _param_spec(size: ModelSize, seq_len: int) -> dict[str, Any]:
    """Every parameter as (shape, init): a float is the std of a normal init, "ones" or "zeros" a constant."""
    d, n = size.d_model, size.n_layers
    return {
        "embed": ((VOCAB, d), 0.02),
        "pos": ((seq_len, d), 0.01),
        "layers": {
            "ln1_scale": ((n, d), "ones"),
            "ln1_bias": ((n, d), "zeros"),
            "qkv": ((n, d, 3 * d), d**-0.5),
            "out": ((n, d, d), (d * 2 * n) ** -0.5),
            "ln2_scale": ((n, d), "ones"),
            "ln2_bias": ((n, d), "zeros"),
            "mlp_in": ((n, d, 4 * d), d**-0.5),
            "mlp_in_bias": ((n, 4 * d), "zeros"),
            "mlp_out": ((n, 4 * d, d), (4 * d * 2 * n) ** -0.5),
            "mlp_out_bias": ((n, d), "zeros"),
        },
        "ln_f_scale": ((d,), "ones"),
        "ln_f_bias": ((d,), "zeros"),
    }


def _is_spec(node: Any) -> bool:
    return isinstance(node, tuple) and len(node) == 2 and isinstance(node[0], tuple)


def param_shapes(size: ModelSize, seq_len: int) -> Params:
    shapes: Params = jax.tree.map(
        lambda spec: jax.ShapeDtypeStruct(spec[0], jnp.float32), _param_spec(size, seq_len), is_leaf=_is_spec
    )
    return shapes


def init_params(seed: int, size: ModelSize, seq_len: int) -> Params:
    """Host (numpy) parameters drawn in a fixed order from `seed`: no device program to compile at startup."""
    rng = np.random.default_rng(seed)

    def draw(spec: tuple[tuple[int, ...], float | str]) -> np.ndarray:
        shape, init = spec
        if init == "ones":
            return np.ones(shape, np.float32)
        if init == "zeros":
            return np.zeros(shape, np.float32)
        return (float(init) * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    params: Params = jax.tree.map(draw, _param_spec(size, seq_len), is_leaf=_is_spec)
    return params


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def forward(params: Params, tokens: jax.Array, size: ModelSize, key: jax.Array | None = None) -> jax.Array:
    """Logits [batch, seq, VOCAB] for tokens [batch, seq]; `key` enables dropout (training)."""
    b, t = tokens.shape
    h, d = size.n_heads, size.d_model
    x = params["embed"][tokens] + params["pos"][:t]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))

    def layer(x: jax.Array, scanned: tuple[Params, jax.Array]) -> tuple[jax.Array, None]:
        p, index = scanned
        keys = jax.random.split(jax.random.fold_in(key, index), 2) if key is not None else (None, None)
        y = _layer_norm(x, p["ln1_scale"], p["ln1_bias"])
        q, k, v = jnp.split((y @ p["qkv"]).reshape(b, t, 3 * h, d // h), 3, axis=2)
        scores = jnp.einsum("bqhc,bkhc->bhqk", q, k) * (d // h) ** -0.5
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = jnp.einsum("bhqk,bkhc->bqhc", weights, v).reshape(b, t, d)
        x = x + _dropout(attended @ p["out"], size.dropout, keys[0])
        y = _layer_norm(x, p["ln2_scale"], p["ln2_bias"])
        y = jax.nn.gelu(y @ p["mlp_in"] + p["mlp_in_bias"]) @ p["mlp_out"] + p["mlp_out_bias"]
        return x + _dropout(y, size.dropout, keys[1]), None

    x, _ = jax.lax.scan(layer, x, (params["layers"], jnp.arange(size.n_layers)))
    x = _layer_norm(x, params["ln_f_scale"], params["ln_f_bias"])
    embed: jax.Array = params["embed"]
    return x @ embed.T


def loss(params: Params, tokens: jax.Array, size: ModelSize, key: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy over tokens [batch, seq + 1]."""
    logits = forward(params, tokens[:, :-1], size, key)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()
