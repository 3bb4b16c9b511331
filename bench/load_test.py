"""Control-plane load test on the local cloud: hundreds of concurrent jobs, preemptions, duplicate deliveries.

One local cloud (fake-gcs-server, the local TPU/Compute API, functions-framework running on_job_message and
on_event from functions/main.py, the in-process push bus, the log router, sweep ticks) runs --jobs jobs at
once, each a light trainer (`--model=none`: sleeps --step-time per step, checkpoints a step marker to
fake-gcs-server, sends its lifecycle entries). Half the jobs are TPU nodes, half GPU VMs, each over four zones
that offer it. Every Pub/Sub message is pushed --duplicates times at once, and --preemptions random READY machines
are preempted (SIGTERM, PREEMPTED, the system event through the sink filter) while the jobs run.

Checked: no job ever had two live machines (from the cloud API's create/delete record and machine states),
every job SUCCEEDED, no machine and no process is left, all jobs were live at the same moment. Measured
from the bus, which times every push where it is sent: events handled per second by the functions, push ->
answer latency p50/p99 (the handling, as the pusher sees it) and due -> answer (the bus's queue included),
and from the cloud API: preemption -> the replacement's create call p50/p99. Also the CPU seconds of each
piece, to show where the time goes (everything shares this machine's cores).

The in-process bus is used, not the emulator: it sees each push and its answer. The functions get one
message each first (warm-up), so that the figures are those of warm instances. Every push is kept in
RUN_DIR/deliveries.jsonl. The last line printed is one JSON object {"jobs", "events", "duplicates",
"duplicate_machines", "succeeded", "events_per_s", "handle_p50_ms", "handle_p99_ms", "create_p50_s",
"create_p99_s", "wall_s", ...}; the exit code is 0 when every check passed.

    make load
    .venv/bin/python bench/load_test.py [--jobs 200] [--steps 50] [--preemptions 100] [--duplicates 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from localcloud.cloud import (
    EVENTS_TOPIC,
    JOBS_TOPIC,
    LocalCloud,
    Options,
    checkpoint_buckets,
    signals_as_interrupt,
)
from localcloud.readout.report import LIVE_STATES, percentile
from localcloud.services.bus import Delivery
from localcloud.services.scheduler import SWEEP_TICK
from respawn.jobs import parse_machine_name

ROOT = Path(__file__).resolve().parents[1]
TPU = {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}
GPU = {"kind": "gpu", "machine_type": "g2-standard-8", "accelerator_type": "nvidia-l4", "accelerator_count": 1}
# zones that offer v5e, and L4 (localcloud/apis/offerings.py)
ZONES = {
    "tpu": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "gpu": ("us-central1-a", "us-central1-b", "us-west4-a", "europe-west4-a"),
}
CHECKPOINTS = "respawn-load-checkpoints"


def job_messages(n: int, steps: int, step_time: float, checkpoint_every: int) -> list[dict[str, Any]]:
    return [
        {
            "action": "submit",
            "job_id": f"load-{i:04d}",
            "machine": (machine := TPU if i % 2 == 0 else GPU),
            "zones": [ZONES[machine["kind"]][i // 2 % 4], ZONES[machine["kind"]][(i // 2 + 1) % 4]],
            "provisioning": "spot",
            "image": "us-docker.pkg.dev/respawn-local/respawn/trainer:latest",
            "args": [
                "--model=none",
                f"--steps={steps}",
                f"--step-time={step_time:g}",
                f"--checkpoint-every={checkpoint_every}",
                f"--log-every={checkpoint_every}",
            ],
            "checkpoint_uri": f"gs://{CHECKPOINTS}/load-{i:04d}",
            "ttl": "1h",
            "max_failures": 3,
        }
        for i in range(n)
    ]


# ---- analysis (pure) ------------------------------------------------------------------------------------------------


def message_kind(d: Delivery) -> str:
    """What a push carried: job_message, sweep_tick, system_event_tpu / _gpu, or trainer_<event> (lifecycle)."""
    if d.topic == JOBS_TOPIC:
        return "job_message"
    message = d.body["message"]
    assert isinstance(message, dict)
    data = json.loads(base64.b64decode(message["data"]))
    if data.get("kind") == "sweep_tick":
        return "sweep_tick"
    if "protoPayload" in data:  # a TPU node's hidden worker VM (a zone wake-up) or a GPU VM itself
        return (
            "system_event_tpu"
            if "/instances/t1v-n-" in data["protoPayload"].get("resourceName", "")
            else ("system_event_gpu")
        )
    return f"trainer_{data.get('jsonPayload', {}).get('event')}"


def machine_spans(events: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """Per job, each machine's live span (start, end, name): created at the API -> delete call or PREEMPTED."""
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        name = str(e.get("machine"))
        if e["kind"] == "state" and e["state"] == "CREATING":
            start.setdefault(name, e["t"])
        elif (
            ((e["kind"] == "state" and e["state"] not in LIVE_STATES) or e["kind"] in ("delete_call", "preempted"))
            and name in start
            and name not in end
        ):
            end[name] = e["t"]
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for name, t in start.items():
        parsed = parse_machine_name(name)
        if parsed:
            spans.setdefault(parsed[0], []).append((t, end.get(name, float("inf")), name))
    return spans


def overlaps(spans: dict[str, list[tuple[float, float, str]]]) -> list[tuple[str, str, str]]:
    """(job, machine, machine) for every two machines of one job that were live at the same moment."""
    found = []
    for job, machines in spans.items():
        ordered = sorted(machines)
        for i, (_, end, name) in enumerate(ordered):
            found += [(job, name, other) for start, _, other in ordered[i + 1 :] if start < end]
    return found


def recovery_creates(events: list[dict[str, Any]]) -> list[float]:
    """Per preemption: seconds from PREEMPTED (system event emitted) to the job's next create call."""
    creates: dict[str, list[tuple[float, int]]] = {}
    for e in events:
        parsed = parse_machine_name(str(e.get("machine"))) if e["kind"] == "create_call" else None
        if parsed:
            creates.setdefault(parsed[0], []).append((e["t"], parsed[1]))
    out = []
    for e in events:
        parsed = parse_machine_name(str(e.get("machine"))) if e["kind"] == "preempted" else None
        if parsed:
            later = [t for t, n in creates.get(parsed[0], []) if n > parsed[1] and t >= e["t"]]
            if later:
                out.append(min(later) - e["t"])
    return out


def peak_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals that contain one moment."""
    edges = sorted(edge for a, b in intervals for edge in ((a, 1), (b, -1)))
    most = live = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


def peak_rate(times: list[float], window_s: float = 5.0) -> float:
    """The most events in any `window_s` window, per second."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] < t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / window_s


def rate(times: list[float], start: float, end: float) -> float | None:
    """Events per second in [start, end] (None for a window under a second)."""
    if end - start < 1:
        return None
    return round(sum(1 for t in times if start <= t <= end) / (end - start), 1)


def busy_share(deliveries: list[Delivery], start: float, end: float) -> float:
    """The share of [start, end] during which some push waited for a free pusher (all of the bus's were busy)."""
    waiting = [(d.due, d.sent) for d in deliveries if d.sent - d.due > 0.05]
    edges = sorted(edge for a, b in waiting for edge in ((a, 1), (b, -1)))
    covered, depth, since = 0.0, 0, start
    for t, step in edges:
        if depth == 0 and step == 1:
            since = t
        depth += step
        if depth == 0:
            covered += t - since
    return covered / max(end - start, 1e-9)


def function_results(log_dir: Path) -> dict[str, dict[str, int]]:
    """Per function, how many events it handled with each `result` (its one JSON line per event)."""
    out = {}
    for log in sorted(log_dir.glob("*.log")):
        counts: Counter[str] = Counter()
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"result"' in line:
                try:
                    counts[str(json.loads(line)["result"])] += 1
                except (ValueError, KeyError):
                    counts["unparsed"] += 1
        out[log.stem] = dict(counts)
    return out


def ms(values: list[float], q: float) -> float | None:
    found = percentile([v * 1000 for v in values], q)
    return None if found is None else round(found, 1)


# ---- the run --------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    deliveries: list[Delivery] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)  # job id -> final status
    run_dir: Path = Path()
    t0: float = 0.0  # the first submit
    end: float = 0.0  # every job terminal (or the timeout)
    server_cpu_s: dict[str, float] = field(default_factory=dict)
    machines_left: int = 0
    processes_left: int = 0
    timed_out: bool = False
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and at the end


def server_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by each functions-framework server (its gunicorn worker included) and by
    fake-gcs-server: children of this process."""
    out: dict[str, float] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd, t = p.cmdline(), p.cpu_times()
        except psutil.Error:
            continue
        name = cmd[cmd.index("--target") + 1] if "--target" in cmd[:-1] else None
        if cmd and "fake-gcs-server" in Path(cmd[0]).name:
            name = "fake-gcs-server"
        if name:
            out[name] = round(out.get(name, 0.0) + t.user + t.system, 1)
    return out


def warm_up(cloud: LocalCloud, done: Callable[[], int], copies: int, say: Callable[[str], None]) -> None:
    """One message to each function (a cancel of no job, a sweep tick of no jobs): a fresh instance's first event
    imports and builds the cloud clients, which is not what this test measures."""
    t = time.time()
    cloud.bus.publish(JOBS_TOPIC, json.dumps({"action": "cancel", "job_id": "warm-up"}).encode(), {})
    cloud.bus.publish(EVENTS_TOPIC, SWEEP_TICK)
    while done() < 2 * copies and time.time() < t + 120:
        time.sleep(0.1)
    say(f"load: functions warmed up in {time.time() - t:.1f}s")


def preemption_times(a: argparse.Namespace) -> list[float]:
    """Seeded, while the jobs train: from the first trainers' start to before most of them end."""
    submit_s = a.jobs / a.submit_rate
    rng = random.Random(a.seed)
    end = submit_s + 0.7 * a.steps * a.step_time
    return sorted(rng.uniform(min(10.0, submit_s), end) for _ in range(a.preemptions))


def run(a: argparse.Namespace, say: Callable[[str], None]) -> Run:
    messages = job_messages(a.jobs, a.steps, a.step_time, a.checkpoint_every)
    opts = Options(
        preempt_at=preemption_times(a),
        duplicate_deliveries=a.duplicates,
        seed=a.seed,
        creation_delay_s=a.creation_delay,
        grace_s=a.grace,
        sweep_every_s=a.sweep_every,
        workdir=Path(a.workdir),
        bus="in-process",
    )
    r = Run()
    lock = threading.Lock()
    measuring = threading.Event()
    warm = [0]

    def observe(d: Delivery) -> None:
        with lock:
            if measuring.is_set():
                r.deliveries.append(d)
            else:
                warm[0] += d.ok

    load0 = os.getloadavg()[0]
    with signals_as_interrupt(), LocalCloud(opts, say, on_delivery=observe) as cloud:
        cloud.start(checkpoint_buckets(messages))
        warm_up(cloud, lambda: warm[0], a.duplicates, say)
        measuring.set()
        r.run_dir, r.t0 = cloud.run_dir, time.time()
        cloud.start_chaos(r.t0)
        say(
            f"load: {a.jobs} jobs at {a.submit_rate:g}/s, {a.steps} steps of {a.step_time:g}s, {a.preemptions} "
            f"preemptions, every message x{a.duplicates}; logs in {cloud.run_dir}"
        )
        pending, next_submit, last_print = list(messages), r.t0, 0.0
        seen, finished, preempted = 0, set(), 0
        while time.time() < r.t0 + a.timeout and (pending or len(r.status) < a.jobs):
            now = time.time()
            while pending and next_submit <= now:
                cloud.submit(pending.pop(0))
                next_submit += 1.0 / a.submit_rate
            events = cloud.timeline.events()
            for e in events[seen:]:
                preempted += e["kind"] == "preempted"
                if e["kind"] == "entry" and e["payload"].get("event") in ("completed", "failed"):
                    finished.add(e["payload"].get("job_id"))
            seen = len(events)
            for job_id in sorted(finished - r.status.keys()):  # its trainer ended: read the record until terminal
                job, _ = cloud.store.load(job_id)
                if job is not None and job.status.terminal:
                    r.status[job_id] = job.status.value
            if now - last_print >= 10:
                last_print = now
                say(
                    f"[{now - r.t0:6.1f}s] submitted {a.jobs - len(pending)}, terminal {len(r.status)}, machines "
                    f"{len(cloud.server.machines())}, trainers {len(cloud.nodes.alive())}, pushes "
                    f"{len(r.deliveries)}, preempted {preempted}"
                )
            time.sleep(1.0)
        r.end, r.timed_out = time.time(), len(r.status) < a.jobs
        r.machines_left = cloud.machines_left() if r.timed_out else cloud.settle(60)
        for message in messages:  # the last word: every record
            job, _ = cloud.store.load(message["job_id"])
            r.status[message["job_id"]] = job.status.value if job else "MISSING"
        r.server_cpu_s = server_cpu_s()
        r.events = cloud.timeline.events()
        measuring.clear()
        say("load: stopping the local cloud")
    time.sleep(0.5)
    r.processes_left = len(psutil.Process().children(recursive=True))
    r.load_average = (load0, os.getloadavg()[0])
    return r


def write_deliveries(deliveries: list[Delivery], path: Path) -> None:
    """Every push, one JSON line each: what it carried, its message and copy, its times and answer."""
    with path.open("w") as f:
        for d in deliveries:
            message = d.body["message"]
            assert isinstance(message, dict)
            row = {"kind": message_kind(d), "message_id": message["messageId"], "subscription": d.body["subscription"]}
            f.write(json.dumps({**row, "due": d.due, "sent": d.sent, "done": d.done, "status": d.status}) + "\n")


def figures(a: argparse.Namespace, r: Run, cpu: dict[str, float], wall_s: float) -> dict[str, Any]:
    d = r.deliveries
    messages = {(x.topic, str(x.body["message"]["messageId"])) for x in d}
    spans = machine_spans(r.events)
    creates = recovery_creates(r.events)
    submitted = {e["job_id"]: e["t"] for e in r.events if e["kind"] == "submitted"}
    ended = {
        e["payload"]["job_id"]: e["t"]
        for e in r.events
        if e["kind"] == "entry" and e["payload"].get("event") in ("completed", "failed")
    }
    first, last = (min(x.sent for x in d), max(x.done for x in d)) if d else (r.t0, r.t0)
    handle = [x.done - x.sent for x in d]
    kinds = Counter(message_kind(x) for x in d)
    held: Counter[str] = Counter()  # push -> answer seconds per kind: where the functions' threads went
    for x in d:
        held[message_kind(x)] += x.done - x.sent
    exits = [e["t"] for e in r.events if e["kind"] == "trainer_exit"]
    trainers_done = min(max(exits), last) if exits else first  # after it, nothing competes with the functions
    return {
        "jobs": a.jobs,
        "events": len(d),
        "duplicates": len(d) - len(messages),
        "duplicate_machines": len(overlaps(spans)),
        "succeeded": sum(1 for s in r.status.values() if s == "SUCCEEDED"),
        "events_per_s": round(len(d) / max(last - first, 1e-9), 1),
        "handle_p50_ms": ms(handle, 50),
        "handle_p99_ms": ms(handle, 99),
        "create_p50_s": percentile(creates, 50),
        "create_p99_s": percentile(creates, 99),
        "wall_s": round(wall_s, 1),
        # context: what the figures above came from
        "messages": len(messages),
        "redelivered": sum(1 for x in d if not x.ok),
        "by_kind": dict(sorted(kinds.items())),
        "handle_p99_ms_by_kind": {k: ms([x.done - x.sent for x in d if message_kind(x) == k], 99) for k in kinds},
        "queued_p50_ms": ms([x.done - x.due for x in d], 50),
        "queued_p99_ms": ms([x.done - x.due for x in d], 99),
        "pushers_all_busy_share": round(busy_share(d, first, last), 3),
        "peak_events_per_s": round(peak_rate([x.done for x in d]), 1),
        "events_per_s_while_trainers_ran": rate([x.done for x in d], first, trainers_done),
        "events_per_s_after_trainers": rate([x.done for x in d], trainers_done, last),
        "handler_time_share_by_kind": {k: round(v / max(sum(held.values()), 1e-9), 3) for k, v in held.items()},
        "preemptions": sum(e["kind"] == "preempted" for e in r.events),
        "recoveries_measured": len(creates),
        "peak_concurrent_jobs": peak_overlap((t, ended.get(j, r.end)) for j, t in submitted.items()),
        "peak_live_machines": peak_overlap((s, min(e, r.end)) for m in spans.values() for s, e, _ in m),
        "function_results": function_results(r.run_dir / "functions"),
        "machines_left": r.machines_left,
        "processes_left": r.processes_left,
        "load_s": round(r.end - r.t0, 1),
        "cpu_s": cpu,
        "cpus": os.cpu_count(),
        "load_average_1m": [round(x, 1) for x in r.load_average],
        "run_dir": str(r.run_dir),
    }


def passed(a: argparse.Namespace, f: dict[str, Any], r: Run) -> list[str]:
    """The checks that failed (empty: all passed)."""
    checks = {
        "every job reached a terminal status before --timeout": not r.timed_out,
        "every job SUCCEEDED": f["succeeded"] == a.jobs,
        "never two live machines for one job": f["duplicate_machines"] == 0,
        "no machine left": f["machines_left"] == 0,
        "no process left": f["processes_left"] == 0,
        "all jobs live at the same moment": f["peak_concurrent_jobs"] == a.jobs,
    }
    return [what for what, ok in checks.items() if not ok]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--steps", type=int, default=50, help="trainer steps per job (default 50)")
    p.add_argument("--step-time", type=float, default=1.0, help="seconds per step of the light trainer (default 1)")
    p.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints (default 5)")
    p.add_argument("--preemptions", type=int, default=100, help="random READY machines preempted (default 100)")
    p.add_argument("--duplicates", type=int, default=3, help="every message pushed N times at once (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the preemption times and picks (default 0)")
    p.add_argument("--submit-rate", type=float, default=5.0, help="job messages published per second (default 5)")
    p.add_argument("--sweep-every", type=float, default=15.0, help="seconds between sweep ticks (default 15)")
    p.add_argument("--creation-delay", type=float, default=1.0, help="seconds a machine spends CREATING (default 1)")
    p.add_argument("--grace", type=float, default=10.0, help="preemption grace period, seconds (default 10)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds (default 900)")
    p.add_argument("--workdir", default=str(ROOT / ".respawn"), help="run logs go to WORKDIR/runs/")
    a = p.parse_args()
    for name in ("jobs", "steps", "duplicates", "checkpoint_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be 1 or more")
    if a.submit_rate <= 0 or a.step_time < 0 or a.preemptions < 0:
        p.error("--submit-rate: must be more than 0; --step-time, --preemptions: must be 0 or more")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    wall0, cpu0 = time.time(), os.times()
    try:
        r = run(a, say)
    except KeyboardInterrupt as e:
        say(f"load test interrupted ({e or 'SIGINT'}); everything was stopped")
        return 130
    cpu1 = os.times()
    own = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    children = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    cpu = {**r.server_cpu_s, "cloud_api_bus_router_nodes": round(own, 1)}
    cpu["trainers"] = round(children - sum(r.server_cpu_s.values()), 1)  # servers are reaped at teardown too
    write_deliveries(r.deliveries, r.run_dir / "deliveries.jsonl")
    f = figures(a, r, cpu, time.time() - wall0)
    failed = passed(a, f, r)
    print(
        f"jobs {a.jobs}: {f['succeeded']} SUCCEEDED {dict(Counter(r.status.values()))}, peak concurrent jobs "
        f"{f['peak_concurrent_jobs']}, peak live machines {f['peak_live_machines']}, duplicate machines "
        f"{f['duplicate_machines']}, machines left {f['machines_left']}, processes left {f['processes_left']}\n"
        f"events {f['events']} pushes of {f['messages']} messages ({f['duplicates']} duplicates: x{a.duplicates} "
        f"copies and {f['redelivered']} redeliveries after a non-2xx); {f['preemptions']} preemptions\n"
        f"  by kind {f['by_kind']}\n  function results {f['function_results']}\n"
        f"throughput {f['events_per_s']} events/s on average, {f['peak_events_per_s']} in the busiest 5 s; "
        f"{f['events_per_s_while_trainers_ran']} while trainers ran, {f['events_per_s_after_trainers']} after\n"
        f"  share of the functions' handling time by kind {f['handler_time_share_by_kind']}\n"
        f"push -> answer p50 {f['handle_p50_ms']} ms, p99 {f['handle_p99_ms']} ms; due -> answer (the bus's queue "
        f"included) p50 {f['queued_p50_ms']} ms, p99 {f['queued_p99_ms']} ms; all 32 pushers busy "
        f"{100 * f['pushers_all_busy_share']:.0f}% of the time\n  p99 by kind (ms) {f['handle_p99_ms_by_kind']}\n"
        f"preemption -> replacement create call p50 {f['create_p50_s']} s, p99 {f['create_p99_s']} s "
        f"({f['recoveries_measured']} recoveries)\n"
        f"CPU seconds over {f['load_s']} s of load on {f['cpus']} cores (1-minute load average "
        f"{f['load_average_1m'][0]} at the start, {f['load_average_1m'][1]} at the end): {cpu}\n"
        f"{'all checks passed' if not failed else 'FAILED: ' + '; '.join(failed)}; run dir {r.run_dir}",
        flush=True,
    )
    print(json.dumps(f))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
