"""Per-event handling cost of the functions: parse + decide + store (GcsJobStore on fake-gcs-server).

Each event is what a function receives: an Eventarc CloudEvent (as a dict)
wrapping a Pub/Sub message whose data is a job message or a LogEntry built from
the captured payloads in tests/data. It is unwrapped and parsed by
respawn.parsing and handled by the real Service with the real GcsJobStore
(records over the GCS JSON API, listing through google-cloud-storage) against
fake-gcs-server (memory backend by default, so the server's disk is not what is
measured); machines are an in-memory fake (this measures the function, not the
cloud API).

fake-gcs-server's memory backend scans a bucket's objects on every request: its
CPU per write grows from 0.40 ms with 1 object in the bucket to 0.76 ms with
200 and 1.36 ms with 1,000 (this machine), where GCS's does not grow. So that
the figures measure the function rather than that scan, a run's jobs are spread
over buckets of `--jobs-per-bucket` records (a Service each, as a deployment
per bucket has), still interleaved; `events_per_s_one_bucket` is the same
single-thread run with every record in one bucket. `cpu_ms_per_event` is the
CPU this process spent per event in the single-thread run (parse, decide, the
store's calls), `server_cpu_ms_per_event` what the emulator spent.

The mix, per job: submit, trainer started, checkpoints, a preemption of a GPU
VM (delete + create), the next attempt's started and checkpoints, completion
(delete); plus duplicate deliveries and log entries that are ignored. Jobs are
interleaved. A TPU worker wake-up and a sweep tick read every job record, so
they are measured separately (they scale with the number of jobs, not events).

First one thread (latency without queueing), then a small pool of threads in
this process (throughput: a function instance handles concurrent requests).
Last line: {"p50_ms", "p99_ms", "events_per_s", ...}; p50/p99 come from the
single-thread run, events_per_s is the better of the two runs (both reported).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localcloud.services.emulators import FakeGcs, patched_env
from respawn import bootstrap, parsing
from respawn.actions import CreateMachine
from respawn.adapters.clock import SystemClock
from respawn.deployment import Settings
from respawn.events import Event
from respawn.jobs import LABEL_JOB, JobSpec, MachineState
from respawn.ports import Machine
from respawn.service import Retryable, Service

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
PROJECT = "ml-research-4821"
ZONES = ("us-central1-a", "us-west4-a")


class InstantProvider:
    """Machines in a dict: creates and deletes succeed at once (the cloud API is not what is measured)."""

    def __init__(self) -> None:
        self.machines: dict[str, Machine] = {}
        self.lock = threading.Lock()

    def create(self, action: CreateMachine, spec: JobSpec) -> None:
        with self.lock:
            labels = {LABEL_JOB: action.job_id}
            self.machines.setdefault(action.machine, Machine(action.machine, action.zone, MachineState.READY, labels))

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        with self.lock:
            self.machines.pop(name, None)

    def get(self, name: str, zone: str, spec: JobSpec | None = None) -> Machine | None:
        return self.machines.get(name)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        with self.lock:
            return [m for m in self.machines.values() if m.zone == zone and job_id in (None, m.labels[LABEL_JOB])]


# ---- the event mix -------------------------------------------------------------------------------------------------


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1_000_000:06d}Z"


def cloudevent(body: dict[str, Any], topic: str) -> dict[str, Any]:
    """A structured CloudEvent as Eventarc delivers a Pub/Sub message to a function."""
    mid, now = str(random.getrandbits(53)), rfc3339(time.time())
    message = {"data": base64.b64encode(json.dumps(body).encode()).decode(), "messageId": mid, "publishTime": now}
    return {
        "specversion": "1.0",
        "id": mid,
        "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "time": now,
        "data": {"message": message, "subscription": f"projects/{PROJECT}/subscriptions/{topic}-sub"},
    }


def template(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())  # type: ignore[no-any-return]


def log_entry(base: dict[str, Any]) -> dict[str, Any]:
    entry = json.loads(json.dumps(base))
    entry["insertId"] = uuid.uuid4().hex[:14]
    entry["timestamp"] = entry["receiveTimestamp"] = rfc3339(time.time())
    return entry


def trainer(kind: str, job_id: str, attempt: int, **payload: Any) -> dict[str, Any]:
    entry = log_entry(template(f"logentry_trainer_{kind}.json"))
    entry["jsonPayload"] = {"event": kind, "job_id": job_id, "attempt": attempt, "step": 0, **payload}
    entry["labels"] = {"respawn-job": job_id, "respawn-attempt": str(attempt)}
    return entry


def preempted(machine: str, zone: str) -> dict[str, Any]:
    entry = log_entry(template("logentry_gce_preempted.json"))
    entry["protoPayload"]["resourceName"] = f"projects/{PROJECT}/zones/{zone}/instances/{machine}"
    entry["resource"]["labels"]["zone"] = zone
    return entry


def job_message(job_id: str) -> dict[str, Any]:
    message = json.loads((DATA / "job_gpu.json").read_text())
    message.update(job_id=job_id, zones=list(ZONES), checkpoint_uri=f"gs://{PROJECT}-ckpt/runs/{job_id}")
    return message


Delivery = tuple[str, str, dict[str, Any]]  # (label, topic, CloudEvent)


def job_events(job_id: str, rng: random.Random, checkpoints: int) -> list[Delivery]:
    """One job's deliveries in order: a preempted run and its recovery, with duplicates and noise."""
    ev = "respawn-events"
    out: list[Delivery] = [("submit", "respawn-jobs", cloudevent(job_message(job_id), "respawn-jobs"))]
    out.append(("started", ev, cloudevent(trainer("started", job_id, 1, restored_step=None, startup_s=30.0), ev)))
    out += [
        ("checkpoint", ev, cloudevent(trainer("checkpoint", job_id, 1, step=100 * s, blocking_s=0.2, total_s=3.0), ev))
        for s in range(1, checkpoints + 1)
    ]
    out.append(("preempted", ev, cloudevent(preempted(f"{job_id}-a1", ZONES[0]), ev)))
    out.append(("started", ev, cloudevent(trainer("started", job_id, 2, restored_step=100 * checkpoints), ev)))
    out += [
        ("checkpoint", ev, cloudevent(trainer("checkpoint", job_id, 2, step=100 * s, blocking_s=0.2, total_s=3.0), ev))
        for s in range(checkpoints + 1, 2 * checkpoints + 1)
    ]
    done = trainer("completed", job_id, 2, step=200 * checkpoints, final_loss=1.5, params_sha256="0" * 64)
    out.append(("completed", ev, cloudevent(done, ev)))
    noise = log_entry(template("logentry_other_method.json"))
    out.insert(rng.randrange(1, len(out)), ("ignored", ev, cloudevent(noise, ev)))
    for _ in range(max(1, len(out) // 10)):  # ~10% duplicate deliveries (same data, a new message id)
        i = rng.randrange(1, len(out))
        _, topic, ce = out[i]
        data = json.loads(base64.b64decode(ce["data"]["message"]["data"]))
        out.insert(i + 1, ("duplicate", topic, cloudevent(data, topic)))
    return out


Routed = tuple[Service, str, str, dict[str, Any]]  # (the service of the job's bucket, label, topic, CloudEvent)


def interleave(per_job: list[list[Routed]]) -> list[Routed]:
    """Round-robin over the jobs, each job's own deliveries in order."""
    out: list[Routed] = []
    for i in range(max(len(x) for x in per_job)):
        out += [x[i] for x in per_job if i < len(x)]
    return out


# ---- measuring -----------------------------------------------------------------------------------------------------


def parse(topic: str, ce: dict[str, Any]) -> Event:
    msg = parsing.message_from_cloudevent(ce)
    return parsing.job_event(msg) if topic == "respawn-jobs" else parsing.events_event(msg)


def handle(service: Service, topic: str, ce: dict[str, Any]) -> tuple[float, str]:
    """Parse and handle one delivery; returns (seconds, result). Retryable is redelivered (counted in the time)."""
    start = time.perf_counter()
    for _ in range(20):
        try:
            result = service.handle(parse(topic, ce)).result
            return time.perf_counter() - start, result
        except Retryable:
            continue
    raise RuntimeError("an event stayed Retryable")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# What each kind of delivery must come to, or the run measured another path than the one it names (a job whose
# machines cannot be created fails at once, and every later event of it is a no-op that costs a fresh read).
EXPECTED = {
    "submit": {"applied"},
    "started": {"applied"},
    "checkpoint": {"applied"},
    "preempted": {"applied"},
    "completed": {"applied"},
    "duplicate": {"duplicate", "ignored"},  # a duplicate of the noise entry is ignored like the noise
    "ignored": {"ignored"},
}


def check_results(results: dict[str, set[str]]) -> None:
    """Stop the benchmark when a delivery came to anything but what the mix is meant to exercise."""
    wrong = {label: sorted(got - EXPECTED[label]) for label, got in results.items() if not got <= EXPECTED[label]}
    if wrong:
        raise SystemExit(f"the event mix did not do what it measures: {wrong} (expected {EXPECTED})")


def run(
    services: list[Service], per_job: list[list[Delivery]], workers: int
) -> tuple[list[float], dict[str, list[float]], float]:
    """Handle every delivery, the jobs spread evenly over `services` (one per bucket); each job's deliveries in order
    on one worker. Returns latencies, by label, wall time. Stops when a delivery came to something else than the mix
    means it to (check_results)."""
    latencies: list[float] = []
    by_label: dict[str, list[float]] = {}
    results: dict[str, set[str]] = {}
    lock = threading.Lock()

    def work(jobs: list[list[Routed]]) -> None:
        for service, label, topic, ce in interleave(jobs):
            seconds, result = handle(service, topic, ce)
            with lock:
                latencies.append(seconds)
                by_label.setdefault(label, []).append(seconds)
                results.setdefault(label, set()).add(str(result))

    routed = [[(services[i * len(services) // len(per_job)], *d) for d in job] for i, job in enumerate(per_job)]
    shards = [routed[i::workers] for i in range(workers)]
    start = time.perf_counter()
    if workers == 1:
        work(shards[0])
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, shards))
    wall = time.perf_counter() - start
    check_results(results)
    return latencies, by_label, wall


def server_cpu(gcs: FakeGcs) -> float:
    """Seconds of CPU the fake-gcs-server process has used so far (Linux /proc)."""
    assert gcs.proc is not None
    fields = Path(f"/proc/{gcs.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def report(name: str, latencies: list[float], wall: float) -> dict[str, float]:
    ms = [x * 1000 for x in latencies]
    figures = {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "events_per_s": round(len(ms) / wall, 1),
    }
    print(f"{name}: {len(ms)} events in {wall:.1f} s: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs per run")
    ap.add_argument("--jobs-per-bucket", type=int, default=25, help="job records per bucket (the module docstring)")
    ap.add_argument("--checkpoints", type=int, default=4, help="checkpoint entries per attempt")
    ap.add_argument("--workers", type=int, default=4, help="threads for the throughput run")
    ap.add_argument("--backend", choices=("memory", "filesystem"), default="memory", help="fake-gcs-server storage")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    with FakeGcs(backend=args.backend) as gcs, patched_env(gcs.env()):
        print(f"fake-gcs-server at {gcs.url} ({args.backend} backend)")

        def fresh_service() -> Service:
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            gcs.create_bucket(bucket)
            store = bootstrap.job_store(Settings(state_bucket=bucket), in_functions=True)  # as deployed
            return Service(store, {"compute": InstantProvider()}, SystemClock())  # a GPU's API: Compute Engine

        def fresh_services() -> list[Service]:
            return [fresh_service() for _ in range(-(-args.jobs // args.jobs_per_bucket))]

        def mix(prefix: str) -> list[list[Delivery]]:
            return [job_events(f"{prefix}-{i:04d}", rng, args.checkpoints) for i in range(args.jobs)]

        # Warm up connections and code paths.
        run([fresh_service()], mix("warm")[:5], 1)

        services = fresh_services()
        server_cpu_s, cpu_s = server_cpu(gcs), time.process_time()
        latencies, by_label, wall = run(services, mix("one"), 1)
        cpu_ms = (time.process_time() - cpu_s) / len(latencies) * 1000
        server_ms = (server_cpu(gcs) - server_cpu_s) / len(latencies) * 1000
        single = report("1 thread", latencies, wall)
        print(f"  CPU per event: {cpu_ms:.2f} ms in this process, {server_ms:.2f} ms in fake-gcs-server")
        for label in sorted(by_label):
            ms = [x * 1000 for x in by_label[label]]
            print(f"  {label:<11} n={len(ms):<5} p50 {statistics.median(ms):6.2f} ms  p99 {percentile(ms, 99):6.2f} ms")

        pool_latencies, _, pool_wall = run(fresh_services(), mix("pool"), args.workers)
        pooled = report(f"{args.workers} threads", pool_latencies, pool_wall)

        one_latencies, _, one_wall = run([fresh_service()], mix("one-bucket"), 1)
        one_bucket = report("1 thread, every record in one bucket", one_latencies, one_wall)

        # Fan-out events: cost grows with the number of job records (measured on the single-thread bucket's size).
        service = fresh_service()
        run([service], mix("fan")[: args.jobs], 1)
        wake = log_entry(template("logentry_tpu_worker_preempted.json"))
        wake_s = timed(lambda: handle(service, "respawn-events", cloudevent(wake, "respawn-events")), 3)
        tick = {"kind": "sweep_tick"}
        sweep_s = timed(lambda: handle(service, "respawn-events", cloudevent(tick, "respawn-events")), 3)
        fan = f"TPU zone wake-up {wake_s * 1000:.0f} ms, sweep {sweep_s * 1000:.0f} ms"
        print(f"fan-out over {args.jobs} job records: {fan}")

        parse_s = timed(lambda: parse("respawn-events", cloudevent(trainer("checkpoint", "x", 1, step=1), "x")), 500)
        print(f"parse alone (CloudEvent -> event): {parse_s * 1e6:.0f} us")

    figures = {
        "p50_ms": single["p50_ms"],
        "p99_ms": single["p99_ms"],
        "events_per_s": max(single["events_per_s"], pooled["events_per_s"]),
        "events_per_s_1_thread": single["events_per_s"],
        f"events_per_s_{args.workers}_threads": pooled["events_per_s"],
        f"p99_ms_{args.workers}_threads": pooled["p99_ms"],
        "events_per_s_one_bucket": one_bucket["events_per_s"],
        "cpu_ms_per_event": round(cpu_ms, 3),
        "server_cpu_ms_per_event": round(server_ms, 2),
        "wake_up_ms": round(wake_s * 1000, 1),
        "sweep_ms": round(sweep_s * 1000, 1),
        "jobs": args.jobs,
        "jobs_per_bucket": args.jobs_per_bucket,
        "events": len(latencies),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
