"""Chaos for the local cloud: preemptions at fixed times or steps, or at a seeded mean time between interruptions.

`--preempt-at 40s,80s` counts from the moment the job message is published. At
each time the machine that is READY is preempted (with many jobs, one READY
machine drawn at random, seeded); when none is READY yet (the replacement is
still being created), the preemption waits for the next one that becomes READY.
`--preempt-at-step 150,300` preempts the READY machine whose trainer has reported
that training step (or a later one): the same run on a fast or a slow machine.
`--mtbi 60s` gives every machine a random lifetime, counted from the moment it
becomes READY, drawn in rounds of 10 machines: a round's lifetimes are the gaps
of a Poisson process with 10 interruptions in 10 x 60 s (uniform spacings,
seeded). Each lifetime is near-exponential with mean 60 s, and every round of
machines lives 600 s in all, so a short run sees the interruption rate it asked
for rather than its seed's luck (10 independent exponential draws average under
33 s or over 94 s one time in ten). Each of these preemptions comes with its
notice, which loses nothing. `--mtbi us-central1-a=20s,us-central1-c=5m` gives
each zone named its own rate (a zone not named: no such preemptions; a plain
DURATION beside them: every zone not named): the lifetime of a machine follows
its zone, each zone's rounds drawn from a stream of their own, so one zone's
machines do not change another's lifetimes.

Every preemption takes a whole machine, except on a Compute Engine slice: there each worker is its own Spot VM
of a managed instance group, and one VM is preempted (the others run on until respawn deletes the group). Which
VM is drawn from its own stream, seeded, so a run with the same seed preempts the same workers.

Worker chaos hits one worker (one host) of a slice, once worker 0 of the
READY node reports STEP (`STEP:WORKER`, comma-separated lists allowed):
`--kill-worker-at-step 300:2` SIGKILLs it (no notice; its startup script logs
`failed`), `--hang-worker-at-step 450:1` SIGSTOPs it (alive, no progress: only
hang detection finds it), `--host-error-at-step 600:3` is a host error of its VM
(TERMINATED: a TPU node whole, a Compute Engine slice's VM alone; the
`compute.instances.hostError` event; the process killed without a word). Step
actions, preemptions at steps included, fire in step order, each once, each on
a node no earlier step action hit.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localcloud.machines.slices import LocalSlice

MTBI_ROUND = 10  # machines per round of --mtbi lifetimes
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ChaosError(ValueError):
    """A chaos option that cannot be understood; str() names the option, the problem and what is allowed."""


def parse_duration(text: str, option: str) -> float:
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise ChaosError(
            f"{option}: {text!r} is not a duration; use a number with an optional unit ms, s, m or h (45s)"
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


_ZONE = re.compile(r"[a-z]+-[a-z]+\d+-[a-z]")


@dataclass(frozen=True)
class Mtbi:
    """`--mtbi`: the mean time between interruptions of a machine, by its zone. `every_s` is every zone's that
    `zones` does not name (None: those zones are never interrupted this way)."""

    every_s: float | None = None
    zones: Mapping[str, float] = field(default_factory=dict)

    def of(self, zone: str | None) -> float | None:
        """The MTBI of a machine in `zone` (None: not interrupted by --mtbi)."""
        return self.zones.get(zone, self.every_s) if zone is not None else self.every_s


def parse_mtbi(text: str, option: str = "--mtbi") -> Mtbi:
    """`60s` -> every zone; `us-central1-a=20s,us-central1-c=5m` -> those zones; both kinds may be mixed, the plain
    DURATION then counting for every zone not named."""
    allowed = (
        "allowed: one DURATION for every zone (60s), and/or ZONE=DURATION per zone, comma-separated "
        "(us-central1-a=20s,us-central1-c=5m)"
    )
    every: float | None = None
    zones: dict[str, float] = {}
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ChaosError(f"{option}: nothing given; {allowed}")
    for part in parts:
        zone, eq, duration = (piece.strip() for piece in part.rpartition("="))
        if eq and not _ZONE.fullmatch(zone):
            raise ChaosError(f"{option}: {zone!r} in {part!r} is not a zone; {allowed}")
        if not _DURATION.fullmatch(duration):
            raise ChaosError(
                f"{option}: {duration!r} in {part!r} is not a duration (a number with an optional unit ms, s, m or h); "
                + allowed
            )
        seconds = parse_duration(duration, option)
        if not seconds > 0:
            raise ChaosError(f"{option}: {part!r} is not a positive duration; {allowed}")
        if not eq:
            if every is not None:
                raise ChaosError(f"{option}: two durations for every zone ({every:g}s and {part!r}); {allowed}")
            every = seconds
        elif zone in zones:
            raise ChaosError(f"{option}: {zone} is given twice; {allowed}")
        else:
            zones[zone] = seconds
    return Mtbi(every, zones)


def parse_times(text: str, option: str = "--preempt-at") -> list[float]:
    times = [parse_duration(part, option) for part in text.split(",") if part.strip()]
    if not times:
        raise ChaosError(f"{option}: no time given; use a comma-separated list of durations (30s,75s)")
    return sorted(times)


def parse_steps(text: str, option: str = "--preempt-at-step") -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ChaosError(f"{option}: no step given; use a comma-separated list of training steps (250,550)")
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise ChaosError(f"{option}: {part!r} is not a step; use whole numbers of 1 or more (250,550)")
    return sorted(int(part) for part in parts)


_WORKER_STEP = re.compile(r"(\d+):(\d+)")


def parse_worker_steps(text: str, option: str) -> list[tuple[int, int]]:
    """`300:2,450:1` -> [(300, 2), (450, 1)] (step, worker), sorted by step."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ChaosError(f"{option}: nothing given; use a comma-separated list of STEP:WORKER (300:2)")
    found = []
    for part in parts:
        m = _WORKER_STEP.fullmatch(part)
        if not m or int(m.group(1)) < 1:
            raise ChaosError(
                f"{option}: {part!r} is not STEP:WORKER; use a training step of 1 or more and a worker number "
                "from 0 (300:2)"
            )
        found.append((int(m.group(1)), int(m.group(2))))
    return sorted(found)


def check_workers(option: str, pairs: list[tuple[int, int]], machine_slice: LocalSlice, machine: str) -> None:
    """Every worker named must exist in the job's machine (`machine` describes it: v5litepod-16)."""
    for step, worker in pairs:
        if not machine_slice.has_worker(worker):
            raise ChaosError(
                f"{option}: '{step}:{worker}' names worker {worker}, but {machine} has {machine_slice.hosts_phrase()}; "
                f"allowed: {machine_slice.workers_allowed()}"
            )


PREEMPT = "preempt"
KILL_WORKER = "kill-worker"
HANG_WORKER = "hang-worker"
HOST_ERROR = "host-error"
STEP_ACTIONS = (PREEMPT, KILL_WORKER, HANG_WORKER, HOST_ERROR)  # also the order of actions at the same step


@dataclass(frozen=True)
class StepAction:
    """Do `action` to `worker` of the READY node once its worker 0 reports `step`."""

    step: int
    action: str  # one of STEP_ACTIONS
    worker: int | None = None  # worker actions: always one; a preemption: the VM drawn, None for the whole machine


def step_actions(
    *,
    preempt: Sequence[int] = (),
    kill_worker: Sequence[tuple[int, int]] = (),
    hang_worker: Sequence[tuple[int, int]] = (),
    host_error: Sequence[tuple[int, int]] = (),
) -> list[StepAction]:
    """Every step action, in the order they fire: by step, then in STEP_ACTIONS order."""
    actions = [StepAction(s, PREEMPT) for s in preempt]
    for kind, pairs in ((KILL_WORKER, kill_worker), (HANG_WORKER, hang_worker), (HOST_ERROR, host_error)):
        actions += [StepAction(s, kind, w) for s, w in pairs]
    return sorted(actions, key=_order)


def _order(action: StepAction) -> tuple[int, int, int]:
    return action.step, STEP_ACTIONS.index(action.action), action.worker or 0


_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9-]{1,62}$")


def parse_stockout(text: str, option: str = "--stockout") -> tuple[str, int | None]:
    """`us-central1-a:2` -> node creates: the first 2 there fail; queued requests: each waits 2 s in the queue.
    `us-central1-a` -> every create there fails; every queued request there waits until deleted.
    `us-central1-a@a3-highgpu-8g` -> the same for creates of that machine type only (a Compute Engine machine type,
    or a TPU accelerator type): the key is `ZONE@TYPE`."""
    where, _, count = text.partition(":")
    zone, at, machine_type = where.partition("@")
    usage = "use ZONE[@MACHINE_TYPE][:N] (us-central1-a:1, us-central1-a@a3-highgpu-8g)"
    if not _ZONE.fullmatch(zone):
        raise ChaosError(f"{option}: {zone!r} is not a zone; {usage}")
    if at and not _MACHINE_TYPE.fullmatch(machine_type):
        raise ChaosError(f"{option}: {machine_type!r} is not a machine type; {usage}")
    if count and not count.isdigit():
        raise ChaosError(f"{option}: {count!r} is not a whole number; {usage}")
    return where, int(count) if count else None


def parse_unoffered(text: str) -> tuple[str, str]:
    """`us-east5-b:ct6e-standard-4t` -> the zone does not offer that machine type (or accelerator type: nvidia-l4,
    or a Cloud TPU accelerator type such as v6e-16): its listings leave it out and creates asking for it fail."""
    zone, _, type_name = text.partition(":")
    if not _ZONE.fullmatch(zone) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", type_name):
        raise ChaosError(f"--unoffered: {text!r} is not ZONE:TYPE (us-east5-b:ct6e-standard-4t)")
    return zone, type_name


def add_flags(run: argparse.ArgumentParser) -> None:
    """The chaos flags of `respawn local run`: preemptions, worker chaos, capacity and duplicate deliveries (read by
    `read_flags`)."""
    run.add_argument("--preempt-at", metavar="T1,T2", help="preempt the live machine at these times (e.g. 40s,80s)")
    run.add_argument(
        "--preempt-at-step",
        metavar="S1,S2",
        help="preempt the live machine once its trainer reports these training steps (e.g. 150,300)",
    )
    run.add_argument(
        "--kill-worker-at-step",
        metavar="STEP:WORKER",
        help="SIGKILL that worker of the slice once worker 0 reports STEP, without notice (e.g. 300:2)",
    )
    run.add_argument(
        "--hang-worker-at-step",
        metavar="STEP:WORKER",
        help="SIGSTOP that worker once worker 0 reports STEP: alive, no progress (e.g. 450:1)",
    )
    run.add_argument(
        "--host-error-at-step",
        metavar="STEP:WORKER",
        help="a host error on that worker's VM once worker 0 reports STEP: node TERMINATED, process gone (e.g. 600:3)",
    )
    run.add_argument(
        "--mtbi",
        metavar="[ZONE=]DURATION",
        help="mean time between interruptions per machine, in every zone (60s) or per zone "
        "(us-central1-a=20s,us-central1-c=5m)",
    )
    run.add_argument(
        "--stockout",
        metavar="ZONE[@MACHINE_TYPE][:N]",
        action="append",
        default=[],
        help="no capacity in ZONE: a TPU queued request waits N seconds there WAITING_FOR_RESOURCES, a node or "
        "VM create fails the next N times (without N: forever, every time); @MACHINE_TYPE: only creates of that "
        "machine type (a3-highgpu-8g) or TPU type; repeatable",
    )
    run.add_argument(
        "--spot-stockout",
        metavar="ZONE[@MACHINE_TYPE][:N]",
        action="append",
        default=[],
        help="the same for Spot and preemptible requests only (on-demand and reservations still get capacity)",
    )
    run.add_argument(
        "--unoffered",
        metavar="ZONE:TYPE",
        action="append",
        default=[],
        help="ZONE does not offer TYPE (a machine type such as ct6e-standard-4t, a GPU such as nvidia-l4, or a Cloud "
        "TPU accelerator type such as v6e-16), besides the zones Google's published tables give no such TPU or GPU "
        "(localcloud/apis/offerings.py): its type listings leave it out and creates that ask for it there are "
        "refused; repeatable",
    )
    run.add_argument(
        "--duplicate-deliveries",
        type=int,
        default=1,
        metavar="N",
        help="deliver every Pub/Sub message N times concurrently (default 1)",
    )
    run.add_argument(
        "--seed", type=int, default=0, help="seed of --mtbi and of the VMs of a Compute Engine slice preempted (0)"
    )


def read_flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The local cloud's options (cloud.Options fields) the chaos flags set; ChaosError names a flag that cannot be
    used."""
    if ns.duplicate_deliveries < 1:
        raise ChaosError("--duplicate-deliveries: must be 1 or more")
    stockouts = dict(parse_stockout(text) for text in ns.stockout)
    spot_stockouts = dict(parse_stockout(text, "--spot-stockout") for text in ns.spot_stockout)
    return {
        "preempt_at": parse_times(ns.preempt_at) if ns.preempt_at else [],
        "preempt_at_steps": parse_steps(ns.preempt_at_step) if ns.preempt_at_step else [],
        "kill_worker_at_steps": _worker_steps(ns.kill_worker_at_step, "--kill-worker-at-step"),
        "hang_worker_at_steps": _worker_steps(ns.hang_worker_at_step, "--hang-worker-at-step"),
        "host_error_at_steps": _worker_steps(ns.host_error_at_step, "--host-error-at-step"),
        "mtbi": parse_mtbi(ns.mtbi) if ns.mtbi is not None else None,
        "stockouts": stockouts,
        "spot_stockouts": spot_stockouts,
        "unoffered": _unoffered_types(ns.unoffered),
        "duplicate_deliveries": ns.duplicate_deliveries,
        "seed": ns.seed,
    }


def _worker_steps(text: str | None, option: str) -> list[tuple[int, int]]:
    return parse_worker_steps(text, option) if text is not None else []


def _unoffered_types(texts: list[str]) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for zone, type_name in (parse_unoffered(text) for text in texts):
        found[zone] = (*found.get(zone, ()), type_name)
    return found


class Chaos:
    """Preempts machines on a schedule. `ready()` lists (machine, became_ready_at) of READY machines; `step_of(machine)`
    is the last training step its trainer (worker 0) reported (None before the first). `actions` are worker chaos
    at steps, done by `act(machine, action)`; `at_steps` are preemptions at steps. A preemption is
    `preempt(machine, vm)`: `vms(machine)` says how many VMs it may take one of (a Compute Engine slice's workers),
    1 when it takes the whole machine (vm None). `mtbi` gives each machine a lifetime by its zone (`zone_of`; a plain
    number: every zone)."""

    def __init__(
        self,
        *,
        ready: Callable[[], list[tuple[str, float]]],
        preempt: Callable[[str, int | None], None],
        t0: float,
        at: list[float] | None = None,
        at_steps: list[int] | None = None,
        step_of: Callable[[str], int | None] = lambda name: None,
        mtbi: Mtbi | float | None = None,
        zone_of: Callable[[str], str | None] = lambda name: None,
        seed: int = 0,
        tick: float = 0.1,
        actions: list[StepAction] | None = None,
        act: Callable[[str, StepAction], None] = lambda name, action: None,
        vms: Callable[[str], int] = lambda name: 1,
    ) -> None:
        self._ready = ready
        self._preempt = preempt
        self._vms = vms
        self._t0 = t0
        self._at = list(at or [])
        self._steps = sorted([*step_actions(preempt=at_steps or ()), *(actions or ())], key=_order)
        self._hit: set[str] = set()  # machines a step action hit: the next one waits for another machine
        self._act = act
        self._step_of = step_of
        if isinstance(mtbi, int | float):  # one figure for every zone; 0 is none
            mtbi = Mtbi(every_s=float(mtbi)) if mtbi > 0 else None
        self._mtbi = mtbi
        self._zone_of = zone_of
        self._seed = seed
        # lifetimes: every zone's from one stream (as with one --mtbi for all), each named zone's from its own
        self._streams: dict[str | None, tuple[random.Random, list[float]]] = {None: (random.Random(seed), [])}
        self._pick = random.Random(f"pick-{seed}")  # its own stream: --mtbi draws do not depend on the picks
        self._vm_pick = random.Random(f"vm-{seed}")  # nor on which VM of a slice is taken
        self._deadlines: dict[str, float | None] = {}  # None: its zone has no --mtbi
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def start(self) -> Chaos:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def due(self, now: float) -> list[str]:
        """Machines to preempt now (advances the schedule; worker actions due now are dropped: see plan)."""
        return [name for name, action in self.plan(now) if action.action == PREEMPT]

    def plan(self, now: float) -> list[tuple[str, StepAction]]:
        """What to do now, to which machine (advances the schedule)."""
        live = self._ready()
        chosen: list[tuple[str, StepAction]] = []

        def preempt(name: str, step: int = 0) -> None:
            if all(n != name or a.action != PREEMPT for n, a in chosen):
                chosen.append((name, StepAction(step, PREEMPT, self._vm(name))))

        if self._at and now - self._t0 >= self._at[0] and live:
            self._at.pop(0)
            preempt(live[0][0] if len(live) == 1 else self._pick.choice(live)[0])
        if self._steps:
            head = self._steps[0].step
            reached = [n for n, _ in live if n not in self._hit and (self._step_of(n) or 0) >= head]
            if reached:  # every action at this step, on the first machine that reached it
                self._hit.add(reached[0])
                while self._steps and self._steps[0].step == head:
                    action = self._steps.pop(0)
                    if action.action == PREEMPT:
                        action = StepAction(action.step, PREEMPT, self._vm(reached[0]))
                    chosen.append((reached[0], action))
        if self._mtbi is not None:
            for name, ready_at in live:
                if name not in self._deadlines:
                    life = self._lifetime(self._zone_of(name))
                    self._deadlines[name] = None if life is None else ready_at + life
                deadline = self._deadlines[name]
                if deadline is not None and now >= deadline:
                    preempt(name)
        return chosen

    def _vm(self, name: str) -> int | None:
        """The VM a preemption of `name` takes: one drawn of a Compute Engine slice's, None for a whole machine."""
        vms = self._vms(name)
        return self._vm_pick.randrange(vms) if vms > 1 else None

    def _lifetime(self, zone: str | None) -> float | None:
        """The lifetime of the next machine in `zone`: the next gap of its stream's round of MTBI_ROUND interruptions
        in MTBI_ROUND x its MTBI; None when its zone has none."""
        assert self._mtbi is not None
        mtbi = self._mtbi.of(zone)
        if mtbi is None:
            return None
        key = zone if zone in self._mtbi.zones else None
        if key not in self._streams:
            self._streams[key] = (random.Random(f"mtbi-{self._seed}-{key}"), [])
        rng, lifetimes = self._streams[key]
        if not lifetimes:
            span = MTBI_ROUND * mtbi
            cuts = [0.0, *sorted(rng.uniform(0.0, span) for _ in range(MTBI_ROUND - 1)), span]
            lifetimes.extend(b - a for a, b in itertools.pairwise(cuts))
        return lifetimes.pop()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            for name, action in self.plan(time.time()):
                if action.action == PREEMPT:
                    self._preempt(name, action.worker)
                else:
                    self._act(name, action)
