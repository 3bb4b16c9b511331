"""A MIG as the local Compute API shows it (the group, its managed instances) and as the local cloud sees it (one
machine whose workers are its VMs). Pure views of what the API holds: called with its lock held."""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from localcloud.apis.apicore import CloudMachine, gpus, rfc3339
from localcloud.apis.compute.common import COMPUTE, CREATING, instance_path, kind_of, url, vm_id
from localcloud.apis.compute.state import ComputeState, Mig
from localcloud.apis.offerings import TPU_MACHINE_TYPES

# InstanceGroupManagerActionsSummary's counters, and InstanceGroupManagerStatusInstanceStatusSummary's per status.
_ACTIONS = [
    "abandoning",
    "creating",
    "creatingWithoutRetries",
    "deleting",
    "none",
    "recreating",
    "refreshing",
    "restarting",
    "resuming",
    "starting",
    "stopping",
    "suspending",
    "verifying",
]
_STATUSES = [
    "DEPROVISIONING",
    "PENDING",
    "PENDING_STOP",
    "PROVISIONING",
    "REPAIRING",
    "RUNNING",
    "STAGING",
    "STOPPED",
    "STOPPING",
    "SUSPENDED",
    "SUSPENDING",
    "TERMINATED",
]
_STATUS_KEYS = {s: re.sub(r"_(.)", lambda m: m[1].upper(), s.lower()) for s in _STATUSES}  # PENDING_STOP: pendingStop
_STATUS_SUMMARY = (*_STATUS_KEYS.values(), "nonExistent")


def slice_of(mig: Mig) -> CloudMachine:
    """The MIG as one machine: its VMs are the workers; `state` is its topology state."""
    properties = mig.template.body["properties"]
    tpu = TPU_MACHINE_TYPES.get(mig.template.machine_type)
    metadata = {i["key"]: i.get("value", "") for i in (properties.get("metadata") or {}).get("items", [])}
    return CloudMachine(
        kind_of(mig.template.machine_type),
        mig.name,
        mig.zone,
        mig.project,
        dict(properties.get("labels") or {}),
        metadata,
        mig.topology_state,
        mig.created_at,
        properties,
        mig.deleted_at,
        api="compute",
        workers=tuple(mig.vms),
        chips_per_host=tpu.chips if tpu else gpus(properties) or 1,
    )


def managed_json(mig: Mig, name: str, state: ComputeState) -> dict[str, Any]:
    """A managed instance: the VM's status, or CREATING while it waits to be created. A VM lost for good (a
    Spot VM deleted on preemption) stays listed, with no status: the MIG repairs nothing."""
    m = state.vms.get((mig.project, mig.zone, name))
    link = f"{COMPUTE}/{instance_path(mig.project, mig.zone, name)}"
    item: dict[str, Any] = {"instance": link, "name": name, "version": {"instanceTemplate": url(mig.template.path)}}
    if m is None:
        item["currentAction"] = "CREATING" if mig.bulk_in_progress and name not in _lost(mig, state) else "NONE"
        return item
    item.update(id=vm_id(m), instanceStatus=m.state)
    item["currentAction"] = "CREATING" if m.state in CREATING else "NONE"
    return item


def _lost(mig: Mig, state: ComputeState) -> set[str]:
    """VMs that were created and are gone (deleted on preemption)."""
    made = {k[2] for k, g in state.managed.items() if g == mig.key}
    return {n for n in made if (mig.project, mig.zone, n) not in state.vms}


def mig_json(mig: Mig, state: ComputeState) -> dict[str, Any]:
    managed = [managed_json(mig, n, state) for n in mig.vms]
    creating = sum(1 for i in managed if i["currentAction"] == "CREATING")
    actions = dict.fromkeys(_ACTIONS, 0)
    actions.update(creating=creating, none=len(managed) - creating)
    statuses = dict.fromkeys(_STATUS_SUMMARY, 0)
    for item in managed:
        statuses[_STATUS_KEYS.get(item.get("instanceStatus", ""), "nonExistent")] += 1
    status: dict[str, Any] = {
        "isStable": creating == 0 and not mig.bulk_in_progress,
        "versionTarget": {"isReached": True},
        "stateful": {"hasStatefulConfig": False, "perInstanceConfigs": {"allEffective": True}},
        "bulkInstanceOperation": {"inProgress": mig.bulk_in_progress},
        "currentInstanceStatuses": statuses,
    }
    if mig.bulk_in_progress:
        check: dict[str, Any] = {"timestamp": rfc3339(time.time())}
        if mig.progress_error:
            check["error"] = copy.deepcopy(mig.progress_error)
        status["bulkInstanceOperation"]["lastProgressCheck"] = check
    if mig.policy is not None and mig.policy.topology:
        status["appliedAcceleratorTopologies"] = [
            {
                "acceleratorTopology": mig.policy.topology,
                "state": mig.topology_state,
                "stateDetails": {"timestamp": rfc3339(mig.topology_at)},
            }
        ]
    base = f"{COMPUTE}/projects/{mig.project}/zones/{mig.zone}"
    body = copy.deepcopy(mig.body)
    body.update(
        kind="compute#instanceGroupManager",
        id=str(mig.id),
        creationTimestamp=rfc3339(mig.created_at),
        zone=base,
        selfLink=f"{base}/instanceGroupManagers/{mig.name}",
        instanceGroup=f"{base}/instanceGroups/{mig.name}",
        instanceTemplate=url(mig.template.path),
        versions=[{"instanceTemplate": url(mig.template.path), "targetSize": {"calculated": mig.target_size}}],
        targetSize=mig.target_size,
        currentActions=actions,
        status=status,
        fingerprint="bG9jYWw=",
        listManagedInstancesResults="PAGELESS",
    )
    if mig.policy is not None:
        body["resourcePolicies"] = {"workloadPolicy": url(mig.policy.path)}
    return body
