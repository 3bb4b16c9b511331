"""JAX process setup: XLA flags, the persistent compilation cache, multi-host init, the mesh, shardings, batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from trainer.config import COORDINATOR_PORT, Config

log = logging.getLogger("trainer")

# Single-threaded Eigen on the CPU backend: the same reductions in the same order on every machine size.
CPU_DETERMINISM_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def wants_distributed(cfg: Config, env: Mapping[str, str]) -> bool:
    """On a multi-host TPU slice every worker runs the trainer; TPU_WORKER_HOSTNAMES lists them all."""
    if cfg.distributed != "auto":
        return cfg.distributed == "on"
    return len(cfg.worker_hostnames) > 1


def initialize_args(cfg: Config) -> dict[str, Any]:
    """The arguments of jax.distributed.initialize(): explicit from TPU_WORKER_ID / TPU_WORKER_HOSTNAMES when
    both are set (JAX_COORDINATOR_ADDRESS, else the first host on port 8482), else JAX's own auto-detection."""
    args: dict[str, Any] = {"heartbeat_timeout_seconds": cfg.heartbeat_timeout_s}
    if cfg.worker_id is not None and cfg.worker_hostnames:
        hosts = cfg.worker_hostnames
        args["coordinator_address"] = cfg.coordinator_address or f"{hosts[0]}:{COORDINATOR_PORT}"
        args["num_processes"] = len(hosts)
        args["process_id"] = cfg.worker_id
    return args


def on_cpu(env: Mapping[str, str]) -> bool:
    """JAX_PLATFORMS names cpu first (a local slice; slice_env sets it)."""
    return env.get("JAX_PLATFORMS", "").split(",")[0].strip().lower() == "cpu"


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
        args = initialize_args(cfg)
        if on_cpu(env) and args.get("num_processes", 2) > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # collectives across CPU processes
        # JAX's preemption service installs its own SIGTERM handler, which would swallow the notice:
        # the trainer watches SIGTERM itself and agrees on it across processes (agree_any).
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(**args)
        log.info(
            "process %d of %d (%d local devices of %d), heartbeat timeout %ds",
            jax.process_index(),
            jax.process_count(),
            jax.local_device_count(),
            jax.device_count(),
            cfg.heartbeat_timeout_s,
        )


BARRIER_TIMEOUT_S = 1800.0
_barriers = 0


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process gets here, through JAX's coordination service (no device collective).

    Gloo gives up on a collective whose peers do not all reach it within 30 s, so the processes meet here
    before the first one after work whose length differs between hosts (compiling: only process 0 finds its
    programs in the persistent cache; restoring). A peer that dies meanwhile ends the wait by the heartbeat.
    """
    import jax

    global _barriers
    if jax.process_count() == 1:
        return
    from jax._src import distributed

    client = distributed.global_state.client
    assert client is not None
    _barriers += 1
    client.wait_at_barrier(f"respawn-{_barriers}-{name}", int(timeout_s * 1000))


def shutdown() -> None:
    """Leave the distributed runtime together: process 0 hosts the coordinator, so it must not go first."""
    import jax

    if jax.process_count() > 1:
        jax.distributed.shutdown()


def is_primary() -> bool:
    import jax

    return bool(jax.process_index() == 0)


def mesh() -> Any:
    """One `data` axis over every device of every host (jax.devices() is in the same order on each process)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), ("data",))


def fsdp_spec(shape: tuple[int, ...], devices: int) -> Any:
    """FSDP / ZeRO-3: a leaf is split along its first axis whose size the device count divides; else replicated."""
    from jax.sharding import PartitionSpec as P

    for axis, size in enumerate(shape):
        if devices > 1 and size % devices == 0:
            return P(*([None] * axis), "data")
    return P()


def state_shardings(shapes: Any, mesh: Any) -> Any:
    """A NamedSharding per leaf of a tree of shapes (parameters, optimizer moments, scalars)."""
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(lambda s: NamedSharding(mesh, fsdp_spec(tuple(s.shape), mesh.size)), shapes)


def global_array(host: Any, sharding: Any) -> Any:
    """Every process holds the same host value (cheap, seeded) and contributes the slices its devices hold."""
    import jax

    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


global_batch = global_array


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
