"""Today's GPU machines: the one table of Compute Engine's GPU machine shapes respawn knows.

Each row is an accelerator-optimized machine type with its GPUs attached: the machine type, the accelerator type
as the Compute Engine API names it (a VM's guestAccelerators[].acceleratorType), the GPUs per VM, and the boot disk
type the VM boots from. From Google's pages "GPU machine types" (https://cloud.google.com/compute/docs/gpus) and
"Accelerator-optimized machine family" (https://cloud.google.com/compute/docs/accelerator-optimized-machines:
each series' machine types and its "Supported disk types": A4 and A3 Ultra boot from Hyperdisk only; G2, A2, A3 High
and A3 Mega from Persistent Disk). Their prices are respawn.prices.GPU_PRICES (per GPU, by accelerator type);
docs/gpus.md prints both, and a test holds it to this table.

Machine types outside the table (an N1 VM with T4s or V100s attached, a newer shape) still run: the job names its
machine type, accelerator type and count, and the boot disk is Balanced Persistent Disk.
"""

from __future__ import annotations

from dataclasses import dataclass

PD_BALANCED = "pd-balanced"
HYPERDISK_BALANCED = "hyperdisk-balanced"


@dataclass(frozen=True)
class GpuShape:
    series: str  # the machine series as Google's pages name it, e.g. "A3 Ultra"
    gpu: str  # the GPU, e.g. "H200 141GB"
    machine_type: str
    accelerator_type: str  # as the Compute Engine API names it
    gpus: int  # per VM
    boot_disk: str  # the boot disk type (PD_BALANCED or HYPERDISK_BALANCED)


def _series(series: str, gpu: str, accelerator: str, disk: str, types: dict[str, int]) -> list[GpuShape]:
    return [GpuShape(series, gpu, t, accelerator, n, disk) for t, n in types.items()]


GPU_SHAPES: tuple[GpuShape, ...] = tuple(
    _series("G2", "L4", "nvidia-l4", PD_BALANCED, {
        "g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-24": 2,
        "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8,
    })
    + _series("A2 Standard", "A100 40GB", "nvidia-tesla-a100", PD_BALANCED, {
        "a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8, "a2-megagpu-16g": 16,
    })
    + _series("A2 Ultra", "A100 80GB", "nvidia-a100-80gb", PD_BALANCED, {
        "a2-ultragpu-1g": 1, "a2-ultragpu-2g": 2, "a2-ultragpu-4g": 4, "a2-ultragpu-8g": 8,
    })
    # a3-highgpu-1g, -2g and -4g are offered as Spot and flex-start VMs only
    + _series("A3 High", "H100 80GB", "nvidia-h100-80gb", PD_BALANCED, {
        "a3-highgpu-1g": 1, "a3-highgpu-2g": 2, "a3-highgpu-4g": 4, "a3-highgpu-8g": 8,
    })
    + _series("A3 Mega", "H100 80GB Mega", "nvidia-h100-mega-80gb", PD_BALANCED, {"a3-megagpu-8g": 8})
    + _series("A3 Ultra", "H200 141GB", "nvidia-h200-141gb", HYPERDISK_BALANCED, {"a3-ultragpu-8g": 8})
    + _series("A4", "B200 180GB", "nvidia-b200", HYPERDISK_BALANCED, {"a4-highgpu-8g": 8})
)  # fmt: skip

BY_MACHINE_TYPE: dict[str, GpuShape] = {shape.machine_type: shape for shape in GPU_SHAPES}


def gpu_shape(machine_type: str) -> GpuShape | None:
    """The table's row of `machine_type`, or None for a machine type it does not list."""
    return BY_MACHINE_TYPE.get(machine_type)
