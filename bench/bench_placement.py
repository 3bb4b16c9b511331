"""Placement benchmark: many simulated Spot job-days over real preemption traces, three zone-choice policies.

Traces are in the format of skypilot-org/spot-traces: `{"metadata": {"gap_seconds": N}, "data": [...]}`, per tick
1 while a Spot instance runs in that zone and 0 while it is preempted or unobtainable; one file per zone, the zone's
label the file name's part before the first `_`. Every directory holding such files is one set of zones.

Each set runs `--jobs` jobs side by side on one simulated clock (staggered over the first day, `--days` each, the
traces looped), every decision made by the real `respawn.decide.decide()`: a create, reaching its zone
CREATE_DELAY_S after the decision, in a zone whose trace is 0 then fails for capacity (CreateFailed), a machine
whose zone's trace turns 0 is preempted (MachinePreempted),
a machine up for `RESTART_S` has its trainer started (TrainerStarted), a job waiting out its capacity backoff is
woken by a listing (MachinesObserved) when it is due.

Placement is decide()'s own: the respawn policy hands it an Outlook (respawn.outlook) built from this set's
preemption history, which learns as the service's does: each decision that ends an attempt leaves its observation
(Job.observations: the trainer's running time, and whether the cloud took the machine) and the simulator drains it
into the history shared by all jobs of the set, then clears it, as Acting does under the lease. decide() then ranks
the tier's zones at every create (first machine, after a preemption with the zone just lost penalised, after a
stockout among the zones not yet tried).

  ordered         decide() without an outlook: static list order (the same zone after a preemption, the next
                  listed zone after a stockout)
  skip-preempted  decide() without an outlook, its replacement after a preemption moved to the next listed zone
                  (SkyPilot's EAGER_NEXT_REGION): the attempt's zone and the job's zone_index rewritten in the record
                  before the create is acted on
  respawn         decide() with the outlook: the deployment's history, the zone just lost penalised, the penalty
                  fading; each machine's trainer saves at the Young/Daly interval of its zone's MTBI
  respawn-zones-only  respawn's zone choice alone: its trainers keep the default interval, as the baselines' do

Productive time: a trainer starts RESTART_S after its machine is up (boot, restore), saves at CHECKPOINT_COST_S
every Young/Daly interval of training for the MTBI handed to its machine (respawn: its zone's, from the outlook;
the baselines hand none, so the trainer's default RESPAWN_MTBI_S); a preemption loses the work since the last
save; the job's end keeps all of it. goodput = productive / wall time; cost per productive hour = machine-hours
(from create to preemption) x the price of an a2-highgpu-1g's A100 at Spot from respawn.prices; recoveries =
preemptions.

    bench/bench_placement.py [--traces DIR] [--seed N] [--jobs N] [--days D]

Prints a table per set, then as its last line one JSON object {"policies": {POLICY: {"goodput",
"cost_per_productive_hour", "recoveries", ...}}, "sets": {SET: {"policies": ...}}}, the top level over all sets.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from respawn.actions import CreateMachine
from respawn.decide import decide
from respawn.events import (
    CreateFailed,
    CreateFailure,
    JobEvent,
    JobSubmitted,
    MachinePreempted,
    MachinesObserved,
    TrainerStarted,
)
from respawn.jobs import EndReason, GpuMachine, Job, JobSpec, Status
from respawn.outlook import DAY, HOUR, History, Observation, Outlook
from respawn.policy import Policy
from respawn.prices import machine_price, rate_per_h

POLICIES = ("respawn", "ordered", "skip-preempted", "respawn-zones-only")
PLACED = ("respawn", "respawn-zones-only")  # decide() gets an outlook
MACHINE = GpuMachine("a2-highgpu-1g", "nvidia-tesla-a100", 1)
PROVISIONING = "spot"
FALLBACK_PRICE_PER_H = 1.0  # used only when respawn.prices has no row for MACHINE
RESTART_S = 180.0  # machine up -> training again (boot, image, restore)
CREATE_DELAY_S = 30.0  # decision -> the create reaches the zone (delete, decide, the API call)
CREATE_FAIL_S = 20.0  # a create call that finds no capacity answers after this
CHECKPOINT_COST_S = 30.0
# The trainer's `auto` checkpoint interval is Young/Daly, sqrt(2 * save cost * MTBI) (respawn_trainer/schedule.py),
# with the MTBI respawn hands the machine (CreateMachine.mtbi_s: its zone's expected time to interruption), or the
# trainer's default RESPAWN_MTBI_S where nothing is handed (the baselines: decide without an outlook hands none).
TRAINER_DEFAULT_MTBI_S = 3600.0
DECIDE_POLICY = Policy(restart_cost_s=RESTART_S + CREATE_DELAY_S)  # what decide's ranking charges an interruption


@dataclass(frozen=True)
class Trace:
    """One zone's trace, looped: `down_at` answers "when does this zone next turn 0" in O(1)."""

    zone: str
    gap_s: float
    data: tuple[int, ...]
    next_zero: tuple[int, ...]  # per tick i, the first tick j >= i (up to 2 * len) that is 0; -1: never

    @staticmethod
    def load(path: Path) -> Trace:
        raw = json.loads(path.read_text())
        data = tuple(int(bool(x)) for x in raw["data"])
        gap = float(raw["metadata"]["gap_seconds"])
        if not data or not gap > 0:
            raise ValueError(f"{path}: data must be non-empty and metadata.gap_seconds positive")
        n, nxt, following = len(data), [-1] * (2 * len(data)), -1
        for j in range(2 * n - 1, -1, -1):
            if data[j % n] == 0:
                following = j
            nxt[j] = following
        return Trace(path.stem.split("_")[0], gap, data, tuple(nxt[:n]))

    def up(self, t: float) -> bool:
        return self.data[int(t // self.gap_s) % len(self.data)] == 1

    def down_at(self, t: float) -> float:
        """The time this zone's trace next reads 0 (at or after t); inf when it never does."""
        tick = int(t // self.gap_s)
        cycle, i = divmod(tick, len(self.data))
        j = self.next_zero[i]
        return math.inf if j < 0 else (cycle * len(self.data) + j) * self.gap_s


def trace_sets(root: Path) -> dict[str, dict[str, Trace]]:
    """Every directory under root (root included) holding *.json traces, by its path relative to root."""
    sets: dict[str, dict[str, Trace]] = {}
    for folder in sorted({p.parent for p in root.rglob("*.json")}):
        traces = [Trace.load(p) for p in sorted(folder.glob("*.json"))]
        by_zone = {t.zone: t for t in traces}
        if len(by_zone) != len(traces):  # labels collide: fall back to the whole file name
            files = sorted(folder.glob("*.json"))
            by_zone = {p.stem: replace(t, zone=p.stem) for p, t in zip(files, traces, strict=True)}
        sets[str(folder.relative_to(root)) if folder != root else root.name] = by_zone
    if not sets:
        raise SystemExit(f"--traces {root}: no *.json trace files in it or below it")
    return sets


@dataclass
class Run:
    """One simulated job: its record (from its submit on) and what the simulator knows of its machine."""

    spec: JobSpec
    end_at: float
    record: Job | None = None
    up_since: float | None = None  # the live machine exists since (billed)
    interval_s: float = 0.0  # the live machine's trainer's checkpoint interval
    machine_s: dict[str, float] = field(default_factory=dict)
    productive_s: float = 0.0

    @property
    def job(self) -> Job:
        if self.record is None:
            raise RuntimeError(f"{self.spec.job_id} is not submitted yet")
        return self.record


@dataclass(frozen=True)
class Outcome:
    goodput: float
    cost_per_productive_hour: float
    recoveries: int
    capacity_errors: int
    machine_hours_by_zone: dict[str, float]
    wall_hours: float
    productive_hours: float
    machine_hours: float

    def summary(self) -> dict[str, object]:
        return {
            "goodput": round(self.goodput, 4),
            "cost_per_productive_hour": round(self.cost_per_productive_hour, 4),
            "recoveries": self.recoveries,
            "capacity_errors": self.capacity_errors,
            "machine_hours_by_zone": {z: round(h, 1) for z, h in self.machine_hours_by_zone.items()},
        }


def checkpoint_interval_s(mtbi_s: float | None) -> float:
    """The trainer's auto interval (Young/Daly) for the MTBI handed to its machine, or its default without one."""
    return math.sqrt(2 * CHECKPOINT_COST_S * (mtbi_s or TRAINER_DEFAULT_MTBI_S))


def kept_training_s(trained_s: float, finished: bool, interval_s: float) -> float:
    """Of `trained_s` seconds since the trainer started (saving every `interval_s` of training), the training kept:
    whole intervals that were saved, and at the job's end everything."""
    period = interval_s + CHECKPOINT_COST_S
    whole, rest = divmod(max(0.0, trained_s), period)
    return whole * interval_s + (min(rest, interval_s) if finished else 0.0)


def simulate(
    traces: dict[str, Trace], policy: str, *, jobs: int, days: float, seed: int, price_per_h: float
) -> Outcome:
    """Run `jobs` jobs of `days` each under `policy` on one clock; the same seed gives the same starts for every
    policy."""
    zones = tuple(traces)
    rng = random.Random(seed)
    origin = rng.uniform(0, max(len(t.data) * t.gap_s for t in traces.values()))  # where in the traces time 0 is
    starts = sorted(origin + rng.uniform(0, DAY) for _ in range(jobs))
    queue: list[tuple[float, int, int, str, int]] = []  # (time, seq, run, what, attempt)
    seq = 0
    history = History()
    runs: list[Run] = []
    ids = iter(range(1, 10**9))

    def at(t: float, i: int, what: str, attempt: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (t, seq, i, what, attempt))

    def decided(job: Job | None, event: JobEvent, now: float) -> tuple[Job, list[object]]:
        """decide(), with the outlook under the respawn policy; the observations it leaves go into the history."""
        nonlocal history
        outlook = Outlook(history=history, checkpoint_cost_s=CHECKPOINT_COST_S) if policy in PLACED else None
        new, actions = decide(job, event, now, DECIDE_POLICY, outlook=outlook)
        assert new is not None
        if new.observations:
            history = history.record([Observation.from_dict(o) for o in new.observations])
            new = replace(new, observations=())
        return new, list(actions)

    def skip_preempted(run: Run) -> str | None:
        """The skip-preempted baseline's zone for the attempt decide just requested (None: decide's own)."""
        previous = run.job.attempts[-2] if len(run.job.attempts) > 1 else None
        if policy == "skip-preempted" and previous is not None and previous.end_reason is EndReason.PREEMPTED:
            return zones[(zones.index(previous.zone) + 1) % len(zones)]
        return None

    def feed(i: int, event: JobEvent, now: float) -> None:
        run = runs[i]
        before = run.record.next_attempt_at if run.record is not None else None
        new, actions = decided(run.record, event, now)
        run.record = new
        creates = [action for action in actions if isinstance(action, CreateMachine)]
        if creates:
            run.interval_s = checkpoint_interval_s(creates[-1].mtbi_s if policy == "respawn" else None)
            act_create(i, now)
        waits_until = new.next_attempt_at if new.status is Status.PENDING else None
        if waits_until is not None and waits_until != before:
            at(waits_until, i, "wake", 0)  # the sweep's listing that finds the backoff over

    def act_create(i: int, now: float) -> None:
        run = runs[i]
        current = run.job.current
        assert current is not None
        chosen = skip_preempted(run)
        if chosen is not None and chosen != current.zone:
            moved = replace(current, zone=chosen)
            run.record = replace(run.job.with_attempt(moved), zone_index=zones.index(chosen))
            current = moved
        trace, t = traces[current.zone], now + CREATE_DELAY_S
        if not trace.up(t):
            at(t + CREATE_FAIL_S, i, "refused", current.n)
            return
        run.up_since = t
        down = trace.down_at(t)
        if down > t + RESTART_S:
            at(t + RESTART_S, i, "started", current.n)
        at(down, i, "preempted", current.n)

    def machine_gone(run: Run, now: float, *, preempted: bool) -> None:
        current = run.job.current
        assert current is not None and run.up_since is not None
        run.machine_s[current.zone] = run.machine_s.get(current.zone, 0.0) + now - run.up_since
        run.productive_s += kept_training_s(now - run.up_since - RESTART_S, not preempted, run.interval_s)
        run.up_since = None

    for i, start in enumerate(starts):
        spec = JobSpec(job_id=f"job-{i}", machine=MACHINE, zones=zones, image="trainer:1", checkpoint_uri=f"gs://b/{i}",
                       ttl_s=int((days + 2) * DAY), hang_timeout_s=None)  # fmt: skip
        runs.append(Run(spec=spec, end_at=start + days * DAY))
        at(start, i, "submit", 0)

    while queue:
        now, _, i, what, attempt = heapq.heappop(queue)
        run = runs[i]
        if now >= run.end_at:
            continue
        if what == "submit":  # the first machine, placed with what the history knows by now
            feed(i, JobSubmitted(event_id=f"e{next(ids)}", time=now, spec=run.spec), now)
            continue
        current = run.job.current
        if what == "wake":
            if run.job.status is Status.PENDING:
                feed(i, MachinesObserved(event_id=f"e{next(ids)}", time=now, job_id=run.job.job_id, machines=()), now)
        elif current is None or attempt != current.n or current.ended:
            continue  # about an attempt decide already replaced
        elif what == "refused":
            event = CreateFailed(event_id=f"e{next(ids)}", time=now, job_id=run.job.job_id, attempt=attempt,
                                 kind=CreateFailure.CAPACITY, error="ZONE_RESOURCE_POOL_EXHAUSTED")  # fmt: skip
            feed(i, event, now)
        elif what == "started":
            feed(i, TrainerStarted(event_id=f"e{next(ids)}", time=now, job_id=run.job.job_id, attempt=attempt), now)
        elif what == "preempted":
            machine_gone(run, now, preempted=True)
            event = MachinePreempted(event_id=f"e{next(ids)}", time=now, job_id=run.job.job_id, attempt=attempt,
                                     machine=current.machine, zone=current.zone, project="p")  # fmt: skip
            feed(i, event, now)
    return _outcome(runs, days, price_per_h)


def _outcome(runs: list[Run], days: float, price_per_h: float) -> Outcome:
    for run in runs:  # the job's end: its machine's time so far, all of its training kept
        if run.up_since is not None:
            machine_gone_at_end(run)
    wall = len(runs) * days * DAY
    productive = sum(r.productive_s for r in runs)
    by_zone: dict[str, float] = {}
    for r in runs:
        for zone, s in r.machine_s.items():
            by_zone[zone] = by_zone.get(zone, 0.0) + s / HOUR
    machine_h = sum(by_zone.values())
    return Outcome(
        goodput=productive / wall,
        cost_per_productive_hour=machine_h * price_per_h / (productive / HOUR) if productive else math.inf,
        recoveries=sum(r.job.counters.preemptions for r in runs),
        capacity_errors=sum(r.job.counters.capacity_errors for r in runs),
        machine_hours_by_zone=dict(sorted(by_zone.items())),
        wall_hours=wall / HOUR,
        productive_hours=productive / HOUR,
        machine_hours=machine_h,
    )


def machine_gone_at_end(run: Run) -> None:
    current = run.job.current
    assert current is not None and run.up_since is not None
    run.machine_s[current.zone] = run.machine_s.get(current.zone, 0.0) + run.end_at - run.up_since
    run.productive_s += kept_training_s(run.end_at - run.up_since - RESTART_S, True, run.interval_s)
    run.up_since = None


def price_per_hour() -> tuple[float, str]:
    row = machine_price(dict(MACHINE.__dict__, kind=MACHINE.kind))
    rate = rate_per_h(PROVISIONING, row)
    if rate is None or row is None:
        return FALLBACK_PRICE_PER_H, f"${FALLBACK_PRICE_PER_H:.2f}/h (no row in respawn.prices)"
    return rate, f"${rate:.2f}/h Spot ({row.label})"


def combined(outcomes: list[Outcome], price_per_h: float) -> dict[str, object]:
    wall = sum(o.wall_hours for o in outcomes)
    productive = sum(o.productive_hours for o in outcomes)
    machine_h = sum(o.machine_hours for o in outcomes)
    return {
        "goodput": round(productive / wall, 4),
        "cost_per_productive_hour": round(machine_h * price_per_h / productive, 4) if productive else math.inf,
        "recoveries": sum(o.recoveries for o in outcomes),
        "capacity_errors": sum(o.capacity_errors for o in outcomes),
    }


def default_traces() -> Path:
    """`../shared/traces` beside the repository (or beside the worktree folder holding it)."""
    repo = Path(__file__).resolve().parents[1]
    for candidate in (repo.parent / "shared" / "traces", repo.parent.parent / "shared" / "traces"):
        if candidate.is_dir():
            return candidate
    return repo.parent / "shared" / "traces"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=default_traces())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args(argv)
    price, priced_as = price_per_hour()
    print(f"{args.jobs} jobs x {args.days:g} days per set, seed {args.seed}; {MACHINE.machine_type} at {priced_as}")
    default = checkpoint_interval_s(None)
    print(f"restart {RESTART_S:.0f}s, checkpoint cost {CHECKPOINT_COST_S:.0f}s every sqrt(2 x cost x MTBI) of training"
          f" ({default:.0f}s at the trainer's default MTBI {TRAINER_DEFAULT_MTBI_S:.0f}s)")  # fmt: skip
    per_set: dict[str, dict[str, object]] = {}
    totals: dict[str, list[Outcome]] = {p: [] for p in POLICIES}
    for name, traces in trace_sets(args.traces).items():
        print(f"\n{name}: zones {', '.join(traces)}")
        print(f"  {'policy':<19}{'goodput':>9}{'$/prod h':>10}{'recov':>7}{'stockout':>9}  machine-hours by zone")
        outcomes = {}
        for policy in POLICIES:
            o = simulate(traces, policy, jobs=args.jobs, days=args.days, seed=args.seed, price_per_h=price)
            outcomes[policy] = o
            totals[policy].append(o)
            hours = " ".join(f"{z}={h:.0f}" for z, h in o.machine_hours_by_zone.items())
            print(f"  {policy:<19}{o.goodput:>9.3f}{o.cost_per_productive_hour:>10.3f}{o.recoveries:>7}"
                  f"{o.capacity_errors:>9}  {hours}")  # fmt: skip
        per_set[name] = {"policies": {p: o.summary() for p, o in outcomes.items()}}
    result = {"policies": {p: combined(totals[p], price) for p in POLICIES}, "sets": per_set}
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
