"""`train.py` (its model, imported) with its data from a Grain pipeline instead of a function of the step: the shape
most real loops have (a shuffled, batched, prefetching iterator over a dataset). respawn asks two lines more of it,
marked `# respawn`: the iterator is handed to `run.restore`, which saves its state in every checkpoint and sets it
back on a restart, and the loop draws from `run.data` (the same iterator, its waits counted as input time).
A preempted run resumes at the next example and ends with the parameters of an uninterrupted one.

    respawn local run examples/byo/job.yaml --entrypoint "python examples/byo/train_grain.py" --preempt-at-step 1000
"""

import argparse

import grain
import numpy as np
from train import BATCH, SEED, WIDTH, new_state, train_step  # the model of train.py

import respawn_trainer

EXAMPLES = 100_000


def dataset():
    """A regression dataset of EXAMPLES rows (a user's would be ArrayRecord shards: grain.sources), shuffled
    globally by SEED, reshuffled each epoch, batched."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(EXAMPLES, WIDTH)).astype(np.float32)
    y = np.sin(x @ np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32))[:, None]
    examples = grain.MapDataset.source(list(zip(x, y, strict=True)))
    return examples.shuffle(seed=SEED).repeat().batch(BATCH).to_iter_dataset()


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
