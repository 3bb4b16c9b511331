"""What one preemption of an N-host slice costs the control plane, for N = 1 .. 64.

A Spot TPU slice of N worker VMs logs one `compute.instances.preempted` system event per worker, and each reaches
`on_event` as its own delivery (here every one twice, in a seeded random order). Each is a zone wake-up: the first
lists the zone, finds the node PREEMPTED, reads that job's record, deletes the node and creates the next attempt;
every later one lists the zone, finds nothing dead and reads no record. The real Service and decide run on an
instant in-memory provider and a record store that count their calls (this measures the function's work, not the
cloud API). Target: besides the N deliveries and their zone listings, the cost is the same for every N.

Last line: {"rows": [{"hosts", "deliveries", "lists", "creates", "deletes", "record_reads", "record_writes",
"ms_per_delivery"}, ...], "independent_of_n": bool}.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from dataclasses import replace
from typing import Any

from bench_handler import InstantProvider  # type: ignore[import-not-found]

from respawn.events import JobSubmitted, TrainerStarted, ZoneWokeUp
from respawn.jobs import Job, JobSpec, MachineState, TpuMachine
from respawn.policy import Policy
from respawn.ports import ConflictError, Machine
from respawn.service import Service
from respawn.topology import tpu_topology

ZONE = "us-central1-a"
SHAPES = {1: "v5litepod-8", 4: "v5litepod-16", 16: "v5litepod-64", 64: "v5litepod-256"}


class CountingStore:
    def __init__(self) -> None:
        self.records: dict[str, tuple[Job, int]] = {}
        self.reads = self.writes = 0

    def load(self, job_id: str) -> tuple[Job | None, int]:
        self.reads += 1
        return self.records.get(job_id, (None, 0))

    def save(self, job: Job, generation: int) -> int:
        if self.records.get(job.job_id, (None, 0))[1] != generation:
            raise ConflictError(job.job_id)
        self.writes += 1
        self.records[job.job_id] = (job, generation + 1)
        return generation + 1

    def list_ids(self) -> list[str]:
        return sorted(self.records)


class CountingProvider(InstantProvider):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {"create": 0, "delete": 0, "list": 0, "get": 0}

    def create(self, action: Any, spec: JobSpec) -> None:
        self.calls["create"] += 1
        super().create(action, spec)

    def delete(self, name: str, zone: str, spec: JobSpec | None = None) -> None:
        self.calls["delete"] += 1
        super().delete(name, zone, spec)

    def list(self, zone: str, job_id: str | None = None) -> list[Machine]:
        self.calls["list"] += 1
        return super().list(zone, job_id)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t


def one_preemption(hosts: int, copies: int, seed: int) -> dict[str, Any]:
    store, provider, clock = CountingStore(), CountingProvider(), Clock()
    service = Service(store, {"tpu": provider}, clock, Policy())
    spec = JobSpec("llm", TpuMachine(SHAPES[hosts], "v2-alpha-tpuv5-lite"), (ZONE,), "trainer", "gs://b/llm")
    service.handle(JobSubmitted("submit", clock.t, spec))
    service.handle(TrainerStarted("started", clock.t, "llm", 1))
    clock.t += 120
    m = provider.machines["llm-a1"]
    provider.machines["llm-a1"] = replace(m, state=MachineState.PREEMPTED)
    store.reads = store.writes = 0
    provider.calls = dict.fromkeys(provider.calls, 0)
    events = [ZoneWokeUp(f"w{i}", clock.t, ZONE, "p", f"t1v-n-9f3a2b1c-w-{i}") for i in range(hosts)] * copies
    random.Random(seed).shuffle(events)
    started = time.perf_counter()
    for event in events:
        service.handle(event)
    took = time.perf_counter() - started
    job, _ = store.records["llm"]
    assert job.counters.preemptions == 1 and job.current is not None and job.current.n == 2
    return {
        "hosts": hosts,
        "deliveries": len(events),
        "lists": provider.calls["list"],
        "creates": provider.calls["create"],
        "deletes": provider.calls["delete"],
        "record_reads": store.reads,
        "record_writes": store.writes,
        "ms_per_delivery": round(1000 * took / len(events), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=2, help="deliveries of each worker's event")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    logging.getLogger("respawn").setLevel(logging.WARNING)  # one line per handled event otherwise
    assert all(tpu_topology(shape).hosts == n for n, shape in SHAPES.items())
    rows = [one_preemption(n, a.copies, a.seed) for n in sorted(SHAPES)]
    for r in rows:
        print(
            f"{r['hosts']:>3} hosts: {r['deliveries']:>3} deliveries, {r['lists']:>3} zone listings, "
            f"{r['creates']} create, {r['deletes']} delete, {r['record_reads']} record reads, "
            f"{r['record_writes']} record writes, {r['ms_per_delivery']} ms per delivery"
        )
    fixed = {(r["creates"], r["deletes"], r["record_reads"], r["record_writes"]) for r in rows}
    per_delivery = all(r["lists"] == r["deliveries"] for r in rows)
    print(json.dumps({"rows": rows, "independent_of_n": len(fixed) == 1 and per_delivery}))
    return 0 if len(fixed) == 1 and per_delivery else 1


if __name__ == "__main__":
    sys.exit(main())
