"""Deliveries -> typed events (SPEC 3.2). Pure; never raises on bad input.

Envelopes: the Eventarc CloudEvent (`google.cloud.pubsub.topic.v1.messagePublished`) and the raw Pub/Sub push body
both wrap one Pub/Sub message. A message on `respawn-jobs` becomes JobSubmitted / CancelRequested / JobRejected; a
message on `respawn-events` holds a LogEntry (from the log sink) or a sweep tick. Anything else is Ignored(reason).

Machine events come from Cloud Audit Logs: Compute Engine's system events on a VM (preempted, host error, host
maintenance), and the Cloud TPU API's `tpu.nodes.terminate` on a node (Google's own termination of a node, e.g. a
Spot preemption: marin-community/marin docs/dev-guide/tpu_observability.md; which audit log carries it is not
documented, so the system event and the admin activity log are both read).

Event ids (for de-duplication): the Pub/Sub message id for job messages and sweep ticks, `log:INSERT_ID` for log
entries (Cloud Logging treats entries with the same insertId and timestamp as one entry).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from respawn.accounting import parse_split
from respawn.events import (
    CancelRequested,
    CheckpointSaved,
    Event,
    Ignored,
    JobRejected,
    JobSubmitted,
    MachineNoticed,
    MachinePreempted,
    ResultSource,
    SweepTicked,
    TrainerCompleted,
    TrainerFailed,
    TrainerProgressed,
    TrainerReady,
    TrainerStarted,
    ZoneWokeUp,
)
from respawn.jobs import parse_instance_name, parse_machine_name
from respawn.machine import TRAINER_LOG
from respawn.spec import JOB_ID_RE, ZONE_RE, CancelRequest, SpecError, one_line, parse_job_message, show

SYSTEM_EVENT_LOGS = ("/logs/cloudaudit.googleapis.com%2Fsystem_event", "/logs/cloudaudit.googleapis.com/system_event")
ACTIVITY_LOGS = ("/logs/cloudaudit.googleapis.com%2Factivity", "/logs/cloudaudit.googleapis.com/activity")
NODE_TERMINATED = "tpu.nodes.terminate"
HOST_EVENTS = {
    "compute.instances.preempted": "preempted",
    "compute.instances.hostError": "hostError",
    "compute.instances.terminateOnHostMaintenance": "terminateOnHostMaintenance",
}
# the lifecycle entries of log TRAINER_LOG: the trainer's own and its startup script's, and (notice) the shutdown
# script's as the preemption notice comes
TRAINER_EVENTS = ("started", "checkpoint", "progress", "completed", "failed", "stopped", "notice", "ready")
SWEEP_TICK = "sweep_tick"
RESOURCE_NAME_RE = re.compile(r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)")
TPU_WORKER_RE = re.compile(r"t1v-n-[0-9a-f]+-w-[0-9]+")
# a Cloud TPU node, as an audit entry's resourceName names it (with or without the service's `//tpu.googleapis.com/`)
NODE_NAME_RE = re.compile(r"(?://tpu\.googleapis\.com/)?projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)")
MAX_DATA_BYTES = 1024 * 1024


@dataclass(frozen=True)
class PubSubMessage:
    """One Pub/Sub message. `problem` says why the envelope could not be read (then data is empty)."""

    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    message_id: str = ""
    publish_time: float = 0.0
    problem: str = ""


# ---------------------------------------------------------------------------- envelopes


def rfc3339(value: Any) -> float | None:
    """'2024-05-01T12:00:00.123456789Z' -> seconds since the epoch; None when it is not a timestamp."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", value)
    if not m:
        return None
    try:
        whole = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    except ValueError:
        return None
    return whole.timestamp() + (int(m.group(2).ljust(9, "0")) / 1e9 if m.group(2) else 0.0)


def _message(body: Any, fallback_id: str = "", fallback_time: float = 0.0) -> PubSubMessage:
    """{"message": {...}, "subscription": ...} (push body / Eventarc data) -> PubSubMessage."""
    msg = body.get("message") if isinstance(body, dict) else None
    if not isinstance(msg, dict):
        return PubSubMessage(b"", {}, fallback_id, fallback_time, "the envelope has no message object")
    return _pubsub_message(msg, fallback_id, fallback_time)


def _pubsub_message(msg: dict[str, Any], fallback_id: str = "", fallback_time: float = 0.0) -> PubSubMessage:
    """A PubsubMessage in its REST JSON form (data base64) -> PubSubMessage."""
    message_id = msg.get("messageId", msg.get("message_id", fallback_id))
    message_id = message_id if isinstance(message_id, str) else fallback_id
    published = rfc3339(msg.get("publishTime", msg.get("publish_time")))
    publish_time = published if published is not None else fallback_time
    raw_attrs = msg.get("attributes") or {}
    attributes = (
        {str(k): str(v) for k, v in raw_attrs.items() if isinstance(v, str)} if isinstance(raw_attrs, dict) else {}
    )
    encoded = msg.get("data", "")
    if not isinstance(encoded, str) or len(encoded) > MAX_DATA_BYTES * 4 // 3 + 4:
        return PubSubMessage(b"", attributes, message_id, publish_time, "message data is not a base64 string")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return PubSubMessage(b"", attributes, message_id, publish_time, "message data is not valid base64")
    return PubSubMessage(data, attributes, message_id, publish_time)


def message_from_push(body: Any) -> PubSubMessage:
    """A raw Pub/Sub push body {"message": {...}, "subscription": ...} -> PubSubMessage (never raises)."""
    return _message(body)


def message_from_cloudevent(cloud_event: Any) -> PubSubMessage:
    """An Eventarc messagePublished CloudEvent (cloudevents.http.CloudEvent or its structured JSON dict)."""
    try:
        if isinstance(cloud_event, dict):
            data, ce_id, ce_time = cloud_event.get("data"), cloud_event.get("id"), cloud_event.get("time")
        else:
            data, ce_id, ce_time = cloud_event.data, cloud_event.get("id"), cloud_event.get("time")
    except (AttributeError, TypeError, KeyError):
        return PubSubMessage(b"", problem="not a CloudEvent")
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            data = None
    fallback_id = ce_id if isinstance(ce_id, str) else ""
    return _message(data, fallback_id, rfc3339(ce_time) or 0.0)


# ---------------------------------------------------------------------------- job messages


def job_event(
    msg: PubSubMessage, default_images: Mapping[str, str] | None = None
) -> JobSubmitted | CancelRequested | JobRejected:
    """A message on respawn-jobs -> JobSubmitted, CancelRequested or JobRejected (never raises). A submit without
    `image` runs `default_images[kind]`, the deployment's trainer image of its machine's kind (Settings)."""
    event_id, when = msg.message_id or _digest(msg.data), msg.publish_time
    if msg.problem:
        return JobRejected(event_id, when, None, f"job message: {msg.problem}")
    try:
        parsed = parse_job_message(msg.data, default_images)
    except SpecError as e:
        return JobRejected(event_id, when, _usable_job_id(msg.data), str(e))
    except Exception as e:  # a defect, not the sender's fault; still never a redelivery storm
        return JobRejected(event_id, when, _usable_job_id(msg.data), f"job message: unreadable ({type(e).__name__})")
    if isinstance(parsed, CancelRequest):
        return CancelRequested(event_id, when, parsed.job_id)
    return JobSubmitted(event_id, when, parsed)


def _usable_job_id(data: bytes) -> str | None:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    job_id = obj.get("job_id") if isinstance(obj, dict) else None
    return job_id if isinstance(job_id, str) and JOB_ID_RE.fullmatch(job_id) else None


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:32]


# ---------------------------------------------------------------------------- events topic


def events_event(msg: PubSubMessage) -> Event:
    """A message on respawn-events: a LogEntry from the sink or a sweep tick; else Ignored (never raises)."""
    if msg.problem:
        return Ignored(msg.problem)
    try:
        obj = json.loads(msg.data)
    except (ValueError, RecursionError):
        return Ignored("message data is not JSON")
    if isinstance(obj, dict) and obj.get("kind") == SWEEP_TICK:
        return SweepTicked(msg.message_id or _digest(msg.data), msg.publish_time)
    if isinstance(obj, dict) and "logName" in obj:
        return log_entry_event(obj)
    return Ignored("message is neither a LogEntry nor a sweep tick")


def log_entry_event(entry: Any) -> Event:
    """A LogEntry (JSON dict) -> MachinePreempted / ZoneWokeUp / Trainer* / CheckpointSaved / MachineNoticed, else
    Ignored."""
    try:
        return _log_entry_event(entry)
    except Exception as e:  # a defect must not turn one odd entry into endless redelivery
        return Ignored(f"unreadable log entry ({type(e).__name__})")


def _log_entry_event(entry: Any) -> Event:
    if not isinstance(entry, dict):
        return Ignored("a log entry must be a JSON object")
    log_name = entry.get("logName")
    if not isinstance(log_name, str):
        return Ignored("log entry has no logName")
    when = rfc3339(entry.get("timestamp"))
    when = when if when is not None else rfc3339(entry.get("receiveTimestamp"))
    if when is None:
        return Ignored("log entry has no valid timestamp")
    insert_id = entry.get("insertId")
    event_id = f"log:{insert_id}" if isinstance(insert_id, str) and insert_id else "log:" + _digest(_canonical(entry))
    if log_name.endswith(SYSTEM_EVENT_LOGS + ACTIVITY_LOGS) and _method(entry) == NODE_TERMINATED:
        return _node_terminated(entry, event_id, when)
    if log_name.endswith(SYSTEM_EVENT_LOGS):
        return _system_event(entry, event_id, when)
    if log_name.endswith(f"/logs/{TRAINER_LOG}"):
        return _trainer_entry(entry, event_id, when)
    return Ignored(
        f"log {show(log_name.rpartition('/logs/')[2])} is neither a GCE system event, a TPU node's termination nor "
        f"{TRAINER_LOG}"
    )


def _canonical(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str).encode()


def _object_at(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """parent[key] when it is a JSON object, else an empty one: a missing or odd field reads as empty."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _method(entry: dict[str, Any]) -> Any:
    return _object_at(entry, "protoPayload").get("methodName")


def _node_terminated(entry: dict[str, Any], event_id: str, when: float) -> Event:
    """`tpu.nodes.terminate` on node `projects/P/locations/Z/nodes/JOB-aN`: attempt N of JOB lost its machine, for
    whatever reason the entry gives (`metadata.terminateReason`, kept as the cause; none is read as a plain
    termination). The resource (`audited_resource`) is read only for its project."""
    payload = _object_at(entry, "protoPayload")
    node = NODE_NAME_RE.fullmatch(str(payload.get("resourceName", "")))
    if not node:
        return Ignored(f"resourceName {show(payload.get('resourceName'))} does not name a TPU node")
    project_id = _object_at(_object_at(entry, "resource"), "labels").get("project_id")
    project = project_id if isinstance(project_id, str) and project_id else node.group(1)
    zone, name = node.group(2), node.group(3)
    if not ZONE_RE.fullmatch(zone):
        return Ignored(f"zone {show(zone)} is not a zone")
    parsed = parse_machine_name(name)
    if parsed is None or not JOB_ID_RE.fullmatch(parsed[0]):
        return Ignored(f"TPU node {show(name)} is not a respawn machine")
    reason = _object_at(payload, "metadata").get("terminateReason")
    cause = f"terminate: {one_line(reason, 100)}" if isinstance(reason, str) and reason else "terminate"
    return MachinePreempted(event_id, when, parsed[0], parsed[1], name, zone, project, cause)


def _system_event(entry: dict[str, Any], event_id: str, when: float) -> Event:
    """A Compute Engine system event on a VM, read from `protoPayload.resourceName` alone: an entry about a TPU
    worker VM may have no `resource` block (Google's TPU maintenance example,
    https://cloud.google.com/tpu/docs/view-maintenance-notifications) or another resource type, so the resource is
    read only for its project."""
    resource = _object_at(entry, "resource")
    payload = _object_at(entry, "protoPayload")
    method = payload.get("methodName")
    cause = HOST_EVENTS.get(method) if isinstance(method, str) else None
    if cause is None:
        return Ignored(f"method {show(method)} is not a preemption or host event")
    instance_name = RESOURCE_NAME_RE.fullmatch(str(payload.get("resourceName", "")))
    if not instance_name:
        return Ignored(f"resourceName {show(payload.get('resourceName'))} does not name an instance")
    project_id = _object_at(resource, "labels").get("project_id")
    project = project_id if isinstance(project_id, str) and project_id else instance_name.group(1)
    zone, instance = instance_name.group(2), instance_name.group(3)
    if not ZONE_RE.fullmatch(zone):
        return Ignored(f"zone {show(zone)} is not a zone")
    if TPU_WORKER_RE.fullmatch(instance):
        return ZoneWokeUp(event_id, when, zone, project, instance, cause)
    # a GPU VM or single-host TPU VM is named JOB-aN; a VM of a slice's MIG JOB-aN-w-x7k2: either is attempt N's
    parsed = parse_instance_name(instance)
    if parsed is None or not JOB_ID_RE.fullmatch(parsed[0]):
        return Ignored(f"instance {show(instance)} is not a respawn machine")
    job_id, attempt = parsed
    return MachinePreempted(event_id, when, job_id, attempt, instance, zone, project, cause)


def _trainer_entry(entry: dict[str, Any], event_id: str, when: float) -> Event:
    payload = entry.get("jsonPayload")
    if not isinstance(payload, dict):
        return Ignored(f"{TRAINER_LOG} entry has no jsonPayload")
    kind = payload.get("event")
    if kind not in TRAINER_EVENTS:
        return Ignored(f"trainer event {show(kind)} is not one of {', '.join(TRAINER_EVENTS)}")
    job_id = payload.get("job_id")
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        return Ignored(f"trainer entry job_id {show(job_id)} is not a job id")
    attempt = _as_int(payload.get("attempt"))
    if attempt is None or attempt < 1:
        return Ignored(f"trainer entry attempt {show(payload.get('attempt'))} is not a positive integer")
    step = _as_int(payload.get("step"))
    if payload.get("step") is not None and (step is None or step < 0):
        return Ignored(f"trainer entry step {show(payload.get('step'))} is not a non-negative integer")
    split = parse_split(payload.get("goodput"))
    if kind == "started":
        restored = _as_int(payload.get("restored_step"))
        startup = payload.get("startup_s")
        startup_s = float(startup) if isinstance(startup, (int, float)) and not isinstance(startup, bool) else None
        return TrainerStarted(event_id, when, job_id, attempt, restored, startup_s)
    if kind in ("checkpoint", "stopped"):
        if step is None:
            return Ignored(f"trainer {kind} entry has no step")
        return CheckpointSaved(event_id, when, job_id, attempt, step, split, final=kind == "stopped")
    if kind == "progress":
        if step is None:
            return Ignored("trainer progress entry has no step")
        return TrainerProgressed(event_id, when, job_id, attempt, step)
    if kind == "completed":
        if payload.get("source") == ResultSource.EXIT_CODE:  # the startup script's: it knows only the exit code
            return TrainerCompleted(event_id, when, job_id, attempt, step, source=ResultSource.EXIT_CODE)
        result = {k: payload[k] for k in ("final_loss", "params_sha256", "goodput") if k in payload}
        kept = payload.get("final_weights")  # where the final checkpoint outlives the bucket's retention
        if isinstance(kept, str) and kept.startswith(("gs://", "/")) and len(kept) <= 1024:
            result["final_weights"] = kept
        return TrainerCompleted(event_id, when, job_id, attempt, step, result, split)
    worker = _as_int(payload.get("worker"))
    worker = worker if worker is not None and worker >= 0 else None
    if kind == "notice":  # the shutdown script's, on the worker VM the notice reached
        return MachineNoticed(event_id, when, job_id, attempt, worker)
    world = _as_int(payload.get("world"))
    if kind == "ready":  # the trainer's, on a slice's machine the world has not taken in yet
        return TrainerReady(event_id, when, job_id, attempt, world)
    error = payload.get("error")
    text = error if isinstance(error, str) else show(error, 500)
    permanent = payload.get("permanent") is True
    source = ResultSource.EXIT_CODE if payload.get("source") == ResultSource.EXIT_CODE else ResultSource.TRAINER
    return TrainerFailed(
        event_id, when, job_id, attempt, text, worker, goodput=split, permanent=permanent, source=source, world=world
    )


def _as_int(value: Any) -> int | None:
    """The value as an integer, also from a JSON number like 5.0 (Cloud Logging stores jsonPayload numbers as
    doubles); None when it is not a whole number (a bool is not a number here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return None


# ---------------------------------------------------------------------------- files and JSON


def event_from_file(text: str) -> Event:
    """A LogEntry, a Pub/Sub message, a push body, a CloudEvent (structured JSON) or a job message -> event.

    A one-element JSON list (what `gcloud logging read --format=json` prints) is unwrapped. Never raises.
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return Ignored(f"not JSON: {one_line(str(e))}")
    if isinstance(obj, list):
        if len(obj) != 1:
            return Ignored(f"the file holds a list of {len(obj)} items; give one entry or message")
        obj = obj[0]
    if not isinstance(obj, dict):
        return Ignored("the file does not hold a JSON object")
    if "specversion" in obj:
        return _from_message(message_from_cloudevent(obj))
    if isinstance(obj.get("message"), dict):
        return _from_message(message_from_push(obj))
    if "data" in obj and ("messageId" in obj or "message_id" in obj or "attributes" in obj):
        return _from_message(_pubsub_message(obj))
    if "logName" in obj:
        return log_entry_event(obj)
    if "action" in obj:
        return job_event(PubSubMessage(text.encode("utf-8", "surrogatepass")))
    if obj.get("kind") == SWEEP_TICK:
        return SweepTicked(_digest(text.encode("utf-8", "surrogatepass")), 0.0)
    return Ignored("not a LogEntry, Pub/Sub message, push body, CloudEvent or job message")


def _from_message(msg: PubSubMessage) -> Event:
    """A message whose topic is unknown: job messages carry "action"; the rest go to the events parser."""
    try:
        obj = json.loads(msg.data)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict) and "action" in obj:
        return job_event(msg)
    return events_event(msg)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def event_to_json(event: Event) -> dict[str, Any]:
    """{"kind": "machine_preempted", ...fields} or {"kind": "ignored", "reason": ...}. Env values are redacted."""
    out: dict[str, Any] = {"kind": _snake(type(event).__name__), **_jsonable(event)}
    if isinstance(event, JobSubmitted):
        out["spec"] = event.spec.to_dict()
        out["spec"]["env"] = {k: "<redacted>" for k, _ in event.spec.env}
    return out
