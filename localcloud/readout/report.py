"""The report of a local run, computed from its timeline and the final job record (pure functions).

Definitions:
  preemption      the moment a machine was PREEMPTED and its system event emitted (after the trainer's save); with a
                  head start, its notice (the next machine was requested before the machine was PREEMPTED, or it was
                  deleted at its final save and never marked): each `recovery` row says which (`from`)
  recovery_create_s      preemption -> the next create call the cloud API received
  recovery_first_step_s  preemption -> the first training step of a later attempt, split into create_s, queue_s
                  (create call -> the node exists: a queued resource's wait in the queue, 0 for a node create),
                  boot_s (node created -> its trainer process starts) and start_s (process start -> first step:
                  imports, compile, restore)
  lost_steps      steps trained twice: for every attempt that started after another had trained, the furthest
                  step reached before it started minus the step it restored (its `started` entry's, or for a
                  program that sends none, the step before its first progress line)
  goodput         productive training seconds / wall seconds from submit to the end (a job of several slices:
                  productive slice-seconds / the seconds its slices' machines were READY, the time they are paid); the
                  badput categories are the trainers' own splits (startup, restore, checkpoint, wasted) plus
                  `idle_s`, the wall time no trainer accounted for (no machine yet, machine booting, recovery gaps)
  cost            machine time (READY until preempted or deleted) at the Spot and on-demand prices of prices.py;
                  `tiers`: each tier's machine time at its own rate (Spot for spot/preemptible, else on-demand)
  hosts           worker VMs of the job's machine (a TPU slice's hosts; 1 for a GPU VM): trainer processes per attempt
  zones           one row per attempt: its zone, tier, end, restored step, time queued, and `api`, the API that
                  provisioned its machine: "tpu" (Cloud TPU nodes and queued resources) or "compute" (Compute
                  Engine instances, and managed instance groups for slices); `machine`, the machine type it ran on
                  (its tier's machine where the tier names one: a3-highgpu-8g(8xnvidia-h100-80gb))
  hangs_detected  attempts the control plane ended as hung (no progress for the job's hang_timeout)
  failures        the job record's failure counter (trainer failures, at most one per attempt)
  by_zone         one row per zone the job used (its listed zones first): `attempts` there, `machine_s` (READY
                  machine seconds, as `machine_hours`), `interruptions` (preemption notices and host errors the cloud
                  sent its machines) and `productive_steps`, the steps its attempts trained that the final parameters
                  keep: an attempt's run from the step it restored to the step the next attempt restored (the last
                  attempt: to the final step), so the rows add up to the final step
  history         what the deployment's preemption history (placement/history.json, kept by the functions) says at
                  the end of each zone the job allows, per tier's provisioning model: machine_s and interruptions
                  (decayed), and mtbi_s, the expected seconds to the next interruption placement reads; each
                  `zones` row has the attempt's `placement`, decide's one-line reason for its zone ("" in list order)
  chaos           the worker chaos injected: kill-worker, hang-worker, host-error (machine, worker, time)
  mtbi_realized_s  READY machine seconds (each machine until its notice or deletion) per preemption notice: the
                  mean time between interruptions the run saw, beside the --mtbi it asked for; null without notices
  max_live_machines  the most machines live (CREATING/READY) at once: a slice counts once, whatever its hosts
  machines_left   every object of the attempts the local APIs still hold at the end (nodes, queued resources,
                  instances, managed instance groups, instance templates, workload policies, resize requests): 0
  examples        a trainer reading a dataset (`examples` {from, to} in its checkpoint/stopped/completed entries: the
                  positions of its data stream trained into that save): per attempt (per world in a job of several
                  slices), its first position to the end of its last save; `trained` (the spans' total), `once`,
                  `repeated` (positions kept from more than one attempt) and `skipped` (positions before the last
                  one no attempt kept); null when no trainer says
  exact           the final params_sha256 equals the uninterrupted reference run's; null (unknown) when there is no
                  reference hash, `exact_reason` saying why (no reference run, it failed, the program sends no hash)
  exactness       "bitwise" (exact), "data-exact" (a world of several slices whose params differ but whose steps
                  were each trained once, in order, and whose final loss is within `loss_tolerance` of the
                  reference's `reference_final_loss`), "no", or "unknown"; with `slices` and `worlds` (each world
                  that trained: version, members, the step it started from): readout/worlds.py
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from localcloud.machines.slices import SINGLE_HOST, LocalSlice, report_line
from localcloud.readout.worlds import exact_line, exactness_fields, shape_words, slice_line, worlds_line
from respawn.accounting import later_split, parse_split, sum_splits
from respawn.facts import recoveries as record_recoveries
from respawn.jobs import Attempt, EndReason, JobSpec, machine_from_dict, machine_words
from respawn.outlook import History, Key, Outlook
from respawn.prices import MachinePrice, cost, rate_per_h

LIVE_STATES = frozenset({"CREATING", "READY", "STARTING", "PROVISIONING", "STAGING", "RUNNING", "RESTARTING"})


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100), rounded to the millisecond; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return round(ordered[rank - 1], 3)


def max_live_machines(events: list[dict[str, Any]]) -> int:
    """The most machines in a live state (CREATING/READY) at the same moment, from the cloud's state changes."""
    live: set[str] = set()
    most = 0
    for e in sorted(events, key=lambda e: e["t"]):
        if e["kind"] == "state":
            if e["state"] in LIVE_STATES:
                live.add(e["machine"])
            else:
                live.discard(e["machine"])
        elif e["kind"] in ("deleted", "preempted"):
            live.discard(e["machine"])
        most = max(most, len(live))
    return most


CHAOS_KINDS = {"kill_worker": "kill-worker", "hang_worker": "hang-worker", "host_error": "host-error"}


def chaos_rows(events: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    return [
        {"action": CHAOS_KINDS[e["kind"]], "machine": e.get("machine"), "worker": e.get("worker"), "at_s": e["t"] - t0}
        for e in events
        if e["kind"] in CHAOS_KINDS
    ]


def _attempt_of(e: dict[str, Any]) -> int:
    return int(e.get("attempt") or 0)


def lost_steps(events: list[dict[str, Any]]) -> int:
    """Steps trained twice. Where an attempt starts comes from its `started` entry, or for a program that sends
    none, from its first progress line (step k: it began after step k - 1). In a job of several slices an attempt
    (one slice's machine) trains in several worlds, each restarting from a save: a world's first `started` entry
    counts as an attempt's does (its other member slices' say the same)."""
    furthest = -1
    lost = 0
    begun: set[Any] = set()  # attempts, and worlds ("world", V), whose starting step was counted
    for e in events:
        if e["kind"] == "step":
            if _attempt_of(e) not in begun and furthest >= 0:
                lost += max(0, furthest - (int(e["step"]) - 1))
            begun.add(_attempt_of(e))
            furthest = max(furthest, int(e["step"]))
        elif e["kind"] == "entry":
            p = e["payload"]
            world = ("world", p["world"]) if isinstance(p.get("world"), int) else None
            if p.get("event") == "started" and (world or _attempt_of(e)) not in begun and furthest >= 0:
                restored = int(p.get("restored_step") or 0)
                lost += max(0, furthest - restored)
            if p.get("event") == "started":
                begun.update(k for k in (_attempt_of(e), world) if k is not None)
            if isinstance(p.get("step"), int) and p.get("event") in ("checkpoint", "stopped", "completed"):
                furthest = max(furthest, int(p["step"]))
    return lost


def recoveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per preemption: the machine, how long the trainer took to stop, and the two recovery latencies.

    Measured from the moment the machine was PREEMPTED, or from its notice where the next machine was requested
    before that or the machine was deleted before it was marked (a head start: `from` says which). A notice whose
    machine was neither marked nor replaced (the job ended meanwhile) is no recovery."""
    attempts = {e["machine"]: _attempt_of(e) for e in events if e["kind"] == "trainer_start"}
    created = _first_times(events, "state", state="CREATING")
    started = _first_times(events, "trainer_start")
    rows = []
    for n in (e for e in events if e["kind"] == "notice"):
        tn, attempt = n["t"], attempts.get(n["machine"], 0)
        marked = next((e["t"] for e in events if e["kind"] == "preempted" and e["machine"] == n["machine"]), None)
        called = next((e["t"] for e in events if e["kind"] == "create_call" and e["t"] >= tn), None)
        head_start = called is not None and (marked is None or called < marked)
        if marked is None and not head_start:
            continue
        tp = marked if marked is not None and not head_start else tn
        create = next((e["t"] for e in events if e["kind"] == "create_call" and e["t"] >= tp), None)
        first = next((e for e in events if e["kind"] == "step" and e["t"] >= tp and _attempt_of(e) > attempt), None)
        made, began = (created.get(first["machine"]), started.get(first["machine"])) if first else (None, None)
        rows.append(
            {
                "machine": n["machine"],
                "zone": n.get("zone"),
                "at_s": tp,
                "from": "notice" if head_start else "preempted",
                "stop_s": marked - tn if marked is not None else None,
                "create_s": create - tp if create is not None else None,
                "queue_s": _gap(create, made),
                "boot_s": _gap(made, began),
                "start_s": _gap(began, first["t"] if first else None),
                "first_step_s": first["t"] - tp if first is not None else None,
            }
        )
    return rows


def _first_times(events: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, float]:
    """machine -> the time of its first event of `kind` (with these field values)."""
    times: dict[str, float] = {}
    for e in events:
        if e["kind"] == kind and all(e.get(k) == v for k, v in match.items()):
            times.setdefault(str(e.get("machine")), e["t"])
    return times


def _gap(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(0.0, end - start)


def _goodput(productive_s: float, wall_s: float, paid_s: float, slices: int) -> float:
    """Productive over wall time; for a job of several slices, productive slice-time over paid slice-time (every
    slice trains at once, and a slice that is gone is not paid)."""
    over = paid_s if slices > 1 else wall_s
    return round(productive_s / over, 4) if over else 0.0


def goodput_split(events: list[dict[str, Any]], wall_s: float) -> dict[str, float]:
    """Seconds per category: the sum of every attempt's final split (one per attempt, as the job record keeps them:
    respawn/accounting.py), plus idle_s (wall time no trainer covered)."""
    final: dict[int, dict[str, float]] = {}
    for e in events:
        split = parse_split(e["payload"].get("goodput")) if e["kind"] == "entry" else None
        if split is None:
            continue
        n = _attempt_of(e) or int(e["payload"].get("attempt") or 0)
        if later_split(split, final.get(n)):
            final[n] = split
    total = sum_splits(final.values())
    total["idle_s"] = max(0.0, wall_s - total["total_s"])
    return total


def machine_seconds(
    events: list[dict[str, Any]], end: float, until: tuple[str, ...] = ("deleted", "preempted")
) -> dict[str, float]:
    """machine -> seconds it was READY (until an event of a kind in `until`, or another state)."""
    ready_since: dict[str, float] = {}
    used: dict[str, float] = {}
    for e in events:
        name = str(e.get("machine"))
        if e["kind"] == "state" and e["state"] == "READY":
            ready_since.setdefault(name, e["t"])
        elif name in ready_since and (e["kind"] in until or e["kind"] == "state"):
            used[name] = used.get(name, 0.0) + e["t"] - ready_since.pop(name)
    for name, t in ready_since.items():
        used[name] = used.get(name, 0.0) + end - t
    return used


def restored_steps(job: dict[str, Any], events: list[dict[str, Any]]) -> dict[int, int]:
    """attempt -> the step its trainer began from: the record's restored step, else its `started` entry's, else (a
    program that sends none) the step before its first progress line; attempts that never trained are absent."""
    began: dict[int, int] = {}
    for e in events:
        if e["kind"] == "entry" and e["payload"].get("event") == "started" and _attempt_of(e):
            began.setdefault(_attempt_of(e), int(e["payload"].get("restored_step") or 0))
        elif e["kind"] == "step" and _attempt_of(e):
            began.setdefault(_attempt_of(e), int(e["step"]) - 1)
    for a in job.get("attempts") or ():
        if a.get("restored_step") is not None and a["n"] in began:
            began[a["n"]] = int(a["restored_step"])
    return began


def productive_steps(began: dict[int, int], final_step: int | None) -> dict[int, int]:
    """attempt -> the steps it trained that the final parameters keep (see `by_zone` above)."""
    order = sorted(began)
    kept: dict[int, int] = {}
    for i, n in enumerate(order):
        until = began[order[i + 1]] if i + 1 < len(order) else final_step
        kept[n] = max(0, (until if until is not None else began[n]) - began[n])
    return kept


def zone_rows(
    job: dict[str, Any], events: list[dict[str, Any]], used: dict[str, float], final_step: int | None
) -> list[dict[str, Any]]:
    """Per zone: attempts, READY machine seconds, interruptions and productive steps (see `by_zone` above)."""
    spec = job.get("spec") or {}
    listed = [*spec.get("zones", ()), *(z for tier in spec.get("tiers") or () for z in tier.get("zones", ()))]
    attempts = job.get("attempts") or ()
    zone_of = {str(e["machine"]): str(e["zone"]) for e in events if e.get("machine") and e.get("zone")}
    zone_of.update({str(a["machine"]): str(a["zone"]) for a in attempts if a.get("machine")})
    seen = [*(a["zone"] for a in attempts), *zone_of.values()]
    kept = productive_steps(restored_steps(job, events), final_step)
    rows = []
    for zone in dict.fromkeys([*listed, *seen]):
        here = [a for a in attempts if a["zone"] == zone]
        if not here and zone not in zone_of.values():
            continue
        rows.append(
            {
                "zone": zone,
                "attempts": len(here),
                "machine_s": round(sum(s for m, s in used.items() if zone_of.get(m) == zone), 3),
                "interruptions": sum(
                    1 for e in events if e["kind"] in ("notice", "host_error") and e.get("zone") == zone
                ),
                "productive_steps": sum(kept.get(a["n"], 0) for a in here),
            }
        )
    return rows


def history_rows(history: History | None, record_spec: dict[str, Any] | None, now: float) -> list[dict[str, Any]]:
    """Per allowed zone and tier provisioning model of the record's spec: the history's decayed evidence and the MTBI
    placement reads."""
    if history is None or not record_spec:
        return []
    spec = JobSpec.from_dict(record_spec)
    outlook, kind, rows = Outlook(history), spec.machine.type_name, []
    for provisioning in dict.fromkeys(t.provisioning for t in spec.all_tiers):
        for zone in dict.fromkeys(z for t in spec.all_tiers if t.provisioning == provisioning for z in t.zones):
            seen = history.exposure(Key(zone, kind, provisioning), now)
            rows.append(
                {
                    "zone": zone,
                    "provisioning": provisioning,
                    "machine_s": round(seen.seconds, 3),
                    "interruptions": round(seen.interruptions, 3),
                    "mtbi_s": round(outlook.mtbi_s(zone, kind, provisioning, now), 1),
                }
            )
    return rows


def machine_api(job: dict[str, Any]) -> str:
    """The API that provisions the job's machines (every attempt's): the machine's `api`; a GPU VM is Compute
    Engine's, and a TPU record written before machines had an `api` went through the Cloud TPU API."""
    machine = (job.get("spec") or {}).get("machine") or {}
    return str(machine.get("api") or ("tpu" if machine.get("kind", "tpu") == "tpu" else "compute"))


def attempt_machine(job: dict[str, Any], tier: int) -> str | None:
    """The machine type an attempt of tier `tier` ran on (a tier may name its own), as respawn status says it."""
    spec = job.get("spec") or {}
    tiers = spec.get("tiers") or ()
    machine = (tiers[tier].get("machine") if 0 <= tier < len(tiers) else None) or spec.get("machine")
    try:
        return machine_words(machine_from_dict(machine)) if machine else None
    except (KeyError, TypeError):  # a record this build cannot read as a machine: the row names none
        return None


def tier_costs(job: dict[str, Any], used: dict[str, float], price: MachinePrice | None) -> list[dict[str, Any]]:
    """Each tier of the job: its provisioning model, how long its machines ran and what that cost at its rate."""
    spec = job.get("spec") or {}
    tiers = spec.get("tiers") or [{"provisioning": spec.get("provisioning", "spot"), "zones": spec.get("zones", [])}]
    rows = []
    for i, tier in enumerate(tiers):
        seconds = sum(used.get(a.get("machine", ""), 0.0) for a in job.get("attempts") or () if a.get("tier", 0) == i)
        rate = rate_per_h(tier["provisioning"], price)
        rows.append(
            {
                "tier": i,
                "provisioning": tier["provisioning"],
                "attempts": sum(1 for a in job.get("attempts") or () if a.get("tier", 0) == i),
                "machine_hours": round(seconds / 3600, 5),
                "cost_usd": None if rate is None else round(seconds / 3600 * rate, 4),
            }
        )
    return rows


def build(
    *,
    events: list[dict[str, Any]],
    job: dict[str, Any] | None,
    reference_sha: str | None,
    machines_left: int,
    leftover_processes: int,
    price: MachinePrice | None,
    timed_out: bool,
    machine_slice: LocalSlice = SINGLE_HOST,
    reference_note: str = "no reference run",
    history: History | None = None,
    slices: int = 1,
    reference_loss: float | None = None,
) -> dict[str, Any]:
    """The report; `reference_note` says why there is no `reference_sha` (exact is then unknown); `history` is the
    preemption history the run left (None: not read); `slices`, the job's (a world of several: worlds.py), and
    `reference_loss`, the reference's final loss, which a world's data-exactness is held to."""
    events = sorted(events, key=lambda e: e["t"])
    t0 = next((e["t"] for e in events if e["kind"] == "submitted"), events[0]["t"] if events else 0.0)
    completed = [e for e in events if e["kind"] == "entry" and e["payload"].get("event") == "completed"]
    end = completed[-1]["t"] if completed else (events[-1]["t"] if events else t0)
    wall = max(0.0, end - t0)
    job = job or {}
    counters = job.get("counters") or {}
    result = final_result(job, completed)
    sha = result.get("params_sha256")
    rows = recoveries(events)
    split = goodput_split(events, wall)
    used = machine_seconds(events, end)
    hours = sum(used.values()) / 3600
    steps = [e["step"] for e in events if e["kind"] == "step"]
    notices = sum(1 for e in events if e["kind"] == "notice")
    lived = sum(machine_seconds(events, end, until=("deleted", "preempted", "notice")).values())
    final_step = result.get("step", max(steps) if steps else None)
    return {
        "job_id": job.get("job_id"),
        "status": "TIMEOUT" if timed_out and not job.get("status") else job.get("status", "UNKNOWN"),
        "timed_out": timed_out,
        "reason": job.get("reason", ""),
        "image": (job.get("spec") or {}).get("image"),  # the record's: the job's own, or the deployment's of its kind
        "attempts": len(job.get("attempts") or ()),
        "hosts": machine_slice.hosts,
        "preemptions": counters.get("preemptions", 0),
        "preemptions_injected": notices,
        "mtbi_realized_s": round(lived / notices, 3) if notices else None,
        "failures": counters.get("failures", 0),
        "hangs_detected": sum(1 for a in job.get("attempts") or () if a.get("end_reason") == EndReason.HUNG),
        "chaos": [{**row, "at_s": round(row["at_s"], 3)} for row in chaos_rows(events, t0)],
        "capacity_errors": counters.get("capacity_errors", 0),
        "zones": attempt_rows(job, events),
        "by_zone": zone_rows(job, events, used, final_step),
        "history": history_rows(history, job.get("spec"), end),
        "tiers": tier_costs(job, used, price),
        "final_step": final_step,
        "final_loss": result.get("final_loss"),
        "lost_steps": lost_steps(events),
        "wall_s": round(wall, 3),
        "goodput": _goodput(split["productive_s"], wall, sum(used.values()), slices),
        "goodput_s": {k: round(v, 3) for k, v in split.items()},
        **recovery_figures(rows, job),
        "machine_hours": round(hours, 5),
        "cost": cost(hours, price),
        "params_sha256": sha,
        "reference_sha256": reference_sha,
        **exactness_fields(
            events=events,
            sha=sha,
            reference={"sha": reference_sha, "note": reference_note, "final_loss": reference_loss},
            final_step=final_step,
            final_loss=result.get("final_loss"),
            slices=slices,
        ),
        "examples": example_counts(events),
        "max_live_machines": max_live_machines(events),
        "machines_left": machines_left,
        "processes_left": leftover_processes,
    }


def final_result(job: dict[str, Any], completed: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's result: the record's, else the last `completed` entry's. Where the record holds what the startup
    script's exit code said, the trainer's own entry of that attempt fills it in (it may come after the record was
    read)."""
    result: dict[str, Any] = job.get("result") or (completed[-1]["payload"] if completed else {})
    if result.get("source") == "exit-code":
        last = completed[-1].get("attempt") if completed else None
        own = [e["payload"] for e in completed if e.get("attempt") == last and e["payload"].get("source") is None]
        result = own[-1] if own else result
    return result


def attempt_rows(job: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per attempt of the record: where it ran, how it ended, how long it queued (see `zones` above)."""
    created = _first_times(events, "state", state="CREATING")
    calls = _first_times(events, "create_call")
    return [
        {
            "attempt": a["n"],
            "zone": a["zone"],
            "tier": a.get("tier", 0),
            "end": a.get("end_reason"),
            "restored_step": a.get("restored_step"),
            "queue_s": _gap(calls.get(a.get("machine", "")), created.get(a.get("machine", ""))),
            "api": machine_api(job),
            "machine": attempt_machine(job, a.get("tier", 0)),
            "placement": a.get("placement", ""),
            "error": a.get("error", ""),  # why its create failed (a zone that does not offer the machine)
        }
        for a in job.get("attempts") or ()
    ]


def recovery_figures(rows: list[dict[str, Any]], job: dict[str, Any]) -> dict[str, Any]:
    """The `recovery` rows, the record's own figures, the two recovery latencies of every row and their percentiles,
    and the median of each step."""
    create = [r["create_s"] for r in rows if r["create_s"] is not None]
    first = [r["first_step_s"] for r in rows if r["first_step_s"] is not None]
    return {
        "recovery": rows,
        # the control plane's own figure per recovered attempt (its record: preempted attempt ended -> next trainer
        # started), which the recovery_duration metric counts
        "recovered_s": {
            str(n): v for n, v in record_recoveries([Attempt.from_dict(a) for a in job.get("attempts") or ()]).items()
        },
        "recovery_create_s": [round(v, 3) for v in create],
        "recovery_first_step_s": [round(v, 3) for v in first],
        "recovery_create_p50_s": percentile(create, 50),
        "recovery_create_p95_s": percentile(create, 95),
        "recovery_first_step_p50_s": percentile(first, 50),
        "recovery_first_step_p95_s": percentile(first, 95),
        "recovery_split_p50_s": {
            k: percentile([r[k] for r in rows if r[k] is not None], 50)
            for k in ("create_s", "queue_s", "boot_s", "start_s")
        },
    }


def example_counts(events: list[dict[str, Any]]) -> dict[str, int] | None:
    """How often each position of the data stream was trained into the final parameters: each attempt's span from
    its first position to the end of its last save (its `stopped`/`completed`, else its newest `checkpoint`: the
    steps an attempt killed without a save trained after it are trained again by the next one). In a job of several
    slices the span is each world's (every member slice says the same global positions, and a survivor's attempt
    trains in several worlds)."""
    kept: dict[Any, tuple[int, int]] = {}
    for e in events:
        payload = e["payload"] if e["kind"] == "entry" else {}
        span = payload.get("examples") if payload.get("event") in ("checkpoint", "stopped", "completed") else None
        if isinstance(span, dict) and isinstance(span.get("from"), int) and isinstance(span.get("to"), int):
            key = ("world", payload["world"]) if "world" in payload else _attempt_of(e) or payload.get("attempt")
            kept[key] = (span["from"], max(span["to"], kept.get(key, (0, 0))[1]))
    spans = {(key, a, b) for key, (a, b) in kept.items()}
    if not spans:
        return None
    edges = sorted({0, *(a for _, a, _ in spans), *(b for _, _, b in spans)})
    counts = {"trained": sum(b - a for _, a, b in spans), "once": 0, "repeated": 0, "skipped": 0}
    for lo, hi in itertools.pairwise(edges):
        times = sum(1 for _, a, b in spans if a <= lo and hi <= b)
        counts["skipped" if times == 0 else "once" if times == 1 else "repeated"] += hi - lo
    return counts


def _seconds(v: float | None) -> str:
    """A duration of the recovery lines, `-` where it was not measured."""
    return "-" if v is None else f"{v:.2f}s"


def render(r: dict[str, Any]) -> str:
    """The report as text for a person."""
    sections = (_run_lines, _what_happened_lines, _recovery_lines, _cost_lines, _outcome_lines)
    return "\n".join(line for section in sections for line in section(r))


def _run_lines(r: dict[str, Any]) -> list[str]:
    """The job's end, its attempts and zones, its steps and where its time went."""
    g = r["goodput_s"]
    return [
        f"job {r['job_id']}"
        + (f" ({shape})" if (shape := shape_words(r.get("slices") or 1, r["hosts"])) else "")
        + f": {r['status']}"
        + (f" ({r['reason']})" if r["reason"] else ""),
        f"  attempts {r['attempts']}, preemptions survived {r['preemptions']} (injected {r['preemptions_injected']}"
        + (f", one per {r['mtbi_realized_s']:.0f}s of machine time" if r["mtbi_realized_s"] else "")
        + "), "
        f"capacity errors {r['capacity_errors']}, failures {r['failures']}, hangs detected {r['hangs_detected']}",
        "  zones    "
        + " -> ".join(
            f"a{z['attempt']} {z['zone']} {z['api']}"
            + (f" tier {z['tier']}" if len(r["tiers"]) > 1 else "")
            + (f" on {z['machine']}" if z.get("machine") else "")
            + (f" queued {z['queue_s']:.0f}s" if (z["queue_s"] or 0) >= 0.5 else "")
            + f" ({z['end'] or 'live'})"
            for z in r["zones"]
        ),
        *(
            f"  zone     {z['zone']}: {z['attempts']} attempts, {z['machine_s']:.0f}s machine time, "
            f"{z['interruptions']} interruptions, {z['productive_steps']} productive steps"
            for z in r["by_zone"]
        ),
        f"  steps    {r['final_step']} (final loss {r['final_loss']}), lost steps {r['lost_steps']}",
        f"  wall     {r['wall_s']:.1f}s, goodput {100 * r['goodput']:.1f}%",
        "  time     "
        + ", ".join(f"{k.removesuffix('_s')} {g[k]:.1f}s" for k in ("productive_s", "startup_s", "restore_s"))
        + ", "
        + ", ".join(f"{k.removesuffix('_s')} {g[k]:.1f}s" for k in ("checkpoint_s", "input_s", "wasted_s", "idle_s")),
    ]


def _what_happened_lines(r: dict[str, Any]) -> list[str]:
    """The data trained, each placement, the zones' history, the notices and secrets, the slice and its chaos."""
    lines = []
    if x := r.get("examples"):
        lines.append(
            f"  examples {x['trained']} trained: {x['once']} once, {x['repeated']} repeated, {x['skipped']} skipped"
        )
    for a in r["zones"]:
        if a.get("placement"):
            lines.append(f"  placed   a{a['attempt']} {a['placement']}")
    for h in r.get("history") or ():
        lines.append(
            f"  history  {h['zone']} {h['provisioning']}: {h['interruptions']:g} interruptions in "
            f"{h['machine_s']:.0f} machine-seconds (decayed): expected {h['mtbi_s'] / 3600:.1f}h to the next"
        )
    if r.get("notifications") is not None:
        lines.append(f"  notices  {r['notifications']} status notices on respawn-status (status.jsonl)")
    if r.get("secrets"):
        sec = r["secrets"]
        lines.append(
            f"  secrets  held by {sec['delivered']} of {sec['trainers']} trainer processes; "
            + (f"LEAKED into {', '.join(sec['leaks'])}" if sec["leaks"] else "in no file under the workdir or on GCS")
        )
    if (r.get("slices") or 1) > 1:
        lines.append(slice_line(r))
        lines.extend(line for line in [worlds_line(r)] if line)
    elif hosts_line := report_line(r["hosts"]):
        lines.append(hosts_line)
    for c in r["chaos"]:
        lines.append(f"  chaos    {c['action']} worker {c['worker']} of {c['machine']} at {c['at_s']:.1f}s")
    return lines


def _recovery_lines(r: dict[str, Any]) -> list[str]:
    """Each recovery's steps, then the percentiles of the two latencies."""
    lines = []
    for row in r["recovery"]:
        took = {k: _seconds(row[k]) for k in ("stop_s", "create_s", "queue_s", "boot_s", "start_s", "first_step_s")}
        lines.append(
            f"  recovery {row['machine']}: stopped in {took['stop_s']}, create after {took['create_s']}, "
            f"queued {took['queue_s']}, booted {took['boot_s']}, trainer start {took['start_s']}: "
            f"first step after {took['first_step_s']}"
        )
    if r["recovery"]:
        p50_p95 = {
            k: f"{_seconds(r[f'recovery_{k}_p50_s'])}/{_seconds(r[f'recovery_{k}_p95_s'])}"
            for k in ("create", "first_step")
        }
        lines.append(f"  recovery p50/p95: create {p50_p95['create']}, first step {p50_p95['first_step']}")
    return lines


def _cost_lines(r: dict[str, Any]) -> list[str]:
    """The machine time at Spot and on-demand prices, and each tier's at its own where there are several."""
    c = r["cost"]
    if c:
        saved = 100 * (1 - c["spot_usd"] / c["on_demand_usd"]) if c["on_demand_usd"] else 0.0
        lines = [
            f"  cost     ${c['spot_usd']:.4f} at Spot vs ${c['on_demand_usd']:.4f} on-demand ({saved:.0f}% less) "
            f"for {r['machine_hours'] * 3600:.0f} machine-seconds; {c['priced_as']} [{c['prices_as_of']}]"
        ]
    else:
        lines = ["  cost     - (no price for this machine type in respawn/prices.py)"]
    if len(r["tiers"]) > 1:
        for t in r["tiers"]:
            cost = "-" if t["cost_usd"] is None else f"${t['cost_usd']:.4f}"
            lines.append(
                f"  tier {t['tier']}   {t['provisioning']}: {t['attempts']} attempts, "
                f"{t['machine_hours'] * 3600:.0f} machine-seconds, {cost}"
            )
    return lines


def _outcome_lines(r: dict[str, Any]) -> list[str]:
    """Whether the parameters are exact, and what was left behind."""
    exact = exact_line(r)
    cleanup = (
        f"  cleanup  machines left {r['machines_left']}, processes left {r['processes_left']}, "
        f"most live machines at once {r['max_live_machines']}"
    )
    return [exact, cleanup]
