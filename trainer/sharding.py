"""How the demo model is laid out over every device of every host: one `data` axis, FSDP-style state. In a world of
several slices (respawn_trainer.world) a leading `slice` axis too: the state is sharded within a slice and replicated
over slices (the JAX multislice layout: only the gradients' all-reduce crosses the slower network between slices, and
each slice holds the whole state, so a survivor's local copy of a save is all it needs), the batch over both."""

from __future__ import annotations

import math
from typing import Any


def mesh(slices: list[int] | None = None) -> Any:
    """One `data` axis over every device of every host (jax.devices() is in the same order on each process). With
    `slices` (the slice of each process index, a world's), a `slice` axis first: row j is the devices of the world's
    j-th member slice, in process then device order."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    if slices is None:
        return Mesh(np.array(jax.devices()), ("data",))
    order = list(dict.fromkeys(slices))  # the members, in the order of their first process
    rows = [[d for d in jax.devices() if slices[d.process_index] == member] for member in order]
    return Mesh(np.array(rows), ("slice", "data"))


def batch_spec(mesh: Any) -> Any:
    """The batch's rows over every device: member j of a world takes rows [j * B/K, (j+1) * B/K) of the global batch."""
    from jax.sharding import PartitionSpec as P

    return P("data") if mesh.axis_names == ("data",) else P(mesh.axis_names)


# Leaves smaller than this (32 KiB in float32) are replicated: splitting them saves little memory and costs
# collectives every step (all-gathers forward and backward), whose latency dominates a small leaf's step.
FSDP_MIN_ELEMENTS = 1 << 13


def fsdp_spec(shape: tuple[int, ...], devices: int) -> Any:
    """FSDP / ZeRO-3: a leaf of at least FSDP_MIN_ELEMENTS is split along its first axis whose size the device
    count divides; any other leaf is replicated."""
    from jax.sharding import PartitionSpec as P

    if math.prod(shape) < FSDP_MIN_ELEMENTS:
        return P()
    for axis, size in enumerate(shape):
        if devices > 1 and size % devices == 0:
            return P(*([None] * axis), "data")
    return P()


def state_shardings(shapes: Any, mesh: Any) -> Any:
    """A NamedSharding per leaf of a tree of shapes (parameters, optimizer moments, scalars)."""
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(lambda s: NamedSharding(mesh, fsdp_spec(tuple(s.shape), mesh.shape["data"])), shapes)


def global_array(host: Any, sharding: Any) -> Any:
    """Every process holds the same host value (cheap, seeded) and contributes the slices its devices hold."""
    import jax

    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


global_batch = global_array
