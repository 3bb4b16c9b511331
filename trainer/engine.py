"""The demo language model under JAX: its state template, the fresh state, and the compiled train step.

The state (parameters and optimizer moments) is sharded FSDP-style over every device of every host
(`sharding.fsdp_spec`); the batch is sharded on the same `data` axis. The step is compiled ahead of time
(part of startup, through the compilation cache), so the first training step runs at full speed. On CPU
the state is not donated: an async save may still be reading the previous step's host view.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

import respawn_trainer
from trainer import data, model, sharding
from trainer import step as train
from trainer.config import Config, ConfigError

log = logging.getLogger("trainer")


class LanguageModel:
    def __init__(self, cfg: Config, slices: list[int] | None = None) -> None:
        """slices: in a world of several slices, the slice of each process (a mesh with a `slice` axis)."""
        size = cfg.size
        assert size is not None
        self.cfg, self.size = cfg, size
        mesh = sharding.mesh(slices)
        if cfg.batch_size % mesh.size:
            raise ConfigError(
                "--batch-size", f"{cfg.batch_size} does not split over {mesh.size} devices", "a multiple of it"
            )
        # The global batch is the job's whatever the devices: each takes batch / devices rows, in micro-batches of at
        # most --max-device-batch (gradient accumulation), so an attempt on other hardware continues the same run
        per_device = cfg.batch_size // mesh.size
        self.micro = train.micro_batches(per_device, cfg.max_device_batch)
        log.info(
            "global batch %d: %d rows on each of %d devices, in %d micro-batch(es)",
            cfg.batch_size,
            per_device,
            mesh.size,
            self.micro,
        )
        self.sharded = NamedSharding(mesh, sharding.batch_spec(mesh))
        optimizer = train.make_optimizer(cfg)
        shapes = train.state_shapes(cfg, size, optimizer)
        shardings = sharding.state_shardings(shapes, mesh)
        self.param_shardings = shardings["params"]
        self.abstract = jax.tree.map(
            lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where), shapes, shardings
        )
        self._init = jax.jit(
            lambda params: train.new_state(params, optimizer),
            in_shardings=(self.param_shardings,),
            out_shardings=shardings,
        )  # compiled only when there is no checkpoint to restore
        tokens = jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len + 1), jnp.int32, sharding=self.sharded)
        donate = (0,) if jax.default_backend() != "cpu" else ()
        step_fn = jax.jit(
            train.make_train_step(cfg, size, optimizer, self.micro),
            in_shardings=(shardings, self.sharded),
            out_shardings=shardings,
            donate_argnums=donate,
        )
        # Loads in the background while the checkpoint is read; run.restore() waits for it on every host.
        self._step = respawn_trainer.compiled(step_fn, self.abstract, tokens, key=program_key(cfg))

    def fresh(self) -> Any:
        """The state before step 1: the same numbers on every process, each holding its devices' shards."""
        host = model.init_params(self.cfg.seed, self.size, self.cfg.seq_len)
        return self._init(jax.tree.map(sharding.global_array, host, self.param_shardings))

    def step(self, state: Any, step: int, local: Any = None) -> Any:
        """Train step `step` (1-based) on its batch: of the generated corpus, a pure function of (seed, step), or
        `local`, this process's rows of the global batch (tokens [batch / processes, seq_len + 1]) from --data."""
        if local is None:
            host = data.batch(self.cfg.seed, step, self.cfg.batch_size, self.cfg.seq_len)
            return self._step(state, sharding.global_batch(host, self.sharded))
        shape = (self.cfg.batch_size, self.cfg.seq_len + 1)
        return self._step(state, jax.make_array_from_process_local_data(self.sharded, local, shape))


def program_key(cfg: Config) -> str:
    """What the train step's program is a function of: the code that builds it, the flags it closes over, optax.
    respawn_trainer.compiled() finds a restart's program by it without tracing the step again."""
    digest = hashlib.sha256(optax.__version__.encode())
    for name in ("engine.py", "model.py", "step.py", "sharding.py"):
        digest.update(Path(__file__).with_name(name).read_bytes())
    # not --data: the same program
    flags = (cfg.model, cfg.seed, cfg.batch_size, cfg.seq_len, cfg.learning_rate, cfg.steps, cfg.max_device_batch)
    return f"train_step:{flags}:{digest.hexdigest()}"
