"""Slices on Compute Engine, multi-host TPU slices and multi-VM GPU machines: a workload policy, an instance template
and a managed instance group.

A GPU machine of `vms` VMs (machine.vms) is the same three objects: its workload policy has no acceleratorTopology
(only HIGH_THROUGHPUT placement), and a GPU series that takes no workload policy in a MIG gets none (two objects).

A slice of `vms` 4-chip VMs is three objects, all named after the attempt's machine NAME and created in this order
(compute/docs/tpus/create-tpu-mig-multi-host-slice, tpu/docs/tpus-and-migs):
1. the regional resource policy NAME: `workloadPolicy {type: HIGH_THROUGHPUT, acceleratorTopology}` (region op);
2. the global instance template NAME: the VM's properties, as a single-host instance has them (global op);
3. the zonal MIG NAME: `baseInstanceName NAME-w`, that template, the policy as its workload policy, never repaired
   (`defaultActionOnFailure DO_NOTHING`) (zone op). Its mode is what Google's bulk-mode pages allow the template's
   provisioning model, never what an error says: "Bulk mode in MIGs is only supported with instance templates that
   specify either a reservation-bound or flex-start provisioning model" (compute/docs/instance-groups/
   bulk-create-instances-in-mig), so a flex-start or reservation-bound slice is created all at once
   (`targetSizePolicy.mode BULK`) and a Spot or standard one in the default mode (INDIVIDUAL, no targetSizePolicy),
   the MIG creating its VMs one by one; a slice is READY only when all of them run, and a VM's creation error (no
   capacity, an unoffered type) ends the attempt as a BULK one's would (`slice_state`).
Flex-start is the BULK MIG with a FLEX_START template (maxRunDuration, DELETE at its end): the MIG waits for
capacity in Dynamic Workload Scheduler's queue (MachineState.QUEUED) and creates every VM at once. No resize request,
though Google documents resize requests for GPU VMs all at once under flex-start: its page comparing the two
(compute/docs/instance-groups/overview-add-vms-all-at-once-in-mig) recommends bulk mode "unless you need to manage
multiple parallel requests ... or resize a MIG that already contains instances", neither of which a slice does;
about-bulk-mode lists resize requests among what BULK MIGs do not support; and users report "Creating resize requests
for managed instance group with TPU is not allowed" with a working flex-start slice made of a FLEX_START template and
a BULK MIG (unverified on a real project).
Every create treats AlreadyExists as done and waits for its operation before the next (each object names the one
before), so a crash between any two calls is repaired by the next delivery. Deletion goes MIG (its VMs with it) ->
template -> policy, NotFound as done at each step; the template and policy are in use until the MIG is gone, so
they are deleted once the MIG's deletion is DONE.

Leftovers: a template or policy whose MIG is gone (a MIG that took longer to delete than a call waits, a create
abandoned half way) is listed as the attempt's machine, TERMINATED, so the sweep deletes it like any machine of an
ended attempt (`decide`'s orphan rule) and nothing leaks. The template and policy carry the zone in their
description, since neither is zonal.

A slice is observed as one Machine named NAME (`slice_state`); where the documents leave a point open, the rule is
chosen to be right either way, and said so there.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from respawn.adapters.compute_operations import Operations, Scope, api_error, operation_error
from respawn.adapters.errors import classify, deleting, is_already_exists, read_retry
from respawn.adapters.settings import ProviderSettings, region_of
from respawn.jobs import MachineState, parse_machine_name, slice_vm_base
from respawn.ports import CapacityError, Machine, PermanentError, ProviderError, TransientError, UnofferedError

MANAGED = "respawn-managed"  # the MIG's description (a MIG has no labels)
_DESCRIPTION = re.compile(rf"^{MANAGED}: (?:TPU )?slice in ([a-z0-9-]+)$")  # "TPU slice": written before GPU slices
# The provisioning models Google's bulk-mode pages say BULK takes: a MIG of any other is created in the default mode.
BULK_MODELS = frozenset({"FLEX_START", "RESERVATION_BOUND"})

# compute_v1 holds these enum fields as strings: ManagedInstance.instance_status / current_action,
# InstanceGroupManagerStatusAcceleratorTopology.state.
# A VM in one of these states is lost to the slice: preempted (STOP on preemption, as tpu/docs/spot-compute makes
# Spot slice templates, leaves it TERMINATED, and a MIG with repair off does not replace it), stopped, suspended or
# on its way there.
LOST_VM = frozenset({"STOPPING", "STOPPED", "TERMINATED", "PENDING_STOP", "SUSPENDING", "SUSPENDED", "DEPROVISIONING"})


def description(zone: str) -> str:
    """The template's and policy's description: theirs, and the zone of their MIG (neither object is zonal)."""
    return f"{MANAGED}: slice in {zone}"


@dataclass(frozen=True)
class Slice:
    """One attempt's multi-host slice: what `create` makes, every object named `name`."""

    project: str
    name: str
    zone: str
    vms: int
    topology: str | None  # the workload policy's acceleratorTopology, e.g. "4x4"; None for GPU VMs (no topology)
    properties: compute_v1.InstanceProperties  # every VM's, as a single-host instance's
    flex: bool = False  # flex-start: the MIG waits in the queue for capacity, and a wait is not a failure
    placement: bool = True  # under a workload policy; False: no policy (a GPU series that takes none)

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def policy_url(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.name}"

    @property
    def template_url(self) -> str:
        return f"projects/{self.project}/global/instanceTemplates/{self.name}"


def workload_policy(s: Slice) -> compute_v1.ResourcePolicy:
    return compute_v1.ResourcePolicy(
        name=s.name,
        description=description(s.zone),
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
            type_="HIGH_THROUGHPUT", **({"accelerator_topology": s.topology} if s.topology else {})
        ),
    )


def instance_template(s: Slice) -> compute_v1.InstanceTemplate:
    return compute_v1.InstanceTemplate(name=s.name, description=description(s.zone), properties=s.properties)


def instance_group_manager(s: Slice) -> compute_v1.InstanceGroupManager:
    """All `vms` VMs of the slice: at once (BULK) where its template's provisioning model takes bulk mode
    (BULK_MODELS), else in the default mode."""
    mig = compute_v1.InstanceGroupManager(
        name=s.name,
        description=MANAGED,
        base_instance_name=slice_vm_base(s.name),
        instance_template=s.template_url,
        target_size=s.vms,
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"
        ),
    )
    if s.placement:
        mig.resource_policies = compute_v1.InstanceGroupManagerResourcePolicies(workload_policy=s.policy_url)
    if bulk_mode(s):
        mig.target_size_policy = compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK")
    return mig


def bulk_mode(s: Slice) -> bool:
    """Whether the slice's MIG is created in BULK mode: its template's provisioning model takes it (BULK_MODELS)."""
    return s.properties.scheduling.provisioning_model in BULK_MODELS


@dataclass(frozen=True)
class Observed:
    """What a slice's objects say: its state, the API's words for a failure, and whether any VM exists yet."""

    state: MachineState
    detail: str = ""
    errors: tuple[tuple[str, str], ...] = ()  # (code, message) of a creation that failed
    started: bool = False  # some VM has an instance (bulk creation got its capacity)


def slice_state(
    mig: compute_v1.InstanceGroupManager,
    vms: Sequence[compute_v1.ManagedInstance],
    flex: bool = False,
    topology: bool = True,
) -> Observed:
    """The slice's state from its MIG and the MIG's managed instances; `flex`: its template is FLEX_START;
    `topology`: its VMs are TPU VMs, whose applied topology must be ACTIVE (GPU VMs have none). By the first rule
    that holds:
    * FAILED: a Spot/standard creation reported errors while VMs are missing (a BULK creation that found no
      capacity: `status.bulkInstanceOperation.lastProgressCheck.error`; a VM's `lastAttempt.errors`, as an
      INDIVIDUAL MIG reports it), a flex-start one errors no queue waits out (`_fails_flex`: a type the zone does
      not offer), or the topology FAILED before any VM ran; `detail` is the API's reason.
    * DELETING: every VM is being deleted (the MIG's own deletion).
    * PREEMPTED: the slice lost a VM: one is TERMINATED/STOPPED/STOPPING/SUSPENDED (LOST_VM) or being recreated;
      the topology is DEACTIVATING, FAILED or ACTIVE_DEGRADED ("active but operating in degraded mode", the
      discovery document's words: a slice that no longer runs whole, recreated like a lost one); or a VM is
      missing (fewer VMs than targetSize, or one without an instance) while another runs. A slice is recovered
      whole, so one lost VM loses it.
    * QUEUED: flex-start waits for capacity: the MIG's BULK creation is in progress with no VM yet (the reason it
      gives, e.g. ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS, is the queue's, not a failure).
    * READY: `targetSize` VMs, all RUNNING, and every applied topology ACTIVE.
    * CREATING: anything else (VMs provisioning, the topology ACTIVATING or INCOMPLETE without a lost VM).
    Whether a preempted Spot VM of a slice MIG stays TERMINATED or is deleted (and perhaps recreated) is not settled
    by Google's documents: each of the three shows as a lost VM here.
    """
    statuses = [vm.instance_status for vm in vms if vm.instance_status]
    running = statuses.count("RUNNING")
    topologies = [t.state for t in mig.status.applied_accelerator_topologies]
    started = bool(statuses)
    errors = _creation_errors(mig, vms)
    incomplete = len(statuses) < max(mig.target_size, len(vms), 1)
    if errors and incomplete and (not flex or _fails_flex(errors)):
        return Observed(MachineState.FAILED, _text(errors), errors, started)
    if "FAILED" in topologies and not running:
        errors = _topology_errors(mig)
        return Observed(MachineState.FAILED, _text(errors) or "the slice's topology FAILED", errors, started)
    if vms and all(vm.current_action == "DELETING" for vm in vms):
        return Observed(MachineState.DELETING, started=started)
    lost = any(s in LOST_VM for s in statuses) or any(vm.current_action == "RECREATING" for vm in vms)
    broken = {"DEACTIVATING", "FAILED", "ACTIVE_DEGRADED"} & set(topologies)
    missing = running > 0 and (len(statuses) < mig.target_size or len(statuses) < len(vms))
    if lost or broken or missing:
        return Observed(MachineState.PREEMPTED, started=started)
    if flex and mig.status.bulk_instance_operation.in_progress and not started:
        return Observed(MachineState.QUEUED, started=started)
    active = all(t == "ACTIVE" for t in topologies) and (bool(topologies) or not topology)
    if mig.target_size > 0 and running == len(vms) == mig.target_size and active:
        return Observed(MachineState.READY, started=started)
    return Observed(MachineState.CREATING, started=started)


def _creation_errors(
    mig: compute_v1.InstanceGroupManager, vms: Sequence[compute_v1.ManagedInstance]
) -> tuple[tuple[str, str], ...]:
    bulk = mig.status.bulk_instance_operation.last_progress_check.error.errors
    found = [(e.code, e.message) for e in bulk]
    found += [(e.code, e.message) for vm in vms for e in vm.last_attempt.errors.errors]
    return tuple(dict.fromkeys(found))  # the same error from every VM once


def _fails_flex(errors: Sequence[tuple[str, str]]) -> bool:
    """Whether a flex-start MIG's errors fail it rather than keep it in the queue: a type its zone does not offer
    (or a permanent error) never comes with capacity. No capacity or quota yet is the queue's wait, and an error of
    no telling kind is left to the queue as before."""
    return isinstance(classify(api_error(list(errors)), "", in_operation=True), (UnofferedError, PermanentError))


def _topology_errors(mig: compute_v1.InstanceGroupManager) -> tuple[tuple[str, str], ...]:
    found = [
        (e.code, e.message)
        for t in mig.status.applied_accelerator_topologies
        for e in t.state_details.error.errors
        if t.state == "FAILED"
    ]
    return tuple(dict.fromkeys(found))


def _text(errors: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{code}: {message}" if code else message for code, message in errors)


class ComputeSlices:
    """Creates, deletes and observes the multi-host slices of one project (see the module's docstring)."""

    def __init__(
        self, project: str, options: dict[str, Any], operations: Operations, settings: ProviderSettings
    ) -> None:
        self.project = project
        self.policies = compute_v1.ResourcePoliciesClient(**options)
        self.templates = compute_v1.InstanceTemplatesClient(**options)
        self.migs = compute_v1.InstanceGroupManagersClient(**options)
        self.operations = operations
        self.settings = settings
        self.timeout = settings.request_timeout_s
        self.retry = read_retry(settings.read_retry_s)

    # ------------------------------------------------------------------------------------------------ create

    def create(self, s: Slice) -> None:
        """Policy -> template -> MIG, each waited for (within `create_wait_s` in all); a step left unfinished
        raises TransientError, so the next delivery goes on from it. Then it waits while the MIG's creation has
        neither VMs nor errors (a flex-start MIG's: until it waits in the queue). No capacity for the slice (in an
        operation or the MIG's creation; for flex-start, the queue's wait is none) or a type the zone does not offer
        raises CapacityError (UnofferedError), the slice deleted first so the zone walk leaves nothing behind; the
        VMs' progress after that is the sweep's."""
        deadline = time.monotonic() + self.settings.create_wait_s
        p, zone = self.project, s.zone
        policy: list[tuple[str, Callable[[], compute_v1.Operation], Scope]] = [
            (
                "workload policy",
                lambda: self.policies.insert_unary(
                    project=p, region=s.region, resource_policy_resource=workload_policy(s), timeout=self.timeout
                ),
                Scope(region=s.region),
            )
        ]
        steps: list[tuple[str, Callable[[], compute_v1.Operation], Scope]] = [
            *(policy if s.placement else []),
            (
                "instance template",
                lambda: self.templates.insert_unary(
                    project=p, instance_template_resource=instance_template(s), timeout=self.timeout
                ),
                Scope(),
            ),
            ("MIG", lambda: self._insert_mig(s), Scope(zone=zone)),
        ]
        try:
            for kind, insert, scope in steps:
                what = f"create {kind} {s.name} for the slice in {zone}"
                if not self._insert(insert, scope, deadline, what):
                    raise TransientError(f"{what}: still being created; the next try goes on from there")
            self._await_capacity(s, deadline)
        except CapacityError:  # decide walks on to the next zone: leave nothing here
            with contextlib.suppress(ProviderError):  # what is left is listed as leftovers, which the sweep deletes
                self.delete(s.name, zone)
            raise

    def _insert_mig(self, s: Slice) -> compute_v1.Operation:
        """The MIG, in the mode its template's provisioning model takes (`instance_group_manager`): one insert,
        whose refusal is classified as any other's."""
        return self.migs.insert_unary(
            project=self.project,
            zone=s.zone,
            instance_group_manager_resource=instance_group_manager(s),
            timeout=self.timeout,
        )

    def _insert(self, insert: Callable[[], compute_v1.Operation], scope: Scope, deadline: float, what: str) -> bool:
        """Whether the object exists now (created, or AlreadyExists); False while its operation still runs."""
        try:
            op = insert()
        except Exception as e:
            if is_already_exists(e):
                return True
            raise classify(e, what) from e
        try:
            done = self.operations.wait(op, scope, deadline)
        except Exception as e:  # waiting itself failed (not the operation)
            raise classify(e, what) from e
        if done is None:
            return False
        error = operation_error(done)
        if error is not None and not is_already_exists(error):
            raise classify(error, what, in_operation=True) from error
        return True

    def _await_capacity(self, s: Slice, deadline: float) -> None:
        """Until a VM exists, errors show or `deadline`: errors that mean no capacity (or no quota) raise
        CapacityError, a machine type the zone does not offer UnofferedError (decide skips the zone from then on), a
        permanent one PermanentError (decide ends the job and deletes the slice); anything else is the sweep's, which
        sees the slice FAILED with the API's reason. The errors are the MIG's own (a VM's `lastAttempt.errors`, its
        bulk creation's last progress check), classified as an operation's."""
        delay = 0.1
        while True:
            observed = self._observe(s.name, s.zone, instance_template(s))  # which says flex-start or not
            if observed is None or observed.started:
                return
            if observed.errors:
                error = classify(api_error(list(observed.errors)), f"create slice {s.name} in {s.zone}", True)
                if isinstance(error, (CapacityError, PermanentError)):
                    raise error
                return
            if observed.state is not MachineState.CREATING or time.monotonic() + delay > deadline:
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 5.0)

    # ------------------------------------------------------------------------------------------------ delete

    def delete(self, name: str, zone: str) -> None:
        """MIG -> template -> policy, NotFound as done. The template and policy are in use until the MIG's deletion
        is DONE: when it is not within `create_wait_s`, they are left to the sweep, which lists them (leftovers)."""
        region = region_of(zone)
        what = f"delete slice {name} in {zone}"
        op = deleting(
            lambda: self.migs.delete_unary(
                project=self.project, zone=zone, instance_group_manager=name, timeout=self.timeout
            ),
            what,
        )
        if op is not None:
            try:
                done = self.operations.wait(op, Scope(zone=zone), time.monotonic() + self.settings.create_wait_s)
            except Exception as e:
                raise classify(e, what) from e
            if done is None:
                return  # still deleting its VMs: the template and policy are the sweep's
            error = operation_error(done)
            if error is not None and not isinstance(error, gexc.NotFound):
                raise classify(error, what, in_operation=True) from error
        deleting(
            lambda: self.templates.delete_unary(project=self.project, instance_template=name, timeout=self.timeout),
            f"delete instance template {name}",
        )
        deleting(
            lambda: self.policies.delete_unary(
                project=self.project, region=region, resource_policy=name, timeout=self.timeout
            ),
            f"delete workload policy {name} in {region}",
        )

    # ------------------------------------------------------------------------------------------------ observe

    def vm_names(self, name: str, zone: str) -> list[str]:
        """The names of the VMs the slice's MIG lists (`listManagedInstances`; a VM not created yet has its name
        already); none when the MIG is gone."""
        try:
            vms = self.migs.list_managed_instances(
                project=self.project, zone=zone, instance_group_manager=name, retry=self.retry, timeout=self.timeout
            )
            return [vm.name or vm.instance.rsplit("/", 1)[-1] for vm in vms if vm.name or vm.instance]
        except gexc.NotFound:
            return []
        except Exception as e:
            raise classify(e, f"list the VMs of slice {name} in {zone}") from e

    def get(self, name: str, zone: str) -> Machine | None:
        """The slice as one Machine; its leftovers (template or policy without a MIG) as TERMINATED; else None."""
        template = self._template(name)
        observed = self._observe(name, zone, template)
        if observed is not None:
            return _machine(name, zone, observed, template)
        if template is not None or self._policy(name, zone) is not None:
            return _leftover(name, zone, template)
        return None

    def list(self, zone: str, job_id: str | None) -> list[Machine]:
        """respawn's slices in the zone, one Machine per MIG, and the leftovers of slices whose MIG is gone."""
        what = f"list slices in {zone}"
        try:
            migs = list(self.migs.list(project=self.project, zone=zone, retry=self.retry, timeout=self.timeout))
            templates = list(self.templates.list(project=self.project, retry=self.retry, timeout=self.timeout))
            policies = list(
                self.policies.list(project=self.project, region=region_of(zone), retry=self.retry, timeout=self.timeout)
            )
        except Exception as e:
            raise classify(e, what) from e
        ours = {t.name: t for t in templates if _ours(t.name, t.description, zone, job_id)}
        found = []
        for mig in migs:
            if mig.description == MANAGED and _of_job(mig.name, job_id):
                template = ours.get(mig.name)
                found.append(_machine(mig.name, zone, self._state(mig, zone, template), template))
        listed = {m.name for m in found}
        left = sorted({*ours, *(p.name for p in policies if _ours(p.name, p.description, zone, job_id))} - listed)
        return found + [_leftover(name, zone, ours.get(name)) for name in left]

    def _observe(self, name: str, zone: str, template: compute_v1.InstanceTemplate | None) -> Observed | None:
        """The slice observed; None without a MIG. `template`: the slice's, which says whether it is flex-start."""
        try:
            mig = self.migs.get(
                project=self.project, zone=zone, instance_group_manager=name, retry=self.retry, timeout=self.timeout
            )
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get slice {name} in {zone}") from e
        return self._state(mig, zone, template)

    def _state(
        self, mig: compute_v1.InstanceGroupManager, zone: str, template: compute_v1.InstanceTemplate | None
    ) -> Observed:
        """The MIG's state from its VMs; its template says whether it is flex-start."""
        flex = template is not None and template.properties.scheduling.provisioning_model == "FLEX_START"
        gpus = template is not None and bool(template.properties.guest_accelerators)
        what = f"get slice {mig.name} in {zone}"
        try:
            vms = list(
                self.migs.list_managed_instances(
                    project=self.project,
                    zone=zone,
                    instance_group_manager=mig.name,
                    retry=self.retry,
                    timeout=self.timeout,
                )
            )
        except gexc.NotFound:
            vms = []  # deleted since it was listed
        except Exception as e:
            raise classify(e, what) from e
        return slice_state(mig, vms, flex, topology=not gpus)

    def _template(self, name: str) -> compute_v1.InstanceTemplate | None:
        try:
            return self.templates.get(
                project=self.project, instance_template=name, retry=self.retry, timeout=self.timeout
            )
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get instance template {name}") from e

    def _policy(self, name: str, zone: str) -> compute_v1.ResourcePolicy | None:
        try:
            return self.policies.get(
                project=self.project,
                region=region_of(zone),
                resource_policy=name,
                retry=self.retry,
                timeout=self.timeout,
            )
        except gexc.NotFound:
            return None
        except Exception as e:
            raise classify(e, f"get workload policy {name}") from e


def _of_job(name: str, job_id: str | None) -> bool:
    parsed = parse_machine_name(name)
    return parsed is not None and (job_id is None or parsed[0] == job_id)


def _ours(name: str, text: str, zone: str, job_id: str | None) -> bool:
    """A template or policy of respawn's slice in `zone` (its description says so), of the job when one is given."""
    found = _DESCRIPTION.fullmatch(text)
    return found is not None and found.group(1) == zone and _of_job(name, job_id)


def _labels(template: compute_v1.InstanceTemplate | None) -> dict[str, str]:
    """The slice's labels are its VMs', from the template (a MIG has none of its own)."""
    return dict(template.properties.labels) if template is not None else {}


def _machine(name: str, zone: str, observed: Observed, template: compute_v1.InstanceTemplate | None) -> Machine:
    return Machine(name=name, zone=zone, state=observed.state, labels=_labels(template), detail=observed.detail)


def _leftover(name: str, zone: str, template: compute_v1.InstanceTemplate | None) -> Machine:
    what = "instance template" if template is not None else "workload policy"
    detail = f"the {what} of a slice whose MIG is gone"
    return Machine(name=name, zone=zone, state=MachineState.TERMINATED, labels=_labels(template), detail=detail)
