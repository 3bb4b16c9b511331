"""The fleet benchmark (SPEC sections 7 and 14): a team's live jobs, its thousands of ended ones, a preemption wave.

The local cloud in its fleet mode (localcloud/cloud.py, Options): the real functions (functions/main.py) each as a
pool of instances that take one request at a time, as many as Terraform's defaults deploy up to 40 (infra/terraform/
variables.tf: on_event_max_instances, on_job_message_max_instances, function_timeout_seconds; functions.tf:
max_instance_request_concurrency = 1, the push subscriptions' ack deadline and retry policy; localcloud/services/
function_pool.py); the Pub/Sub emulator pushing every message on `--copies` subscriptions (duplicate deliveries) and
redelivering what is not acknowledged; fake-gcs-server behind GcsProxy (localcloud/services/proxy.py: `--latency-ms`
before every call, writes to one object at one a second with 429 past that, `--write-burst` of them at once: 1, the
default, refuses any second write within a second); the local TPU and Compute APIs with machines as state only (no
script, no trainer: Nodes(trainers=False)); the log router and its sink filter. Half the jobs are single-host TPU
nodes, half GPU VMs, over four zones; the bench process speaks for their trainers (a `started` entry each) and
preempts machines as the local cloud does (PREEMPTED in the API, then each VM's system event through the router).

Phases, each until every message it published has been acknowledged on every subscription (or `--phase-timeout`),
so that each phase's storage calls and pushes are its own (after a first sweep on the empty bucket, as a deployment
has before its jobs):
  ended-1   --ended / 10 ended jobs' records written into the state bucket through the store (not through the proxy)
  submit    --live job messages through on_job_message
  started   each live job's trainer `started` entry
  sweep-1   one sweep tick (reads per sweep with the first tenth of the ended jobs), after one that is not measured
  ended-2   the other ended jobs' records
  sweep-2   one sweep tick (with all of them: what it reads must not have grown)
  wave      --wave READY machines preempted at seeded times within --wave-s seconds
  completed --complete live jobs' trainers report `completed`
The first ended record is a real one: a job submitted, started and completed through the functions; the others are
copies of it under other ids, written with the store's own save (so in whatever layout the store keeps).

Measured: preemption (its system event emitted) -> the replacement's create call at the API, p50/p99; events lost
(a message some subscription never got a 2xx for, and preempted jobs without a replacement); redeliveries (pushes of
a message on a subscription after its first); GCS reads, writes (429s included) and lists per message of each phase
and per sweep; the most writes to one object in any second and in any 10 s; the sweep's duration (its push ->
answer). A create is done --create-s after its call (1 s: the local cloud's own); the handler waits for it, so in
the cloud, where a Spot TPU takes minutes and the wait is capped at 120 s, a preemption holds its instance that long:
--wave-create-s gives the wave's replacements such a create, to size the instances (docs/operations.md, Sizing for a
fleet). What this does not simulate: cold starts (the function instances start warm), GCS's own variation in
latency, the service's push rate (the emulator sends a few pushes at once per subscription: the figures show how
many), and a cloud API slower than loopback.

The last line printed is one JSON object of figures (bench/run_all.py holds them to their targets).

    .venv/bin/python bench/bench_fleet.py [--live 500] [--ended 10000] [--wave 200] [--wave-s 60] [--latency-ms 30]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions
from load_test import function_results, peak_overlap, recovery_creates  # type: ignore[import-not-found]

from localcloud.cloud import EVENTS_TOPIC, PROJECT, LocalCloud, Options, signals_as_interrupt
from localcloud.readout.report import percentile
from localcloud.services.bus import PushPolicy
from localcloud.services.logentries import trainer_entry
from localcloud.services.proxy import Call, Push
from localcloud.services.scheduler import SWEEP_TICK
from respawn.jobs import Job, parse_machine_name

ROOT = Path(__file__).resolve().parents[1]
TERRAFORM = ROOT / "infra" / "terraform"
CHECKPOINTS = "respawn-fleet-checkpoints"
RECORDS = "respawn/jobs/"  # the job records' prefix (GcsJobStore): what "records read per sweep" counts
# The most one-request instances a function runs here: each is a process (tens of MB once it has handled an event),
# and with the local API's creates done in --create-s (1 s) an instance is held about that long per preemption, so
# fewer than Terraform's 250 on_event instances (sized for the real cloud's create waits: docs/operations.md) carry
# the same wave. The figures say how many ran.
LOCAL_MAX_INSTANCES = 40
TPU = {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}
GPU = {"kind": "gpu", "machine_type": "g2-standard-8", "accelerator_type": "nvidia-l4", "accelerator_count": 1}
ZONES = {  # zones that offer v5e, and L4 (localcloud/apis/offerings.py)
    "tpu": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "gpu": ("us-central1-a", "us-central1-b", "us-west4-a", "europe-west4-a"),
}


def hcl(name: str) -> dict[str, Any]:
    options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
    with (TERRAFORM / name).open(encoding="utf-8") as f:
        return hcl2.load(f, serialization_options=options)  # type: ignore[no-any-return]


def terraform_defaults() -> dict[str, int]:
    """What Terraform deploys by default: the functions' instances and timeout (variables.tf), the push
    subscriptions' ack deadline and redelivery backoff (functions.tf), in seconds."""
    found = {name: body for block in hcl("variables.tf")["variable"] for name, body in block.items()}
    names = ("on_event_max_instances", "on_job_message_max_instances", "function_timeout_seconds")
    out = {name: int(found[name]["default"]) for name in names}
    push = next(b for b in hcl("functions.tf")["resource"] if "push" in b.get("google_pubsub_subscription", {}))
    push = push["google_pubsub_subscription"]["push"]
    deadline = re.fullmatch(r"\$\{min\((\d+), var\.function_timeout_seconds \+ (\d+)\)\}", push["ack_deadline_seconds"])
    assert deadline, f"functions.tf's ack deadline is no longer min(N, timeout + M): {push['ack_deadline_seconds']}"
    out["ack_deadline_seconds"] = min(int(deadline[1]), out["function_timeout_seconds"] + int(deadline[2]))
    retry = push["retry_policy"][0]
    out["minimum_backoff"], out["maximum_backoff"] = (
        int(retry[k].removesuffix("s")) for k in ("minimum_backoff", "maximum_backoff")
    )
    return out


def job_message(job_id: str, i: int) -> dict[str, Any]:
    return {
        "action": "submit",
        "job_id": job_id,
        "machine": (machine := TPU if i % 2 == 0 else GPU),
        "zones": [ZONES[machine["kind"]][i // 2 % 4], ZONES[machine["kind"]][(i // 2 + 1) % 4]],
        "provisioning": "spot",
        "image": "us-docker.pkg.dev/respawn-local/respawn/trainer:latest",
        "checkpoint_uri": f"gs://{CHECKPOINTS}/{job_id}",
        "ttl": "24h",
    }


# ---- phases ---------------------------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    seconds: float
    published: list[tuple[str, str]]  # (topic, message id)
    calls: list[Call]
    pushes: list[Push]
    finished: bool  # every message acknowledged on every subscription within the phase's time
    lost: int = 0  # (message, subscription) pairs never acknowledged


class Stalled(RuntimeError):
    """A phase did not finish (with --give-up)."""


def acked(pushes: Iterable[Push]) -> Counter[str]:
    """Per message id, on how many subscriptions it was acknowledged (a 2xx)."""
    done = {(p.message_id, p.subscription) for p in pushes if p.ok}
    return Counter(message for message, _ in done)


@dataclass
class Fleet:
    """The local cloud and what the phases measure from it."""

    cloud: LocalCloud
    copies: int
    timeout_s: float
    say: Callable[[str], None]
    give_up: bool = False  # raise Stalled at the first phase that does not finish
    phases: list[Phase] = field(default_factory=list)

    def calls(self) -> list[Call]:
        proxy = self.cloud.started.gcs_proxy
        assert proxy is not None
        return proxy.calls()

    def pushes(self, since: dict[str, int] | None = None) -> list[Push]:
        """Every push so far, or those after `since` (topic -> how many that topic's recorder had then)."""
        recorders = self.cloud.started.pushes
        return [p for topic, r in recorders.items() for p in r.pushes()[(since or {}).get(topic, 0) :]]

    def push_marks(self) -> dict[str, int]:
        return {topic: len(recorder.pushes()) for topic, recorder in self.cloud.started.pushes.items()}

    def phase(self, name: str, act: Callable[[], None], until: Callable[[], bool] = lambda: True) -> Phase:
        """Run `act`, then wait until every message published meanwhile is acknowledged on every subscription and
        `until()` holds (or the phase timeout); the phase's storage calls and pushes are those in between."""
        bus = self.cloud.bus
        marks = (len(bus.published), len(self.calls()), self.push_marks())
        t0 = time.time()
        act()
        deadline = time.monotonic() + self.timeout_s
        while True:
            published = bus.published[marks[0] :]
            ids = {message for _, message in published}
            done = acked(p for p in self.pushes(marks[2]) if p.message_id in ids)
            finished = all(done[m] >= self.copies for m in ids) and until()
            if finished or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(0.3)  # the last calls of an answered push are in
        lost = sum(max(0, self.copies - done[m]) for m in ids)
        phase = Phase(name, time.time() - t0, published, self.calls()[marks[1] :], self.pushes(marks[2]), finished)
        phase.lost = lost
        self.phases.append(phase)
        reads, writes = sum(c.kind == "read" for c in phase.calls), sum(c.kind == "write" for c in phase.calls)
        self.say(
            f"{name}: {len(published)} messages, {len(phase.pushes)} pushes, {reads} reads, {writes} writes "
            f"in {phase.seconds:.1f}s{'' if finished else ' (NOT FINISHED)'}"
        )
        if not finished:
            errors = " | ".join(last_errors(self.cloud.run_dir / "functions"))
            self.say(f"  the functions' last errors: {errors}")
            if self.give_up:
                raise Stalled(f"phase {name} did not finish in {self.timeout_s:g}s: {errors}")
        return phase

    def ready(self) -> dict[str, tuple[str, str]]:
        """READY machines now: name -> (job id, zone)."""
        out = {}
        for m in self.cloud.server.machines():
            parsed = parse_machine_name(m.name)
            if m.state in ("READY", "RUNNING") and parsed is not None:  # a TPU node, a Compute Engine VM
                out[m.name] = (parsed[0], m.zone)
        return out

    def wait_ready(self, n: int) -> dict[str, tuple[str, str]]:
        deadline = time.monotonic() + self.timeout_s
        while len(ready := self.ready()) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        return ready

    def trainer_says(self, machine: str, zone: str, event: str, **payload: Any) -> None:
        """A lifecycle entry of the trainer on `machine`, routed as Cloud Logging would route it."""
        parsed = parse_machine_name(machine)
        assert parsed is not None
        job_id, attempt = parsed
        body = {"event": event, "job_id": job_id, "attempt": attempt, "step": 0, **payload}
        entry = trainer_entry(
            body, project=PROJECT, zone=zone, machine=machine, job_id=job_id, attempt=attempt, now=time.time()
        )
        self.cloud.nodes.cloud.route(entry)


def last_errors(log_dir: Path, n: int = 3) -> list[str]:
    """The last `n` lines of the functions' logs that are errors or retries, shortened."""
    lines = [
        line[:300]
        for log in sorted(log_dir.glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if '"ERROR"' in line or '"retry"' in line
    ]
    return lines[-n:]


# ---- the scenario ----------------------------------------------------------------------------------------------------


def write_ended(fleet: Fleet, template: Job, ids: list[str]) -> None:
    """Copies of an ended job's record under `ids`, saved through the store as new records."""
    text = json.dumps(template.to_dict())
    store = fleet.cloud.store

    def save(job_id: str) -> None:
        store.save(Job.from_dict(json.loads(text.replace(template.job_id, job_id))), 0)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(save, ids))


def ended_template(fleet: Fleet) -> Job:
    """A job submitted, started and completed through the functions: the record every ended copy is made from (setup,
    not measured: without the write rate limit)."""
    proxy = fleet.cloud.started.gcs_proxy
    assert proxy is not None
    window, proxy.write_window_s = proxy.write_window_s, 0
    try:
        return _ended_template(fleet)
    finally:
        proxy.write_window_s = window


def _ended_template(fleet: Fleet) -> Job:
    job_id = "fleet-ended-0"
    fleet.phase("template", lambda: fleet.cloud.submit(job_message(job_id, 1)), lambda: bool(fleet.ready()))
    machine, (_, zone) = next(iter(fleet.ready().items()))
    fleet.phase("template", lambda: fleet.trainer_says(machine, zone, "started", restored_step=None, startup_s=30.0))
    done = {"step": 100, "final_loss": 1.5, "params_sha256": "0" * 64}
    fleet.phase("template", lambda: fleet.trainer_says(machine, zone, "completed", **done))
    job, _ = fleet.cloud.store.load(job_id)
    assert job is not None and job.status.terminal, f"the template job did not end: {job and job.status}"
    return job


def wave(fleet: Fleet, machines: list[str], seconds: float, seed: int) -> Callable[[], None]:
    """Preempt `machines` at seeded times within `seconds` (as the local cloud's chaos does: PREEMPTED, then each
    VM's system event)."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, seconds) for _ in machines)

    def act() -> None:
        t0 = time.monotonic()
        for t, name in zip(times, machines, strict=True):
            time.sleep(max(0.0, t0 + t - time.monotonic()))
            fleet.cloud.nodes.preempt(name)

    return act


def scenario(fleet: Fleet, a: argparse.Namespace) -> dict[str, Any]:
    """Every phase of the module docstring; returns what the figures need besides the phases."""
    cloud = fleet.cloud
    # A deployment's first sweep, on a bucket without records: the live index starts complete (functions/respawn/
    # live_index.py), as in a deployment made before its jobs.
    fleet.phase("template", lambda: cloud.bus.publish(EVENTS_TOPIC, SWEEP_TICK))
    template = ended_template(fleet)
    first = max(1, a.ended // 10)
    ids = [f"fleet-ended-{i}" for i in range(1, a.ended)]
    fleet.phase("ended-1", lambda: write_ended(fleet, template, ids[: first - 1]))
    live = [f"fleet-{i:05d}" for i in range(a.live)]
    fleet.phase("submit", lambda: [cloud.submit(job_message(job_id, i)) for i, job_id in enumerate(live)])
    machines = fleet.wait_ready(a.live)

    def started() -> None:
        for m, (_, zone) in machines.items():
            fleet.trainer_says(m, zone, "started", restored_step=None, startup_s=30.0)

    fleet.phase("started", started)
    # The first sweep after the submissions tidies the index (markers of records that ended); the next is measured.
    fleet.phase("template", lambda: cloud.bus.publish(EVENTS_TOPIC, SWEEP_TICK))
    fleet.phase("sweep-1", lambda: cloud.bus.publish(EVENTS_TOPIC, SWEEP_TICK))
    fleet.phase("ended-2", lambda: write_ended(fleet, template, ids[first - 1 :]))
    fleet.phase("sweep-2", lambda: cloud.bus.publish(EVENTS_TOPIC, SWEEP_TICK))
    hit = sorted(random.Random(a.seed).sample(sorted(machines), min(a.wave, len(machines))))
    hit_jobs = {machines[m][0] for m in hit}

    def recovered() -> bool:
        preempted = len(cloud.timeline.events("preempted"))
        return preempted >= len(hit) and len(recovery_creates(cloud.timeline.events())) >= len(hit)

    cloud.server.create_delay_s = a.create_s if a.wave_create_s is None else a.wave_create_s
    fleet.phase("wave", wave(fleet, hit, a.wave_s, a.seed), recovered)
    cloud.server.create_delay_s = a.create_s
    spared = [m for m in sorted(machines) if machines[m][0] not in hit_jobs][: a.complete]
    done = {"step": 100, "final_loss": 1.5, "params_sha256": "0" * 64}
    fleet.phase("completed", lambda: [fleet.trainer_says(m, machines[m][1], "completed", **done) for m in spared])
    return {"first_ended": first, "hit": hit, "live_at_sweep": a.live}


# ---- figures ---------------------------------------------------------------------------------------------------------


def busiest(calls: Iterable[Call], window_s: float) -> tuple[float, str]:
    """The most write calls (429s included) to one object in any `window_s` window, per second, and that object."""
    by_object: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        if c.kind == "write" and c.name:
            by_object[c.name].append(c.t)
    best, where = 0, ""
    for name, times in by_object.items():
        times.sort()
        lo = 0
        for hi, t in enumerate(times):
            while times[lo] <= t - window_s:
                lo += 1
            if hi - lo + 1 > best:
                best, where = hi - lo + 1, name
    return best / window_s, where


def costs(phase: Phase) -> dict[str, Any]:
    """A phase's storage calls and pushes, in all and per message."""
    kinds = Counter(c.kind for c in phase.calls)
    messages = max(1, len(phase.published))
    pairs = {(p.message_id, p.subscription) for p in phase.pushes}
    return {
        "messages": len(phase.published),
        "pushes": len(phase.pushes),
        "redeliveries": len(phase.pushes) - len(pairs),
        "reads": kinds["read"],
        "writes": kinds["write"],
        "writes_429": sum(c.kind == "write" and c.status == 429 for c in phase.calls),
        "conflicts_412": sum(c.kind == "write" and c.status == 412 for c in phase.calls),
        "lists": kinds["list"],
        "per_message": {k: round(kinds[k] / messages, 2) for k in ("read", "write", "list")},
        "seconds": round(phase.seconds, 1),
        "finished": phase.finished,
        "lost": phase.lost,
    }


def sweep_figures(phase: Phase) -> dict[str, Any]:
    """One sweep tick: its storage calls per sweep that ran (one per subscription) and how long the longest took."""
    runs = max(1, sum(p.ok for p in phase.pushes))
    took = [p.done - p.sent for p in phase.pushes if p.ok]
    kinds = Counter(c.kind for c in phase.calls)
    records = sum(c.kind == "read" and c.name.startswith(RECORDS) for c in phase.calls)
    return {
        "reads": round(kinds["read"] / runs, 1),
        "record_reads": round(records / runs, 1),  # job records (the other reads: the index, the history)
        "writes": round(kinds["write"] / runs, 1),
        "lists": round(kinds["list"] / runs, 1),
        "seconds": round(max(took), 2) if took else None,
        "finished": phase.finished,
    }


def figures(fleet: Fleet, a: argparse.Namespace, extra: dict[str, Any], limits: dict[str, int]) -> dict[str, Any]:
    by_name = {p.name: p for p in fleet.phases}
    measured = [p for p in fleet.phases if p.name != "template"]
    events = fleet.cloud.timeline.events()
    hit = set(extra["hit"])
    wave_creates = recovery_creates([e for e in events if e["kind"] != "preempted" or e.get("machine") in hit])
    wave_phase = by_name["wave"]
    every_call = [c for p in measured for c in p.calls]
    peak_1s, hot_1s = busiest(every_call, 1.0)
    peak_10s, hot_10s = busiest(every_call, 10.0)
    sweeps = [sweep_figures(by_name["sweep-1"]), sweep_figures(by_name["sweep-2"])]
    messages_lost = sum(p.lost for p in fleet.phases)
    unrecovered = len(hit) - len(wave_creates)
    wave_costs = costs(wave_phase)
    return {
        "live": a.live,
        "ended": a.ended,
        "wave": len(hit),
        "wave_s": a.wave_s,
        "latency_ms": a.latency_ms,
        "copies": a.copies,
        "instances": extra["instances"],
        "terraform_instances": {t: limits[f"{t}_max_instances"] for t in ("on_event", "on_job_message")},
        "create_s": a.create_s,
        "wave_create_s": a.create_s if a.wave_create_s is None else a.wave_create_s,
        "function_timeout_s": limits["function_timeout_seconds"],
        "ack_deadline_s": limits["ack_deadline_seconds"],
        "write_burst": a.write_burst,
        "create_p50_s": percentile(wave_creates, 50),
        "create_p99_s": percentile(wave_creates, 99),
        "create_max_s": round(max(wave_creates), 3) if wave_creates else None,
        "events_lost": messages_lost + max(0, unrecovered),
        "messages_lost": messages_lost,
        "unrecovered": max(0, unrecovered),
        "redeliveries": sum(costs(p)["redeliveries"] for p in measured),
        "wave_redeliveries": wave_costs["redeliveries"],
        "writes_429": sum(costs(p)["writes_429"] for p in measured),
        "max_writes_per_s_one_object": round(peak_1s, 2),
        "max_writes_per_s_one_object_10s": round(peak_10s, 2),
        "hottest_object": hot_10s or hot_1s,
        "sweep_s": sweeps[1]["seconds"],
        "sweep_reads": sweeps[1]["reads"],
        "sweep_extra_reads": None
        if sweeps[1]["reads"] is None
        else round(sweeps[1]["reads"] - extra["live_at_sweep"], 1),
        "sweep_reads_independent": int(
            sweeps[0]["record_reads"] == sweeps[1]["record_reads"] and all(s["finished"] for s in sweeps)
        ),
        "sweeps": {f"{extra['first_ended']} ended": sweeps[0], f"{a.ended} ended": sweeps[1]},
        "per_event": {
            name: costs(by_name[name]) for name in ("submit", "started", "wave", "completed") if name in by_name
        },
        "wave_phase_s": round(wave_phase.seconds, 1),
        # the most wave deliveries being handled at once, and how long one took (push -> answer, queueing included)
        "wave_in_flight_peak": peak_overlap((p.sent, p.done) for p in wave_phase.pushes),
        "wave_push_p50_s": percentile([p.done - p.sent for p in wave_phase.pushes], 50),
        "wave_push_p99_s": percentile([p.done - p.sent for p in wave_phase.pushes], 99),
        "function_results": function_results(fleet.cloud.run_dir / "functions"),
    }


def run(a: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """The whole scenario on a fresh local cloud; returns the figures."""
    limits = terraform_defaults()
    instances = {
        target: getattr(a, f"{target}_instances") or min(limits[f"{target}_max_instances"], LOCAL_MAX_INSTANCES)
        for target in ("on_event", "on_job_message")
    }
    options = Options(
        duplicate_deliveries=a.copies,
        seed=a.seed,
        sweep_every_s=0,  # sweep ticks are the phases' own
        creation_delay_s=a.create_s,
        workdir=Path(a.workdir),
        bus="emulator",
        trainers=False,
        function_instances=instances,
        function_timeout_s=limits["function_timeout_seconds"],
        gcs_latency_s=a.latency_ms / 1000,
        push_policy=PushPolicy(limits["ack_deadline_seconds"], (limits["minimum_backoff"], limits["maximum_backoff"])),
    )
    with signals_as_interrupt(), LocalCloud(options, say) as cloud:
        cloud.start([CHECKPOINTS])
        proxy = cloud.started.gcs_proxy
        assert proxy is not None
        proxy.burst = a.write_burst
        fleet = Fleet(cloud, a.copies, a.phase_timeout, say, a.give_up)
        extra = scenario(fleet, a)
        return figures(fleet, a, {**extra, "instances": instances}, limits)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=int, default=500, help="live jobs (default 500)")
    p.add_argument("--ended", type=int, default=10_000, help="ended jobs' records in the bucket (default 10,000)")
    p.add_argument("--wave", type=int, default=200, help="machines preempted in the wave (default 200)")
    p.add_argument("--wave-s", type=float, default=60.0, help="seconds the wave's preemptions spread over (default 60)")
    p.add_argument("--complete", type=int, default=50, help="live jobs that complete at the end (default 50)")
    p.add_argument("--latency-ms", type=float, default=30.0, help="added to every GCS call (default 30)")
    p.add_argument("--write-burst", type=int, default=1, help="writes to one object at once before 429 (default 1)")
    p.add_argument("--copies", type=int, default=2, help="subscriptions per topic: deliveries of each message")
    p.add_argument("--create-s", type=float, default=1.0, help="a create call -> its machine READY (default 1)")
    p.add_argument("--wave-create-s", type=float, help="the same for the wave's replacements (default --create-s)")
    p.add_argument("--on-event-instances", type=int, default=0, help="default: Terraform's, at most 40 here")
    p.add_argument("--on-job-message-instances", type=int, default=0, help="default: Terraform's, at most 40 here")
    p.add_argument("--give-up", action="store_true", help="stop at the first phase that does not finish")
    p.add_argument("--phase-timeout", type=float, default=600.0, help="give a phase up after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=str(ROOT / ".respawn"), help="run logs go to WORKDIR/runs/")
    return p


def main() -> int:
    a = parser().parse_args()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.time()
    try:
        f = run(a, say)
    except KeyboardInterrupt as e:
        say(f"fleet benchmark interrupted ({e or 'SIGINT'}); everything was stopped")
        return 130
    f["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
