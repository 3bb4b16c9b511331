"""The JAX engine: state, compiled train step and checkpoints, behind the small interface the loop drives.

The state (parameters and optimizer moments) is sharded FSDP-style over every device of every host
(`runtime.fsdp_spec`); the batch is sharded on the same `data` axis. The step is compiled ahead of time
(part of startup), so the first training step runs at full speed. On CPU the state is not donated: an
async save may still be reading the previous step's host view.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import data, model, runtime
from trainer import step as train
from trainer.checkpoint import Checkpoints
from trainer.config import Config, ConfigError
from trainer.schedule import SaveDone

RESTORE_FAILED_WAIT_S = 60.0  # how long a host that could not read a step waits for the others to agree


class JaxEngine:
    def __init__(self, cfg: Config) -> None:
        size = cfg.size
        assert size is not None
        self.cfg = cfg
        mesh = runtime.mesh()
        if cfg.batch_size % mesh.size:
            raise ConfigError(
                "--batch-size", f"{cfg.batch_size} does not split over {mesh.size} devices", "a multiple of it"
            )
        self.sharded = NamedSharding(mesh, P("data"))
        optimizer = train.make_optimizer(cfg)
        shapes = train.state_shapes(cfg, size, optimizer)
        self.shardings = runtime.state_shardings(shapes, mesh)
        param_shardings = self.shardings["params"]
        init = jax.jit(
            lambda params: train.new_state(params, optimizer),
            in_shardings=(param_shardings,),
            out_shardings=self.shardings,
        )

        def fresh() -> Any:
            host = model.init_params(cfg.seed, size, cfg.seq_len)  # the same numbers on every process
            return init(jax.tree.map(runtime.global_array, host, param_shardings))

        self._fresh = fresh
        self.abstract = jax.tree.map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes, self.shardings
        )
        tokens = jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len + 1), jnp.int32, sharding=self.sharded)
        donate = (0,) if jax.default_backend() != "cpu" else ()
        step_fn = jax.jit(
            train.make_train_step(cfg, size, optimizer),
            in_shardings=(self.shardings, self.sharded),
            out_shardings=self.shardings,
            donate_argnums=donate,
        )
        self._step = step_fn.lower(self.abstract, tokens).compile()
        runtime.barrier("compiled")  # every host has its step program before the first collective
        self.checkpoints = Checkpoints(cfg.checkpoint_uri, cfg.keep, cfg.save_delay_s)
        self.state: Any = None

    def restore(self) -> int:
        restored = self.checkpoints.restore_newest(self.abstract, self._agree_after_restore)
        if restored is None:
            self.state = self._fresh()
            return 0
        self.state, step = restored
        if int(self.state["step"]) != step:
            raise RuntimeError(f"checkpoint step {step} holds state of step {int(self.state['step'])}")
        return step

    @staticmethod
    def _agree_after_restore(failed: bool) -> bool:
        """Did any host fail to read the step? A host that read it passed Orbax's barrier after the read, so
        every host did. A host that failed meets the others here if they failed too (an unreadable step);
        if they are waiting in Orbax's barrier instead, its wait times out and the slice fails, rather than
        hang (a step only some hosts can read: a lost shard, or a transient read error)."""
        runtime.barrier("restored", RESTORE_FAILED_WAIT_S if failed else runtime.BARRIER_TIMEOUT_S)
        return runtime.agree_any(failed)

    def run_step(self, step: int) -> None:
        host = data.batch(self.cfg.seed, step, self.cfg.batch_size, self.cfg.seq_len)
        self.state = self._step(self.state, runtime.global_batch(host, self.sharded))

    def loss(self) -> float:
        """The last step's loss (waits for it)."""
        return float(self.state["loss"])

    def save(self, step: int) -> float:
        return self.checkpoints.save(step, self.state)

    def poll(self) -> list[SaveDone]:
        return self.checkpoints.poll()

    def wait(self) -> list[SaveDone]:
        return self.checkpoints.wait()

    def agree(self, flag: bool) -> bool:
        return runtime.agree_any(flag)

    def agree_max(self, value: float) -> float:
        return runtime.agree_max(value)

    def fingerprint(self) -> str:
        runtime.barrier("fingerprint")  # after the final save, which ends at different times on each host
        return train.params_sha256(self.state["params"])

    def close(self) -> None:
        self.checkpoints.close()
        runtime.shutdown()
