"""LogEntries as Cloud Logging would deliver them to the sink: trainer lifecycle lines and GCE system events."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import time
from typing import Any

TRAINER_LOG = "respawn-trainer"
SYSTEM_EVENT_LOG = "cloudaudit.googleapis.com%2Fsystem_event"
SEVERITY = {"failed": "ERROR", "stopped": "WARNING"}  # as the trainer's cloud sink writes them
_seq = itertools.count(1)


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def insert_id(prefix: str) -> str:
    return f"{prefix}{int(time.time() * 1e6):x}{next(_seq):04x}"


def instance_id(name: str) -> str:
    """A stable numeric id for a machine name, like GCE's 19-digit instance ids."""
    return str(int(hashlib.sha256(name.encode()).hexdigest()[:15], 16))


def tpu_worker_name(node: str, worker: int = 0) -> str:
    """The hidden GCE VM behind a TPU node's worker: `t1v-n-<8 hex>-w-<i>`."""
    return f"t1v-n-{hashlib.sha256(node.encode()).hexdigest()[:8]}-w-{worker}"


def trainer_entry(
    payload: dict[str, Any], *, project: str, zone: str, machine: str, job_id: str, attempt: int, now: float
) -> dict[str, Any]:
    """A lifecycle line of the trainer as google-cloud-logging writes it from the machine (structured entry)."""
    severity = SEVERITY.get(str(payload.get("event")), "INFO")
    return {
        "insertId": insert_id("t"),
        "jsonPayload": payload,
        "resource": {
            "type": "gce_instance",
            "labels": {"project_id": project, "instance_id": instance_id(machine), "zone": zone},
        },
        "timestamp": rfc3339(now),
        "severity": severity,
        "labels": {"respawn-job": job_id, "respawn-attempt": str(attempt)},
        "logName": f"projects/{project}/logs/{TRAINER_LOG}",
        "receiveTimestamp": rfc3339(now),
    }


HOST_EVENT_MESSAGES = {
    "compute.instances.preempted": "Instance was preempted.",
    "compute.instances.hostError": "Instance terminated by Compute Engine.",
    "compute.instances.terminateOnHostMaintenance": "Instance terminated during Compute Engine maintenance.",
}


def host_event_entry(*, method: str, project: str, zone: str, instance: str, now: float) -> dict[str, Any]:
    """A system event Compute Engine logs about a VM's host (`method`, one of HOST_EVENT_MESSAGES)."""
    if method not in HOST_EVENT_MESSAGES:
        raise ValueError(f"{method!r} is not a host event; allowed: {', '.join(HOST_EVENT_MESSAGES)}")
    op = f"systemevent-{int(now * 1000)}-{hashlib.sha256(instance.encode()).hexdigest()[:12]}"
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": HOST_EVENT_MESSAGES[method]},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/{project}/zones/{zone}/instances/{instance}",
            "request": {"@type": f"type.googleapis.com/{method}"},
        },
        "insertId": insert_id("p"),
        "resource": {
            "type": "gce_instance",
            "labels": {"project_id": project, "instance_id": instance_id(instance), "zone": zone},
        },
        "timestamp": rfc3339(now),
        "severity": "INFO",  # no labels: root_trigger_id belongs to API-call entries, not system events
        "logName": f"projects/{project}/logs/{SYSTEM_EVENT_LOG}",
        "operation": {"id": op, "producer": method, "first": True, "last": True},
        "receiveTimestamp": rfc3339(now),
    }


def preempted_entry(*, project: str, zone: str, instance: str, now: float) -> dict[str, Any]:
    """The `compute.instances.preempted` system event Compute Engine logs for a Spot/preemptible VM."""
    return host_event_entry(
        method="compute.instances.preempted", project=project, zone=zone, instance=instance, now=now
    )
