"""Train state, AdamW, and the train step. The step's PRNG key is fold_in(seed, step): a pure function of both."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from trainer import model
from trainer.config import Config, ModelSize

State = dict[str, Any]  # {"params", "opt_state", "step": int32 (steps done), "loss": float32 (of the last step)}


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    warmup = max(1, min(100, cfg.steps // 10))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, warmup, max(cfg.steps, warmup + 1), end_value=cfg.learning_rate * 0.1
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1))


def new_state(params: Any, optimizer: optax.GradientTransformation) -> State:
    """The state before step 1 (zero optimizer moments); jit it: one small program instead of many eager ops."""
    return {"params": params, "opt_state": optimizer.init(params), "step": jnp.int32(0), "loss": jnp.float32(0.0)}


def state_shapes(cfg: Config, size: ModelSize, optimizer: optax.GradientTransformation) -> State:
    """Shapes and dtypes of the state, without computing it (the restore target)."""
    return jax.eval_shape(lambda p: new_state(p, optimizer), model.param_shapes(size, cfg.seq_len))  # type: ignore[no-any-return]


def micro_batches(per_device: int, max_device_batch: int) -> int:
    """How many micro-batches a step's batch is split into so that no device takes more than `max_device_batch`
    rows in one pass (0: no limit): the fewest that divide the per-device batch evenly."""
    if max_device_batch <= 0 or per_device <= max_device_batch:
        return 1
    return next(k for k in range(2, per_device + 1) if per_device % k == 0 and per_device // k <= max_device_batch)


def make_train_step(cfg: Config, size: ModelSize, optimizer: optax.GradientTransformation, micro: int = 1) -> Any:
    """(state, tokens [batch, seq + 1]) -> state after one more step. With `micro` > 1 the batch is split into that
    many micro-batches (rows i, i + micro, ...: each device's rows split alike, no data moves), whose gradients and
    losses are averaged: the same batch and the same step as one pass, not the same bits (docs/gpu-jobs.md)."""

    def gradients(params: Any, tokens: jax.Array, key: jax.Array) -> tuple[jax.Array, Any]:
        if micro == 1:
            return jax.value_and_grad(model.loss)(params, tokens, size, key)  # type: ignore[no-any-return]
        rows = tokens.reshape(tokens.shape[0] // micro, micro, tokens.shape[1]).swapaxes(0, 1)

        def add(total: tuple[jax.Array, Any], part: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
            i, chunk = part
            found = jax.value_and_grad(model.loss)(params, chunk, size, jax.random.fold_in(key, i))
            return jax.tree.map(jnp.add, total, found), None

        zero = (jnp.float32(0.0), jax.tree.map(jnp.zeros_like, params))
        total, _ = jax.lax.scan(add, zero, (jnp.arange(micro), rows))
        return jax.tree.map(lambda x: x / micro, total)  # type: ignore[no-any-return]

    def train_step(state: State, tokens: jax.Array) -> State:
        step = state["step"] + 1
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)
        loss, grads = gradients(state["params"], tokens, key)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": step, "loss": loss}

    return train_step
