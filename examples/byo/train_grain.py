"""`train.py` with its data from a Grain pipeline instead of a function of the step: the shape most real loops have
(a shuffled, batched, prefetching iterator over a dataset). respawn asks two lines more of it, marked `# respawn`:
the iterator is handed to `run.restore`, which saves its state in every checkpoint and sets it back on a restart,
and the loop draws from `run.data` (the same iterator, its waits counted as input time in the goodput split).
A preempted run resumes at the next example and ends with the parameters of an uninterrupted one.

    respawn local run examples/byo/job.yaml --entrypoint "python examples/byo/train_grain.py" --preempt-at-step 1000
"""

import argparse

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

import respawn_trainer

SEED, BATCH, WIDTH, HIDDEN, EXAMPLES = 0, 256, 32, 512, 100_000


def dataset():
    """A regression dataset of EXAMPLES rows (a user's would be ArrayRecord shards: grain.sources), shuffled
    globally by SEED, reshuffled each epoch, batched."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(EXAMPLES, WIDTH)).astype(np.float32)
    y = np.sin(x @ np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32))[:, None]
    examples = grain.MapDataset.source(list(zip(x, y, strict=True)))
    return examples.shuffle(seed=SEED).repeat().batch(BATCH).to_iter_dataset()


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
    data = iter(dataset())
    state, step = run.restore(new_state, data=data)  # respawn: the iterator's state is saved and restored too
    while run.keep_going(step):
        x, y = next(run.data)  # respawn: run.data is `data`, its waits timed
        state, loss = train_step(state, x, y)
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {float(loss):.5f}", flush=True)
        run.step_done(step, state, loss=loss)
    run.finish(step, state)


if __name__ == "__main__":
    main()
