"""JAX process setup: XLA flags, the persistent compilation cache, multi-host init, the mesh, global batches."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trainer.config import Config

# Single-threaded Eigen on the CPU backend: the same reductions in the same order on every machine size.
CPU_DETERMINISM_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def wants_distributed(cfg: Config, env: Mapping[str, str]) -> bool:
    """On a multi-host TPU slice every worker runs the trainer; TPU_WORKER_HOSTNAMES lists them all."""
    if cfg.distributed != "auto":
        return cfg.distributed == "on"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1


def configure(cfg: Config, env: Mapping[str, str]) -> None:
    """Call before the first JAX computation."""
    if CPU_DETERMINISM_FLAGS not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_DETERMINISM_FLAGS}".strip()
    import jax

    if cfg.compile_cache:
        os.makedirs(cfg.compile_cache, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", cfg.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if wants_distributed(cfg, env):
        jax.distributed.initialize()


def is_primary() -> bool:
    import jax

    return bool(jax.process_index() == 0)


def mesh() -> Any:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ("data",))


def global_batch(host_batch: Any, sharding: Any) -> Any:
    """Every process computes the same global batch (cheap) and contributes the slices its devices hold."""
    import jax

    return jax.make_array_from_callback(host_batch.shape, sharding, lambda index: host_batch[index])


def agree_any(flag: bool) -> bool:
    """True on every process if it is true on any: all hosts must stop (and save) at the same step."""
    import jax

    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).max())


def agree_max(value: float) -> float:
    import jax

    if jax.process_count() == 1:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    return float(np.asarray(multihost_utils.process_allgather(np.float64(value))).max())
