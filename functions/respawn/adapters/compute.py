"""GcpComputeProvider: Compute Engine machines through google-cloud-compute: GPU VMs, TPU VMs and TPU slices.

Every machine is made of instances of one shape (`VmShape`), whose properties one builder writes
(`vm_properties`) for a GPU VM, a single-host TPU VM and a slice's instance template alike:
* a GPU VM boots a Deep Learning VM image (NVIDIA driver, Docker), whose startup script runs the trainer with
  `--gpus all`;
* a TPU VM is an instance with a TPU machine type and no guestAccelerators (compute/docs/tpus/tpu-machines), booting
  the job's `machine.image` or the generation's image family;
* a multi-host TPU slice is a MIG of 4-chip TPU VMs under a workload policy, and a GPU machine of several VMs
  (machine.vms) a MIG of GPU VMs (respawn.adapters.compute_slices).
Spot VMs are deleted on preemption (instanceTerminationAction=DELETE) and carry maxRunDuration = the time left until
the job's TTL (`CreateMachine.deadline`; the whole TTL when it is not set), so a VM never outlives its job even if
nothing deletes it. A slice's VMs stop instead, as Google's TPU Spot page makes a slice's template
(tpu/docs/spot-compute: `--provisioning-model=SPOT --instance-termination-action=STOP`), so a lost VM stays visible
in its MIG (see `slice_state`). A flex-start VM (provisioningModel FLEX_START) waits for capacity as PENDING
(MachineState.QUEUED) for at most the machine's `queue_timeout` and then runs for its max run duration
(compute/docs/instances/about-flex-start-vms).

Operations are awaited with our own operations clients (respawn.adapters.compute_operations), within
`create_wait_s`; a single instance still creating after that is left to the sweep.

A world of several slices is told to a machine by `instances.setMetadata` on each of its VMs (`set_world`), with the
fingerprint its `get` just read: a write that lost the race to another (412) reads again and retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.cloud import compute_v1

from respawn.actions import CreateMachine
from respawn.adapters.compute_operations import Operations, Scope, operation_error
from respawn.adapters.compute_slices import ComputeSlices, Slice
from respawn.adapters.errors import classify, deleting, is_already_exists, read_retry
from respawn.adapters.settings import DEFAULTS, ProviderSettings, client_options
from respawn.adapters.startup import machine_labels, machine_metadata
from respawn.adapters.world_metadata import with_world
from respawn.gpus import HYPERDISK_BALANCED, PD_BALANCED, gpu_series
from respawn.jobs import (
    API_COMPUTE,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_MANAGED,
    GpuMachine,
    JobSpec,
    MachineState,
    Provisioning,
    Tier,
    flex_start_run_s,
    machine_name,
)
from respawn.ports import Machine, PermanentError, TransientError
from respawn.topology import ComputeShape, UnknownTpuType, compute_shape

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# Deep Learning VM image family with CUDA 12.8, the NVIDIA 570 driver and Docker.
DLVM_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
DEFAULT_NETWORK = "global/networks/default"
MIN_RUN_S = 30  # Compute Engine's smallest maxRunDuration
# A TPU VM "includes a 100 GiB boot disk".
TPU_BOOT_DISK_GB = 100
# The boot disk type of the TPU VMs that take Hyperdisk only, by machine type prefix: v6e (v5p takes Balanced
# Persistent Disk; tpu/docs/setup-persistent-disk). TPU7x: Hyperdisk Balanced, as for v6e, is unverified. A GPU VM's
# is its series' (respawn.gpus).
TPU_HYPERDISK = ("ct6e-", "tpu7x-")


def boot_disk_type(machine_type: str) -> str:
    """The boot disk type a VM of this machine type can boot from; Balanced Persistent Disk where nothing says
    otherwise."""
    series = gpu_series(machine_type)
    if series is not None:
        return series.boot_disk
    return HYPERDISK_BALANCED if machine_type.startswith(TPU_HYPERDISK) else PD_BALANCED


STATES: dict[str, MachineState] = {
    "PROVISIONING": MachineState.CREATING,
    "STAGING": MachineState.CREATING,
    "PENDING": MachineState.QUEUED,  # "For Flex Start provisioning instance is waiting for available capacity"
    "RUNNING": MachineState.READY,
    "REPAIRING": MachineState.READY,
    "STOPPING": MachineState.TERMINATED,  # a preempted Spot VM goes STOPPING -> TERMINATED (or is deleted)
    "PENDING_STOP": MachineState.TERMINATED,
    "STOPPED": MachineState.TERMINATED,
    "TERMINATED": MachineState.TERMINATED,
    "SUSPENDING": MachineState.TERMINATED,
    "SUSPENDED": MachineState.TERMINATED,
    "DEPROVISIONING": MachineState.DELETING,
}
_DONE = compute_v1.Operation.Status.DONE


@dataclass(frozen=True)
class VmShape:
    """What each instance of a machine is: machine type, GPUs, boot disk, and metadata beyond the job's."""

    machine_type: str
    image: str
    disk_gb: int
    disk_type: str
    gpus: tuple[str, int] | None = None  # (accelerator type, count); TPU machine types come with their chips
    metadata: tuple[tuple[str, str], ...] = ()


def scheduling(
    provisioning: str, run_s: int, on_preemption: str = "DELETE", notice_s: int | None = None
) -> compute_v1.Scheduling:
    """GPUs and TPUs cannot live-migrate, so host maintenance terminates; respawn, not GCE, restarts the work.
    A reservation tier runs standard VMs that consume the reservation, a reservation-bound tier RESERVATION_BOUND
    VMs that consume it and end with it (no maxRunDuration: the calendar-mode reservation's end bounds them); both
    name it in `reservation_affinity`. `on_preemption` is the instanceTerminationAction of a Spot, standard or
    reservation-bound VM; a flex-start VM is always deleted at its end. A Spot VM asks for `notice_s` of metadata
    notice before its soft off (the job's preemption_notice; preview)."""
    if provisioning == Provisioning.PREEMPTIBLE:  # legacy preemptible VMs: at most 24 h, no maxRunDuration
        return compute_v1.Scheduling(preemptible=True, automatic_restart=False, on_host_maintenance="TERMINATE")
    flex = provisioning == Provisioning.FLEX_START
    fields: dict[str, compute_v1.Duration] = {}
    if provisioning == Provisioning.SPOT and notice_s is not None:
        fields["preemption_notice_duration"] = compute_v1.Duration(seconds=notice_s)
    if provisioning != Provisioning.RESERVATION_BOUND:
        fields["max_run_duration"] = compute_v1.Duration(seconds=run_s)
    return compute_v1.Scheduling(
        provisioning_model=_MODELS.get(provisioning, "STANDARD"),
        instance_termination_action="DELETE" if flex else on_preemption,
        automatic_restart=False,
        on_host_maintenance="TERMINATE",
        **fields,
    )


# Compute Engine's provisioningModel of each tier's provisioning (standard and reservation: STANDARD).
_MODELS: dict[str, str] = {
    Provisioning.SPOT: "SPOT",
    Provisioning.FLEX_START: "FLEX_START",
    Provisioning.RESERVATION_BOUND: "RESERVATION_BOUND",
}


def reservation_affinity(tier: Tier) -> compute_v1.ReservationAffinity | None:
    """A reservation or reservation-bound tier consumes its named reservation (SPECIFIC_RESERVATION). A flex-start
    VM consumes none (NO_RESERVATION): left out, the field means ANY_RESERVATION (its discovery description), and
    flex-start capacity comes from Dynamic Workload Scheduler, not from a reservation; gcloud's
    `--reservation-affinity=none`, as GKE's flex-start node pools and xpk ask for it. Others: the API's default."""
    if tier.reservation:
        return compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[tier.reservation],
        )
    if tier.provisioning == Provisioning.FLEX_START:
        return compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    return None


class GcpComputeProvider:
    """MachineProvider for Compute Engine machines named JOB_ID-aN in projects/PROJECT/zones/ZONE: GPU VMs, TPU VMs
    and multi-host TPU slices (MIGs)."""

    def __init__(
        self,
        project: str,
        *,
        endpoint: str | None = None,
        settings: ProviderSettings = DEFAULTS,
        image: str = DLVM_IMAGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.project = project
        options = client_options(endpoint)
        self.client = compute_v1.InstancesClient(**options)
        self.operations = Operations(project, options)
        self.slices = ComputeSlices(project, options, self.operations, settings)
        self.settings = settings
        self.image = image  # the GPU VMs' boot image
        self.timeout = settings.request_timeout_s
        self.retry = read_retry(settings.read_retry_s)
        self.clock = clock

    # ------------------------------------------------------------------------------------------------ requests

    def shape(self, spec: JobSpec) -> tuple[VmShape, ComputeShape | None]:
        """Each VM of the job's machines, and for a TPU its Compute Engine shape (how many VMs, which topology)."""
        m = spec.machine
        if isinstance(m, GpuMachine):
            vm = VmShape(
                m.machine_type,
                self.image,
                m.boot_disk_gb,
                boot_disk_type(m.machine_type),
                gpus=(m.accelerator_type, m.accelerator_count),
                metadata=(("install-nvidia-driver", "True"),),
            )
            return vm, ComputeShape(m.machine_type, m.vms, "", self.image)
        if m.api != API_COMPUTE:
            raise PermanentError(f"machine.api: {m.api!r} is not Compute Engine's; allowed here: {API_COMPUTE}")
        try:
            shape = compute_shape(m.accelerator_type)
        except UnknownTpuType as e:
            raise PermanentError(f"machine.accelerator_type: {e}") from e
        vm = VmShape(shape.machine_type, m.image or shape.image, TPU_BOOT_DISK_GB, boot_disk_type(shape.machine_type))
        return vm, shape

    def vm_properties(
        self, action: CreateMachine, spec: JobSpec, vm: VmShape, *, template: bool = False
    ) -> compute_v1.InstanceProperties:
        """One VM's properties as an instance template holds them (`template`: bare type names, and a slice's VMs
        stop when preempted)."""
        return compute_v1.InstanceProperties(**self._vm_fields(action, spec, vm, template))

    def run_s(self, action: CreateMachine, spec: JobSpec) -> int:
        """The maxRunDuration of the attempt's VMs: flex-start, the tier's max run duration or the time left to the
        TTL deadline (capped at 7 days); otherwise the time left, so that no VM outlives its job."""
        tier, now = spec.all_tiers[action.tier], self.clock()
        deadline = action.deadline if action.deadline is not None else now + spec.ttl_s
        if tier.provisioning == Provisioning.FLEX_START:
            return flex_start_run_s(tier, deadline, now)
        return max(MIN_RUN_S, int(deadline - now))

    def _vm_fields(self, action: CreateMachine, spec: JobSpec, vm: VmShape, template: bool) -> dict[str, Any]:
        """The fields an Instance and an InstanceProperties share (the same names), for one VM of the attempt."""
        zone, tier = action.zone, spec.all_tiers[action.tier]
        run_s = self.run_s(action, spec)
        metadata = {
            **machine_metadata(
                spec,
                action.attempt,
                action.mtbi_s,
                start_after=action.start_after,
                slice_world=(action.slice, action.world),
            ),
            **dict(vm.metadata),
        }
        nic = compute_v1.NetworkInterface(
            network=self.settings.network or DEFAULT_NETWORK, subnetwork=self.settings.subnetwork_in(zone, self.project)
        )
        if self.settings.external_ips:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        disk_type = _zonal(zone, "diskTypes", vm.disk_type, template)
        disk = compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=vm.image, disk_size_gb=vm.disk_gb, disk_type=disk_type
            ),
        )
        fields: dict[str, Any] = {
            "machine_type": _zonal(zone, "machineTypes", vm.machine_type, template),
            "scheduling": scheduling(
                tier.provisioning, run_s, "STOP" if template else "DELETE", spec.preemption_notice_s
            ),
            "disks": [disk],
            "network_interfaces": [nic],
            "metadata": compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]),
            "labels": machine_labels(spec, action.attempt),
        }
        if vm.gpus is not None:
            accelerator, count = vm.gpus
            accelerator_type = _zonal(zone, "acceleratorTypes", accelerator, template)
            fields["guest_accelerators"] = [
                compute_v1.AcceleratorConfig(accelerator_type=accelerator_type, accelerator_count=count)
            ]
        if (affinity := reservation_affinity(tier)) is not None:
            fields["reservation_affinity"] = affinity
        if self.settings.service_account:
            account = compute_v1.ServiceAccount(email=self.settings.service_account, scopes=[CLOUD_PLATFORM])
            fields["service_accounts"] = [account]
        return fields

    def instance(self, action: CreateMachine, spec: JobSpec) -> compute_v1.Instance:
        """The one instance of a GPU VM or single-host TPU VM. Flex-start: it waits for capacity at most the
        machine's queue_timeout (`params.requestValidForDuration`)."""
        vm, shape = self.shape(spec)
        if shape is not None and shape.multi_host:
            raise PermanentError(
                f"machine.accelerator_type: {spec.machine.accelerator_type} is a multi-host slice, not one instance"
            )
        instance = compute_v1.Instance(name=action.machine, **self._vm_fields(action, spec, vm, template=False))
        if spec.all_tiers[action.tier].provisioning == Provisioning.FLEX_START:
            wait = compute_v1.Duration(seconds=spec.machine.queue_timeout_s)
            instance.params = compute_v1.InstanceParams(request_valid_for_duration=wait)
        return instance

    def slice(self, action: CreateMachine, spec: JobSpec) -> Slice:
        """The attempt's slice: a multi-host TPU slice, or a GPU machine's VMs (machine.vms > 1)."""
        vm, shape = self.shape(spec)
        if shape is None or not shape.multi_host:
            raise PermanentError(
                f"machine.accelerator_type: {spec.machine.accelerator_type} is one instance, not a multi-host slice"
            )
        flex = spec.all_tiers[action.tier].provisioning == Provisioning.FLEX_START
        properties = self.vm_properties(action, spec, vm, template=True)
        series = gpu_series(vm.machine_type)  # a TPU slice is placed always, GPU VMs as their series says (if any)
        placement = vm.gpus is None or (series is not None and series.takes_workload_policy(vm.gpus[1], flex=flex))
        topology = shape.topology or None
        return Slice(self.project, action.machine, action.zone, shape.vms, topology, properties, flex, placement)

    # ------------------------------------------------------------------------------------------------ provider

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        if _multi_host(spec):
            self.slices.create(self.slice(action, spec))
            return
        what = f"create VM {action.machine} in {action.zone}"
        try:
            op = self.client.insert_unary(
                project=self.project,
                zone=action.zone,
                instance_resource=self.instance(action, spec),
                timeout=self.timeout,
            )
        except Exception as e:
            if is_already_exists(e):
                return
            raise classify(e, what) from e
        try:
            done = self.operations.wait(op, Scope(zone=action.zone), time.monotonic() + self.settings.create_wait_s)
        except Exception as e:  # waiting itself failed (not the operation)
            raise classify(e, what) from e
        if done is None:
            return  # still creating: the sweep observes the VM later
        error = operation_error(done)
        if error is not None and not is_already_exists(error):
            raise classify(error, what, in_operation=True) from error

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        """The instance, or the slice (MIG -> template -> policy); with no spec, both ways."""
        multi_host = _multi_host(spec) if spec is not None else None
        if multi_host is not True:
            deleting(
                lambda: self.client.delete_unary(project=self.project, zone=zone, instance=name, timeout=self.timeout),
                f"delete VM {name} in {zone}",
            )
        if multi_host is not False:
            self.slices.delete(name, zone)

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        """The instance or the slice of that name; with no spec, whichever exists."""
        multi_host = _multi_host(spec) if spec is not None else None
        if multi_host is not True:
            try:
                vm = self.client.get(
                    project=self.project, zone=zone, instance=name, retry=self.retry, timeout=self.timeout
                )
                return _machine(vm, zone)
            except gexc.NotFound:
                pass
            except Exception as e:
                raise classify(e, f"get VM {name} in {zone}") from e
        return self.slices.get(name, zone) if multi_host is not False else None

    def set_world(self, name: str, zone: str, spec: JobSpec, world: str) -> None:
        """`respawn-world` = `world` on the instance, or on each VM its slice's MIG lists (`listManagedInstances`): one
        `instances.setMetadata` per VM, unless the VM holds that version or a newer one. A VM, or a MIG, that is not
        there is done."""
        deadline = time.monotonic() + self.settings.create_wait_s
        for vm in self.slices.vm_names(name, zone) if _multi_host(spec) else [name]:
            self._set_world(vm, zone, world, deadline)

    def _set_world(self, vm: str, zone: str, world: str, deadline: float) -> None:
        """The VM's metadata, read with its fingerprint, written back with the world (`setMetadata` takes the whole
        list: every other key is kept). A write that lost the race to another (412 conditionNotMet: the fingerprint
        changed) reads the VM again and retries, for at most `request_timeout_s`."""
        what = f"set the world on VM {vm} in {zone}"
        try:
            conflict_retry(self.timeout)(self._write_world)(vm, zone, world, deadline, what)
        except gexc.NotFound:
            return
        except Exception as e:
            raise classify(e, what) from e

    def _write_world(self, vm: str, zone: str, world: str, deadline: float, what: str) -> None:
        got = self.client.get(project=self.project, zone=zone, instance=vm, retry=self.retry, timeout=self.timeout)
        items = with_world({i.key: i.value for i in got.metadata.items}, world)
        if items is None:
            return
        metadata = compute_v1.Metadata(
            fingerprint=got.metadata.fingerprint, items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]
        )
        op = self.client.set_metadata_unary(
            project=self.project, zone=zone, instance=vm, metadata_resource=metadata, timeout=self.timeout
        )
        done = self.operations.wait(op, Scope(zone=zone), deadline)
        if done is None:
            raise TransientError(f"{what}: the write is still running; the next try reads the VM again")
        error = operation_error(done)
        if error is not None and lost_race(done):
            raise gexc.PreconditionFailed(error.message)  # type: ignore[no-untyped-call]  # read again, retried
        if isinstance(error, gexc.NotFound):
            raise error  # gone: done
        if error is not None:
            raise classify(error, what, in_operation=True) from error

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        """respawn's instances (not a slice's VMs: the slice is listed once, by its MIG) and slices in the zone."""
        query = f'(labels.{LABEL_MANAGED} = "true")'
        if job_id is not None:
            query += f' AND (labels.{LABEL_JOB} = "{job_id}")'
        request = compute_v1.ListInstancesRequest(project=self.project, zone=zone, filter=query)
        try:
            vms = list(self.client.list(request=request, retry=self.retry, timeout=self.timeout))
        except Exception as e:
            raise classify(e, f"list VMs in {zone}") from e
        return [  # the filter again, client-side: a label value is never trusted to the query language alone
            _machine(vm, zone)
            for vm in vms
            if vm.labels.get(LABEL_MANAGED) == "true"
            and (job_id is None or vm.labels.get(LABEL_JOB) == job_id)
            and _machine_instance(vm)
        ] + self.slices.list(zone, job_id)


def conflict_retry(seconds: float) -> gretry.Retry:
    """Retries a read-then-write whose write lost the race (412 PreconditionFailed: a stale fingerprint) for at most
    `seconds`; then the last error, as api_core's RetryError (transient: the next delivery tries again)."""
    predicate = gretry.if_exception_type(gexc.PreconditionFailed)
    return gretry.Retry(predicate=predicate, initial=0.1, maximum=1.0, multiplier=2.0, timeout=seconds)


def lost_race(op: compute_v1.Operation) -> bool:
    """Whether a DONE setMetadata operation failed for a stale fingerprint: Compute Engine refuses one at once (412
    conditionNotMet) or, as users report it, in the operation ("Supplied fingerprint does not match current metadata
    fingerprint", code CONDITION_NOT_MET)."""
    codes = {e.code.upper() for e in op.error.errors}
    return op.http_error_status_code == 412 or "CONDITION_NOT_MET" in codes or "CONDITIONNOTMET" in codes


def _multi_host(spec: JobSpec) -> bool:
    """Whether the job's machines are MIG slices: a TPU that Compute Engine makes of more than one VM, or a GPU
    machine of several VMs."""
    m = spec.machine
    if isinstance(m, GpuMachine):
        return m.vms > 1
    if m.api != API_COMPUTE:
        return False
    try:
        return compute_shape(m.accelerator_type).multi_host
    except UnknownTpuType:
        return False  # create says why, as a permanent error


def _zonal(zone: str, collection: str, name: str, bare: bool) -> str:
    """An instance names zonal types by URL; an instance template by name only."""
    return name if bare else f"zones/{zone}/{collection}/{name}"


def _machine_instance(vm: compute_v1.Instance) -> bool:
    """Whether the instance is a machine itself, not one VM of a slice's MIG (which carries the same labels as its
    template, under the name NAME-w-x7k2)."""
    try:
        return vm.name == machine_name(vm.labels[LABEL_JOB], int(vm.labels[LABEL_ATTEMPT]))
    except (KeyError, ValueError):
        return False


def _machine(vm: compute_v1.Instance, zone: str) -> Machine:
    state = STATES.get(vm.status, MachineState.CREATING)  # unknown: let the sweep's timeout judge
    return Machine(name=vm.name, zone=zone, state=state, labels=dict(vm.labels))
