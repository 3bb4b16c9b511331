"""Cloud TPU accelerator types -> slice shape: chips, hosts (worker VMs) and chips per host.

The one table of TPU shapes. An accelerator type is `GENERATION-SIZE`; what SIZE counts (TensorCores or
chips) and which sizes exist differ per generation. Each row cites the Cloud TPU page it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Generation:
    name: str  # the accelerator type's prefix: v5litepod in v5litepod-16
    sizes: tuple[int, ...]  # the SIZEs the type may have
    cores_per_chip: int  # SIZE counts TensorCores (2 per chip) or chips (1)
    chips_per_host: int  # chips on each worker VM of a multi-host slice
    single_host_max: int  # the largest SIZE that is one VM (its chips may exceed chips_per_host)
    source: str


def _doubling(first: int, last: int) -> tuple[int, ...]:
    sizes, n = [], first
    while n <= last:
        sizes.append(n)
        n *= 2
    return tuple(sizes)


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        # v2-8 is one host with 4 chips (8 TensorCores); Pod slices of 32 to 512 cores, 4 chips per host.
        Generation("v2", (8, 32, 128, 256, 512), 2, 4, 8, "https://cloud.google.com/tpu/docs/v2"),
        # v3-8 is one host with 4 chips; Pod slices of 32 to 2048 cores, 4 chips per host.
        Generation("v3", (8, 32, 64, 128, 256, 512, 1024, 2048), 2, 4, 8, "https://cloud.google.com/tpu/docs/v3"),
        # v4-8 is one host with 4 chips (SIZE counts TensorCores, 2 per chip); 4 chips per host; up to v4-4096.
        Generation(
            "v4",
            (8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 4096),
            2,
            4,
            8,
            "https://cloud.google.com/tpu/docs/v4",
        ),
        # v5e: SIZE counts chips; v5litepod-1/4/8 are one host, 16 to 256 chips are slices of 4-chip hosts.
        Generation("v5litepod", (1, 4, 8, *_doubling(16, 256)), 1, 4, 8, "https://cloud.google.com/tpu/docs/v5e"),
        # v5p: SIZE counts TensorCores (2 per chip); v5p-8 (2x2x1) is one host; 4 chips per host; up to 16x16x24.
        Generation(
            "v5p",
            (*_doubling(8, 8192), 12288),
            2,
            4,
            8,
            "https://cloud.google.com/tpu/docs/v5p",
        ),
        # v6e (Trillium): SIZE counts chips; v6e-1/4/8 are one host, 16 to 256 chips are slices of 4-chip hosts.
        Generation("v6e", (1, 4, 8, *_doubling(16, 256)), 1, 4, 8, "https://cloud.google.com/tpu/docs/v6e"),
    )
}


@dataclass(frozen=True)
class Topology:
    accelerator_type: str
    chips: int
    hosts: int
    chips_per_host: int

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


class UnknownTpuType(ValueError):
    """str() is one line: what is wrong and which types exist."""


def allowed_types(generation: str | None = None) -> str:
    """`v5litepod-1, 4, 8, 16, ...` for one generation, or every generation's line joined by `; `."""
    gens = [GENERATIONS[generation]] if generation in GENERATIONS else list(GENERATIONS.values())
    return "; ".join(f"{g.name}-" + ", ".join(str(s) for s in g.sizes) for g in gens)


def tpu_topology(accelerator_type: str) -> Topology:
    """The slice shape of a Cloud TPU accelerator type; UnknownTpuType when the type does not exist."""
    name, _, size_text = accelerator_type.rpartition("-")
    gen = GENERATIONS.get(name)
    if gen is None:
        raise UnknownTpuType(f"{accelerator_type!r} is not a Cloud TPU generation; allowed: {allowed_types()}")
    if not size_text.isdigit() or int(size_text) not in gen.sizes:
        raise UnknownTpuType(f"{gen.name} has no size {size_text!r}; allowed: {allowed_types(gen.name)}")
    size = int(size_text)
    chips = max(1, size // gen.cores_per_chip)
    hosts = 1 if size <= gen.single_host_max else chips // gen.chips_per_host
    return Topology(accelerator_type, chips, hosts, chips if hosts == 1 else gen.chips_per_host)
