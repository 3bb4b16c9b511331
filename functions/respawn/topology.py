"""Cloud TPU accelerator types -> slice shape: chips, hosts (worker VMs) and chips per host; and, for the
generations Compute Engine offers, the machine type, VM count and topology a slice is made of there.

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
        # TPU7x (Ironwood): SIZE counts TensorCores (2 per chip, as the page says), as for v5p: tpu7x-8 (2x2x1) is
        # one 4-chip VM, tpu7x-128 is 4x4x4 (xpk names its TPU7x types so); sizes as v5p's, and 16x16x32.
        Generation("tpu7x", (*_doubling(8, 8192), 12288, 16384), 2, 4, 8, "https://cloud.google.com/tpu/docs/tpu7x"),
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


# ---------------------------------------------------------------------------- Compute Engine

# The generations the Cloud TPU API offers: every one but TPU7x ("The Cloud TPU API is not supported on TPU7x and
# later TPU versions", the Cloud TPU API pages' notice, e.g. https://cloud.google.com/tpu/docs/consume-reservation).
TPU_API_GENERATIONS = frozenset(GENERATIONS) - {"tpu7x"}


@dataclass(frozen=True)
class ComputeShape:
    """A TPU slice as Compute Engine makes it: one instance, or a MIG of `vms` instances under a workload policy."""

    machine_type: str  # ct6e-standard-4t, ct5p-hightpu-4t, tpu7x-standard-4t, ct6e-standard-8t ...
    vms: int  # 1: one instance (no MIG); >1: a MIG slice of `vms` VMs of machine_type
    topology: str  # the workload policy's acceleratorTopology: "4x4" (v6e AxB), "2x2x2" (v5p/TPU7x AxBxC)
    image: str  # the generation's default boot image family

    @property
    def multi_host(self) -> bool:
        return self.vms > 1


@dataclass(frozen=True)
class ComputeGeneration:
    """One generation's Compute Engine side: the machine type of each size, a slice's topology, its boot image.

    Every size of the generation (GENERATIONS) has a row: a size whose chips fit one VM is one instance of the
    single-host machine type; a larger one is a MIG of `slice_vm` VMs, one per host of tpu_topology."""

    name: str
    topologies: dict[int, str]  # SIZE -> the slice's topology (the workload policy's acceleratorTopology)
    single_host: dict[int, str]  # SIZE -> the machine type of a one-instance slice
    slice_vm: str  # the machine type of every VM of a multi-host slice
    image: str  # the default boot image family
    source: str


# The default boot images. The project is Google's ("IMAGE_PROJECT: ... For TPU images, this is
# ubuntu-os-accelerator-images", https://cloud.google.com/tpu/docs/consume-reservation-compute); the family names
# (ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e, ubuntu-accel-2404-amd64-tpu-tpu7x) are the issue's and users' reports
# of instances booted from them: no Google page read for this table lists them, so a job may name its own image.
TPU_IMAGES = "projects/ubuntu-os-accelerator-images/global/images/family/"

# The v5p and TPU7x 3D topologies by TensorCores: the v5p page's table (2x2x1 .. 16x16x24) and 2x2x4 (v5p-32),
# which the page leaves out of its "most common" shapes but GKE's TPU planning page and Google's xpk
# (AI-Hypercomputer/xpk, system_characteristics.py) list for both generations.
_CUBES = {
    8: "2x2x1",
    16: "2x2x2",
    32: "2x2x4",
    64: "2x4x4",
    128: "4x4x4",
    256: "4x4x8",
    512: "4x8x8",
    1024: "8x8x8",
    2048: "8x8x16",
    4096: "8x16x16",
    8192: "16x16x16",
    12288: "16x16x24",
    16384: "16x16x32",
}

COMPUTE: dict[str, ComputeGeneration] = {
    g.name: g
    for g in (
        # v5p: one machine type, ct5p-hightpu-4t (4 chips); v5p-8 is one VM, larger slices a VM per 4 chips.
        ComputeGeneration(
            "v5p",
            {size: _CUBES[size] for size in GENERATIONS["v5p"].sizes},
            {8: "ct5p-hightpu-4t"},
            "ct5p-hightpu-4t",
            TPU_IMAGES + "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
            "https://cloud.google.com/tpu/docs/v5p",
        ),
        # v6e: 1x1, 2x2 and 2x4 are one VM (ct6e-standard-1t/4t/8t); 4x4 to 16x16 are VMs of ct6e-standard-4t
        # (the page's 2x4 on two 4-chip VMs is "only supported when using the GKE API").
        ComputeGeneration(
            "v6e",
            {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
            {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
            "ct6e-standard-4t",
            TPU_IMAGES + "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
            "https://cloud.google.com/tpu/docs/v6e",
        ),
        # TPU7x: tpu7x-standard-4t (4 chips) VMs; tpu7x-8 (2x2x1) is one VM, larger slices a VM per 4 chips
        # (https://cloud.google.com/compute/docs/tpus/tpu-machines). The topologies are those of v5p (_CUBES);
        # the TPU7x page's configuration table could not be read here, so they follow xpk's TPU7x list.
        ComputeGeneration(
            "tpu7x",
            {size: _CUBES[size] for size in GENERATIONS["tpu7x"].sizes},
            {8: "tpu7x-standard-4t"},
            "tpu7x-standard-4t",
            TPU_IMAGES + "ubuntu-accel-2404-amd64-tpu-tpu7x",
            "https://cloud.google.com/tpu/docs/tpu7x",
        ),
    )
}

# The generations Compute Engine offers as TPU machine types ("Compute Engine supports the following TPU versions:
# TPU7x, TPU v6e, TPU v5p", https://cloud.google.com/compute/docs/tpus/tpu-machines).
COMPUTE_GENERATIONS = frozenset(COMPUTE)
COMPUTE_OFFERS = ", ".join(COMPUTE)  # "v5p, v6e, tpu7x", as errors list them


def compute_shape(accelerator_type: str) -> ComputeShape:
    """How Compute Engine makes a slice of this accelerator type; UnknownTpuType when it does not."""
    topology = tpu_topology(accelerator_type)  # an unknown type fails here, with the Cloud TPU sizes
    name, _, size_text = accelerator_type.rpartition("-")
    gen = COMPUTE.get(name)
    if gen is None:
        raise UnknownTpuType(f"Compute Engine does not offer {name}; allowed: {COMPUTE_OFFERS}")
    size = int(size_text)
    if topology.hosts == 1:
        return ComputeShape(gen.single_host[size], 1, gen.topologies[size], gen.image)
    return ComputeShape(gen.slice_vm, topology.hosts, gen.topologies[size], gen.image)
