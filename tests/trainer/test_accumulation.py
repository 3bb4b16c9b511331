"""Gradient accumulation: the job's global batch on any device count, in micro-batches where a device would take
too many rows at once. The same batch and the same step as one pass, up to float rounding (not the same bits)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from trainer import data, model
from trainer import step as train
from trainer.config import SIZES, load_config


@pytest.mark.parametrize(
    ("per_device", "limit", "micro"),
    [(16, 0, 1), (16, 16, 1), (16, 8, 2), (16, 5, 4), (16, 1, 16), (12, 5, 3), (7, 3, 7)],
)
def test_micro_batches_are_the_fewest_that_fit_and_divide(per_device: int, limit: int, micro: int) -> None:
    assert train.micro_batches(per_device, limit) == micro
    assert per_device % micro == 0 and (limit == 0 or per_device // micro <= limit)


def test_an_accumulated_step_is_the_same_step_as_one_pass() -> None:
    """Without dropout (whose masks differ per micro-batch by design), 4 micro-batches of 4 rows give the update of
    one pass over the 16 rows, to float rounding; a different batch would not."""
    cfg = load_config(["--model=nano", "--batch-size=16", "--steps=10"])
    size = dataclasses.replace(SIZES["nano"], dropout=0.0)
    optimizer = train.make_optimizer(cfg)
    state = train.new_state(model.init_params(cfg.seed, size, cfg.seq_len), optimizer)
    tokens = data.batch(cfg.seed, 1, cfg.batch_size, cfg.seq_len)
    whole = jax.jit(train.make_train_step(cfg, size, optimizer))(state, tokens)
    parts = jax.jit(train.make_train_step(cfg, size, optimizer, micro=4))(state, tokens)
    assert np.allclose(whole["loss"], parts["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(whole["params"]), jax.tree.leaves(parts["params"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    shifted = data.batch(cfg.seed, 2, cfg.batch_size, cfg.seq_len)
    elsewhere = jax.jit(train.make_train_step(cfg, size, optimizer, micro=4))(state, shifted)
    assert not np.allclose(whole["loss"], elsewhere["loss"], rtol=1e-5)
