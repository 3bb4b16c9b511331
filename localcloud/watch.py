"""What a local run shows as it goes: the API's calls and waits copied into the timeline as they happen
(`watch_calls`), and a job followed to its end (`follow`), with a note for each thing that happened and a progress
line (status, attempt, zone, step, loss)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.timeline import Timeline
from respawn.jobs import Job
from respawn.machine import SHUT_DOWN_RC

WAITING = "WAITING_FOR_CAPACITY"  # the timeline's `queued` state of a Compute Engine request in its zone's queue


@dataclass(frozen=True)
class Run:
    """What following a job needs: the run's timeline, where to say things, how long to follow and how often to
    print progress without a change."""

    timeline: Timeline
    say: Callable[[str], None]
    timeout_s: float
    progress_every_s: float


def watch_calls(server: CloudApiServer, timeline: Timeline, stack: contextlib.ExitStack) -> None:
    """Copy the API's create and delete calls, what waits for capacity and new machines into the timeline as
    they happen. A machine is CREATING from the moment it exists and waits for nothing: a TPU queued
    resource's node once provisioned, a Compute Engine flex-start instance or MIG once its zone's queue let it
    go (`server.waiting()`), so that the report's queue time is the wait for capacity."""
    stop = threading.Event()
    seen_calls = 0
    known: set[str] = set()  # machines recorded CREATING
    queued: dict[str, str] = {}  # queued resource or waiting machine -> its last state
    pending: set[str] = set()  # machines seen waiting and not yet CREATING

    def poll() -> None:
        nonlocal seen_calls
        calls = server.calls
        created = False
        for call in calls[seen_calls:]:
            if call.verb in ("create", "delete"):  # `what`: nodes, queuedResources, instanceGroupManagers ...
                where = {"machine": call.name, "zone": call.zone, "what": call.collection}
                timeline.add(f"{call.verb}_call", t=call.time, **where)
                created = created or call.verb == "create"
        seen_calls = len(calls)
        current = server.queued_resources()
        for q in current:
            if queued.get(q.name) != q.state:
                queued[q.name] = q.state
                timeline.add("queued", machine=q.name, zone=q.zone, state=q.state)
        waiting = dict(server.waiting())
        for name, zone in waiting.items():
            if name not in known and queued.get(name) != WAITING:
                queued[name] = WAITING
                pending.add(name)
                timeline.add("queued", machine=name, zone=zone, state=WAITING)
        # a node appears with its create call (the API records both under one lock), when its queued resource
        # is provisioned, or when the zone's queue lets a waiting machine go
        if not created and not pending and all(q.name in known for q in current):
            return
        machines = server.machines()
        waiting = dict(server.waiting())  # read after the machines: a machine listed that waits is in it
        for m in machines:
            if m.name in known or m.name in waiting:
                continue
            known.add(m.name)
            waited = m.name in pending
            pending.discard(m.name)
            since = time.time() if waited else m.created_at
            timeline.add("state", t=since, machine=m.name, zone=m.zone, state="CREATING")
        pending.intersection_update(waiting)  # deleted while waiting: nothing comes of it

    def loop() -> None:
        while not stop.wait(0.02):
            poll()
        poll()

    thread = threading.Thread(target=loop, name="api-watch", daemon=True)
    thread.start()
    stack.callback(thread.join, 5)
    stack.callback(stop.set)


def follow(run: Run, store: Any, job_id: str, t0: float, total: int | None) -> tuple[dict[str, Any] | None, bool]:
    """Print live progress until the job is terminal or the timeout; returns (final record, timed out)."""
    deadline = time.time() + run.timeout_s
    last_key, last_print, shown = None, 0.0, 0
    job: Job | None = None
    problem = ""
    while time.time() < deadline:
        try:
            job, _ = store.load(job_id)
        except Exception as e:  # unreadable (a missing record is None): say why, once per distinct error
            error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if error != problem:
                run.say(f"cannot read the job record: {error}")
                problem = error
        events = run.timeline.events()
        for event in events[shown:]:
            note = _note(event, t0)
            if note:
                run.say(note)
        shown = len(events)
        key = _progress_key(job)
        now = time.time()
        if key != last_key or now - last_print >= run.progress_every_s:
            run.say(f"[{now - t0:7.1f}s] {_progress_line(job, run.timeline.last('step'), total)}")
            last_key, last_print = key, now
        if job is not None and job.status.terminal:
            return job.to_dict(), False
        time.sleep(0.25)
    run.say(f"timed out after {run.timeout_s:.0f}s")
    return (job.to_dict() if job else None), True


def _note(e: dict[str, Any], t0: float) -> str | None:
    at = f"[{e['t'] - t0:7.1f}s]"
    kind = e["kind"]
    if kind == "create_call":
        return f"{at} cloud: create {_object(e.get('what'))} {e['machine']} in {e['zone']}"
    if kind == "queued" and e["state"] == WAITING:
        return f"{at} cloud: {e['machine']} waits for capacity in {e['zone']}"
    if kind == "state" and e["state"] == "READY":
        return f"{at} cloud: {e['machine']} READY; trainer starting"
    if kind == "notice" and "worker" in e:  # one VM of a Compute Engine slice
        return (
            f"{at} chaos: preempting VM {e['instance']} (worker {e['worker']}) of {e['machine']} (SIGTERM to its "
            "worker, grace period running)"
        )
    if kind == "notice":
        return f"{at} chaos: preempting {e['machine']} (SIGTERM, grace period running)"
    if kind == "preempted":
        on = ", ".join(e.get("instances") or [e["instance"]])
        return f"{at} cloud: {e['machine']} PREEMPTED; system event on {on} sent to the log router"
    if kind == "deleted":
        return f"{at} cloud: {e['machine']} deleted"
    if kind == "kill_worker":
        return f"{at} chaos: SIGKILL to worker {e['worker']} of {e['machine']} (no notice)"
    if kind == "hang_worker":
        return f"{at} chaos: SIGSTOP to worker {e['worker']} of {e['machine']} (hung: alive, no progress)"
    if kind == "host_error":
        return (
            f"{at} chaos: host error on worker {e['worker']} of {e['machine']}: node TERMINATED, system event on "
            f"{e['instance']} sent to the log router, the worker killed"
        )
    if kind == "trainer_exit" and e["code"] not in (0, SHUT_DOWN_RC, -signal.SIGTERM):  # preempted or deleted
        worker = f" worker {e['worker']}" if "worker" in e else ""
        return f"{at} trainer on {e['machine']}{worker} exited with code {e['code']}"
    if kind == "entry" and e["payload"].get("event") in ("started", "stopped", "completed", "failed"):
        p = e["payload"]
        detail = {k: p[k] for k in ("step", "restored_step", "worker", "error") if p.get(k) is not None}
        return f"{at} trainer {e['machine']}: {p['event']} {json.dumps(detail)}"
    return None


# The objects an attempt creates, as a person names them (the API's collection -> its noun).
_OBJECTS = {
    "nodes": "TPU node",
    "queuedResources": "queued resource",
    "instances": "instance",
    "resourcePolicies": "workload policy",
    "instanceTemplates": "instance template",
    "instanceGroupManagers": "MIG",
    "resizeRequests": "resize request",
}


def _object(collection: str | None) -> str:
    return _OBJECTS.get(collection or "", "machine")


def _progress_key(job: Job | None) -> tuple[Any, ...] | None:
    """A progress line is printed when this changes, else every few seconds."""
    if job is None:
        return None
    return job.status, job.current.n if job.current else None, job.counters.preemptions, job.counters.failures


def _progress_line(job: Job | None, step: dict[str, Any] | None, total: int | None) -> str:
    if job is None:
        return "waiting for the job record"
    current = job.current
    parts = [f"{job.status.value:<12}"]
    if current is not None:
        parts.append(f"attempt {current.n} {current.zone}")
    if step is not None:
        parts.append(f"step {step['step']}" + (f"/{total}" if total else ""))
        if step.get("loss") is not None:
            parts.append(f"loss {step['loss']:.4f}")
    if job.counters.preemptions:
        parts.append(f"preemptions {job.counters.preemptions}")
    if job.counters.failures:
        parts.append(f"failures {job.counters.failures}")
    return "  ".join(parts)
