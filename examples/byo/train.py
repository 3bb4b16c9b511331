"""A small JAX training script, written the way a user writes one: an MLP learns a generated regression task
with optax's Adam. This is `train_plain.py` plus the few lines that make it survive preemptions: it restores
the newest checkpoint, saves on the notice and on schedule, and tells respawn how it went (README: "Bring
your own trainer").

    respawn local run examples/byo/job.yaml --entrypoint "python examples/byo/train.py" --preempt-at-step 1000,2000
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import respawn_trainer

SEED, BATCH, WIDTH, HIDDEN = 0, 256, 32, 512


def batch(step):
    """Inputs and targets of one step: a function of the step alone, like a seeded data loader."""
    rng = np.random.default_rng([SEED, step])
    x = rng.normal(size=(BATCH, WIDTH)).astype(np.float32)
    return x, np.sin(x @ np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32))[:, None]


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (WIDTH, HIDDEN)) / np.sqrt(WIDTH),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros(1),
    }


def loss_fn(params, x, y):
    hidden = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


optimizer = optax.adam(1e-3)


@jax.jit
def train_step(state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss


def new_state():
    params = init_params(jax.random.PRNGKey(SEED))
    return {"params": params, "opt_state": optimizer.init(params)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    steps = parser.parse_args().steps
    run = respawn_trainer.Run(steps=steps)
    state, step = run.restore(new_state)
    while run.keep_going(step):
        state, loss = train_step(state, *batch(step))
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {float(loss):.5f}", flush=True)
        run.step_done(step, state, loss=loss)
    run.finish(step, state)


if __name__ == "__main__":
    main()
