"""Today's GPU machines: one record per Compute Engine GPU series, every table of GPU facts derived from it.

A series (`GpuSeries`) is its machine types with their GPUs per VM, the accelerator type as the Compute Engine API
names it (a VM's guestAccelerators[].acceleratorType), the boot disk type its VMs boot from, which of its MIGs take a
workload policy, and the dated price of one of its GPUs. From Google's pages "GPU machine types"
(https://cloud.google.com/compute/docs/gpus) and "Accelerator-optimized machine family"
(https://cloud.google.com/compute/docs/accelerator-optimized-machines: each series' machine types and its "Supported
disk types": A4X, A4 and A3 Ultra boot from Hyperdisk only; G2, A2, A3 High and A3 Mega from Persistent Disk). What
is derived: the shapes respawn lists (GPU_SHAPES; docs/gpus.md prints them, and a test holds it to them), the price
per GPU (respawn.prices.GPU_PRICES), the boot disk and the workload policy of a machine type
(respawn.adapters.compute). A machine type belongs to a series by its family: a listed type without its last part
(`a3-ultragpu-8g-nolssd` is A3 Ultra's).

Machine types of no series (an N1 VM with T4s or V100s attached, a newer shape) still run: the job names its machine
type, accelerator type and count; the boot disk is Balanced Persistent Disk and a MIG of them has no workload policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PD_BALANCED = "pd-balanced"
HYPERDISK_BALANCED = "hyperdisk-balanced"
# The dates prices were read. PAGES_AS_OF: the public pricing pages (https://cloud.google.com/compute/gpus-pricing and
# https://cloud.google.com/spot-vms/pricing). GPU_SKUS_AS_OF: the GPU rows of
# https://github.com/skypilot-org/skypilot-catalog/blob/006059e0f18acb1341e22a27751e9f80df6ba92f/catalogs/v8/gcp/vms.csv
# (Compute Engine's per-GPU SKU prices as SkyPilot's catalog collects them from the Cloud Billing Catalog API; an
# 8-GPU row divided by 8); where that catalog's us-central1 figures contradict themselves (an on-demand price below
# the Spot one), the series keeps its PAGES_AS_OF price.
PAGES_AS_OF = "2025-06"
GPU_SKUS_AS_OF = "2026-11-27"


@dataclass(frozen=True)
class GpuPrice:
    """The us-central1 list price of one GPU-hour, the GPU alone (the host machine type is billed on top)."""

    on_demand: float  # USD per GPU-hour
    spot: float  # USD per GPU-hour
    as_of: str  # when it was read (PAGES_AS_OF or GPU_SKUS_AS_OF)


@dataclass(frozen=True)
class WorkloadPolicy:
    """Which MIGs of a series' VMs are made under a workload policy (HIGH_THROUGHPUT: the VMs placed close together),
    from the comparison of compact placement policies and workload policies
    (https://cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy): "for Spot or reservations:
    A4X, A4, A3 Ultra, A3 Mega, A3 High (8 GPUs)", "for Flex-start: A4 and A3 Ultra"."""

    flex_start: bool  # a flex-start MIG too; False: every provisioning model but flex-start
    min_gpus: int = 1  # only a MIG of VMs with at least this many GPUs each (A3 High: 8)


@dataclass(frozen=True)
class GpuShape:
    """One machine type of a series, with its GPUs attached: a row of the table respawn lists."""

    series: str  # the machine series as Google's pages name it, e.g. "A3 Ultra"
    gpu: str  # the GPU, e.g. "H200 141GB"
    machine_type: str
    accelerator_type: str  # as the Compute Engine API names it
    gpus: int  # per VM
    boot_disk: str  # the boot disk type (PD_BALANCED or HYPERDISK_BALANCED)


@dataclass(frozen=True)
class GpuSeries:
    """One GPU machine series and every fact respawn keeps of it. `workload_policy` has no default: a new series
    says whether a MIG of its VMs is placed under one (None: never)."""

    name: str  # as Google's pages name it, e.g. "A3 Ultra"
    gpu: str  # e.g. "H200 141GB"
    accelerator_type: str  # as the Compute Engine API names it
    machine_types: Mapping[str, int]  # machine type -> GPUs per VM
    boot_disk: str  # PD_BALANCED or HYPERDISK_BALANCED
    workload_policy: WorkloadPolicy | None
    price: GpuPrice | None  # None: not priced, and then not listed (GPU_SHAPES)
    # Its VMs reach each other's GPUs over MRDMA NICs (GPUDirect RDMA: compute/docs/gpus/gpu-network-bandwidth): eight
    # MRDMA NICs on a zonal VPC network with the RDMA network profile, two gVNICs on two regular networks
    # (vpc/docs/rdma-network-profiles) and NCCL's RDMA plugin in the image. respawn gives a VM one gVNIC on the
    # deployment's network, so the spec allows one VM of such a series, never several.
    rdma: bool = False
    # Arm hosts (NVIDIA Grace CPUs): respawn's images and machine scripts are x86-64, so the spec refuses the series.
    arm64: bool = False

    @property
    def families(self) -> frozenset[str]:
        """The prefixes of its machine types' names, `a3-ultragpu-`: a machine type of the family is the series'."""
        return frozenset(t.rpartition("-")[0] + "-" for t in self.machine_types)

    @property
    def shapes(self) -> tuple[GpuShape, ...]:
        return tuple(
            GpuShape(self.name, self.gpu, t, self.accelerator_type, n, self.boot_disk)
            for t, n in self.machine_types.items()
        )

    def takes_workload_policy(self, gpus: int, *, flex: bool) -> bool:
        """Whether a MIG of this series' VMs of `gpus` GPUs each is made under a workload policy (`flex`: a
        flex-start MIG)."""
        policy = self.workload_policy
        return policy is not None and (policy.flex_start or not flex) and gpus >= policy.min_gpus


GPU_SERIES: tuple[GpuSeries, ...] = (
    # 2025-06's price, which the catalog repeats (0.56004 / 0.2231 per GPU in us-central1)
    GpuSeries("G2", "L4", "nvidia-l4", {
        "g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-24": 2,
        "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8,
    }, PD_BALANCED, None, GpuPrice(0.56, 0.22, PAGES_AS_OF)),
    # The catalog: 23.47126 / 11.4728 for 8 GPUs in us-central1
    GpuSeries("A2 Standard", "A100 40GB", "nvidia-tesla-a100", {
        "a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8, "a2-megagpu-16g": 16,
    }, PD_BALANCED, None, GpuPrice(2.93, 1.43, GPU_SKUS_AS_OF)),
    # The catalog's us-central1 row (1.8462 on-demand, 1.964 Spot per GPU) contradicts itself: 2025-06's
    GpuSeries("A2 Ultra", "A100 80GB", "nvidia-a100-80gb", {
        "a2-ultragpu-1g": 1, "a2-ultragpu-2g": 2, "a2-ultragpu-4g": 4, "a2-ultragpu-8g": 8,
    }, PD_BALANCED, None, GpuPrice(3.67, 1.57, PAGES_AS_OF)),
    # a3-highgpu-1g, -2g and -4g are offered as Spot and flex-start VMs only. The catalog's us-central1 on-demand
    # (4.20076 per GPU) is under half of every other region's: 2025-06's
    GpuSeries("A3 High", "H100 80GB", "nvidia-h100-80gb", {
        "a3-highgpu-1g": 1, "a3-highgpu-2g": 2, "a3-highgpu-4g": 4, "a3-highgpu-8g": 8,
    }, PD_BALANCED, WorkloadPolicy(flex_start=False, min_gpus=8), GpuPrice(11.06, 2.25, PAGES_AS_OF)),
    # The catalog: 82.75421 / 25.2808 for 8 GPUs in us-central1
    GpuSeries("A3 Mega", "H100 80GB Mega", "nvidia-h100-mega-80gb", {"a3-megagpu-8g": 8},
              PD_BALANCED, WorkloadPolicy(flex_start=False), GpuPrice(10.34, 3.16, GPU_SKUS_AS_OF)),
    # The catalog: 74.49392 / 37.2472 for 8 GPUs in us-central1-b
    GpuSeries("A3 Ultra", "H200 141GB", "nvidia-h200-141gb", {"a3-ultragpu-8g": 8},
              HYPERDISK_BALANCED, WorkloadPolicy(flex_start=True), GpuPrice(9.31, 4.66, GPU_SKUS_AS_OF), rdma=True),
    # The catalog: 90.216 / 32.6064 for 8 GPUs in us-central1-b
    GpuSeries("A4", "B200 180GB", "nvidia-b200", {"a4-highgpu-8g": 8},
              HYPERDISK_BALANCED, WorkloadPolicy(flex_start=True), GpuPrice(11.28, 4.08, GPU_SKUS_AS_OF), rdma=True),
    # Arm hosts (NVIDIA Grace CPUs): not priced, so not listed. Its MIGs are reservation-bound only
    # (ai-hypercomputer/docs/create/create-mig-with-a4x).
    GpuSeries("A4X", "GB200", "nvidia-gb200", {"a4x-highgpu-4g": 4},
              HYPERDISK_BALANCED, WorkloadPolicy(flex_start=False), None, arm64=True),
    GpuSeries("A4X Max", "GB300", "nvidia-gb300", {"a4x-maxgpu-4g-metal": 4},
              HYPERDISK_BALANCED, WorkloadPolicy(flex_start=False), None, arm64=True),
)  # fmt: skip

# The shapes respawn lists, with their prices: every priced series' machine types.
GPU_SHAPES: tuple[GpuShape, ...] = tuple(shape for s in GPU_SERIES if s.price is not None for shape in s.shapes)

# The series whose VMs respawn runs several of in one job (machine.vms > 1), as an error message lists them.
MULTI_VM_SERIES = ", ".join(s.name for s in GPU_SERIES if s.price is not None and not (s.rdma or s.arm64))

BY_MACHINE_TYPE: dict[str, GpuShape] = {shape.machine_type: shape for shape in GPU_SHAPES}


def gpu_shape(machine_type: str) -> GpuShape | None:
    """The listed row of `machine_type`, or None for a machine type it does not list."""
    return BY_MACHINE_TYPE.get(machine_type)


def gpu_series(machine_type: str) -> GpuSeries | None:
    """The series of `machine_type` (by its family), or None for a machine type of no series."""
    return next((s for s in GPU_SERIES if machine_type.startswith(tuple(s.families))), None)
