"""Which of a job's zones offer its machine: the APIs' own listings of machine and accelerator types per zone.

* a TPU on the Cloud TPU API: `projects/P/locations/Z/acceleratorTypes/TYPE` (the TPU API's acceleratorTypes.get);
* a TPU on Compute Engine: `zones/Z/machineTypes/T` for the machine type of each of its VMs (topology.compute_shape);
* a GPU: `zones/Z/machineTypes/T` and `zones/Z/acceleratorTypes/GPU` (Compute Engine).

NOT_FOUND means the zone does not offer it. Any other error leaves the zone unknown (None): `respawn submit` warns
about the zones that do not offer the machine and refuses a job none of whose zones does; a zone it could not ask
about is neither. The functions never call this: a create refused in a zone that does not offer the type is the
same answer at run time (adapters.errors: UnofferedError), and decide skips that zone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import compute_v1, tpu_v2

from respawn.adapters.errors import error_text
from respawn.adapters.settings import client_options
from respawn.jobs import API_TPU, GpuMachine, JobSpec, MachineSpec
from respawn.topology import compute_shape

# One try each, briefly: a zone that cannot be asked is left unknown rather than holding up `respawn submit`.
_ONCE: dict[str, Any] = {"retry": None, "timeout": 15.0}


@dataclass(frozen=True)
class Offering:
    zone: str
    offered: bool | None  # None: the zone could not be asked
    detail: str  # what is missing there, or why the zone could not be asked ("" when it offers the machine)


def machine_words(machine: MachineSpec) -> str:
    """The machine as errors name it: `v6e-16 (ct6e-standard-4t VMs)`, `a3-highgpu-8g with 8 nvidia-h100-80gb`."""
    if isinstance(machine, GpuMachine):
        return f"{machine.machine_type} with {machine.accelerator_count} {machine.accelerator_type}"
    if machine.api == API_TPU:
        return machine.accelerator_type
    return f"{machine.accelerator_type} ({compute_shape(machine.accelerator_type).machine_type} VMs)"


class OfferingLookup:
    """Asks the APIs, zone by zone, whether they offer a job's machine (the same endpoints as the providers)."""

    def __init__(self, project: str, *, tpu_endpoint: str | None = None, compute_endpoint: str | None = None) -> None:
        self.project = project
        self.tpu = tpu_v2.TpuClient(**client_options(tpu_endpoint))
        self.machine_types = compute_v1.MachineTypesClient(**client_options(compute_endpoint))
        self.accelerators = compute_v1.AcceleratorTypesClient(**client_options(compute_endpoint))

    def zones(self, spec: JobSpec) -> list[Offering]:
        """Each zone of each tier asked about that tier's machine (a tier may name its own), each pair once."""
        pairs = {(zone, spec.machine_of(n)): None for n, tier in enumerate(spec.all_tiers) for zone in tier.zones}
        return [self.zone(machine, zone) for zone, machine in pairs]

    def zone(self, machine: MachineSpec, zone: str) -> Offering:
        """Every type the machine needs, asked for in `zone`: the first one missing says the zone does not offer
        it."""
        for what, ask in self._asks(machine, zone):
            try:
                ask()
            except gexc.NotFound:
                return Offering(zone, False, f"{zone} does not offer {what}")
            except Exception as e:  # no credentials, no permission, the API unreachable: the zone is unknown
                return Offering(zone, None, f"could not ask whether {zone} offers {what}: {error_text(e)}")
        return Offering(zone, True, "")

    def _asks(self, machine: MachineSpec, zone: str) -> list[tuple[str, Callable[[], object]]]:
        p = self.project
        if isinstance(machine, GpuMachine):
            return [
                (
                    f"machine type {machine.machine_type}",
                    lambda: self.machine_types.get(project=p, zone=zone, machine_type=machine.machine_type, **_ONCE),
                ),
                (
                    f"accelerator type {machine.accelerator_type}",
                    lambda: self.accelerators.get(
                        project=p, zone=zone, accelerator_type=machine.accelerator_type, **_ONCE
                    ),
                ),
            ]
        if machine.api == API_TPU:
            name = f"projects/{p}/locations/{zone}/acceleratorTypes/{machine.accelerator_type}"
            return [(f"TPU type {machine.accelerator_type}", lambda: self.tpu.get_accelerator_type(name=name, **_ONCE))]
        machine_type = compute_shape(machine.accelerator_type).machine_type
        return [
            (
                f"machine type {machine_type}",
                lambda: self.machine_types.get(project=p, zone=zone, machine_type=machine_type, **_ONCE),
            )
        ]
