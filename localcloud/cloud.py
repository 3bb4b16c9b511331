"""The local cloud: every piece of the deployed system on loopback, one job run through it to the end.

  fake-gcs-server        state bucket + checkpoint bucket (Orbax via TENSORSTORE_GCS_HTTP_URL)
  CloudApiServer         Cloud TPU v2 + Compute REST; a READY machine is a trainer process (nodes.py)
  Pub/Sub                the official emulator with push subscriptions, or the in-process bus (bus.py); on the
                         emulator the functions publish status notices to respawn-status, recorded (status.py)
  functions-framework    on_job_message and on_event from functions/main.py, unchanged
  Secret Manager         the values given for the job's secret references, into trainer environments only
  log router             the sink filter applied to every LogEntry -> respawn-events (router.py)
  Cloud Scheduler        a sweep tick every few seconds (scheduler.py)
  chaos                  preemptions at fixed times, steps or a seeded MTBI per zone; workers killed, hung or lost to a
                         host error at steps (chaos.py)

`run()` takes one job through it (`respawn local run`). For many jobs (bench/load_test.py):
`with LocalCloud(...) as cloud: cloud.start(buckets); cloud.start_chaos(t0); cloud.submit(message) ...`. For a fleet
(bench/bench_fleet.py), Options' fleet mode: machines as API state only, the functions as pools of one-request
instances, GCS behind a proxy with latency and a per-object write rate, every push recorded (services/proxy.py).
Everything started is torn down on exit, whatever happens, the trainers first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localcloud.apis.cloudapi import CloudApiServer, CloudMachine
from localcloud.chaos import Chaos, Mtbi, StepAction, step_actions
from localcloud.machines.nodes import Nodes
from localcloud.machines.profiles import MachineTimings
from localcloud.machines.slices import local_trainer_env
from localcloud.services.bus import Bus, Delivery, EmulatorBus, InProcessBus, PushPolicy, push_endpoint
from localcloud.services.emulators import FakeGcs, PubSubEmulator, patched_env
from localcloud.services.functions import FunctionServers
from localcloud.services.proxy import GcsProxy, PushRecorder
from localcloud.services.router import LogRouter
from localcloud.services.scheduler import SweepTicker
from localcloud.services.secret_store import check_trainers, secrets_report
from localcloud.services.status import STATUS_TOPIC, StatusRecorder
from localcloud.timeline import Timeline
from localcloud.watch import Run, follow, watch_calls
from respawn import bootstrap
from respawn.deployment import IMAGES, TIME_SCALE, Settings
from respawn.events import EXIT_CODE
from respawn.histories import current
from respawn.machine import TRAINER_IMAGES as TRAINER_IMAGE_NAMES

if TYPE_CHECKING:
    from respawn.adapters.gcs_store import GcsHistoryStore, GcsJobStore
    from respawn.outlook import History

PROJECT = "respawn-local"
STATE_BUCKET = "respawn-local-state"
JOBS_TOPIC = "respawn-jobs"
EVENTS_TOPIC = "respawn-events"
# respawn's trainer image of each machine kind in the local project's repository, the functions' RESPAWN_TRAINER_IMAGES:
# a job without `image` names the one of its machine's kind in its record (the local cloud runs the trainer itself)
TRAINER_IMAGES = {
    kind: f"us-docker.pkg.dev/{PROJECT}/respawn/{name}:latest" for kind, name in TRAINER_IMAGE_NAMES.items()
}


@dataclass
class Options:
    preempt_at: list[float] = field(default_factory=list)
    preempt_at_steps: list[int] = field(default_factory=list)
    kill_worker_at_steps: list[tuple[int, int]] = field(default_factory=list)  # (step, worker)
    hang_worker_at_steps: list[tuple[int, int]] = field(default_factory=list)
    host_error_at_steps: list[tuple[int, int]] = field(default_factory=list)
    mtbi: Mtbi | None = None  # --mtbi: machine lifetimes by zone
    # zone -> N: node/VM creates: the next N fail (None: all); TPU queued requests: each waits N s (None: forever)
    stockouts: dict[str, int | None] = field(default_factory=dict)
    spot_stockouts: dict[str, int | None] = field(default_factory=dict)  # the same, Spot/preemptible requests only
    unoffered: dict[str, tuple[str, ...]] = field(default_factory=dict)  # zone -> types it does not offer
    duplicate_deliveries: int = 1
    seed: int = 0
    creation_delay_s: float = 1.0  # create call -> READY (a queue's wait for capacity aside)
    machine_timings: MachineTimings = field(default_factory=MachineTimings)  # READY -> first step (profiles.py)
    # local seconds per real second of the recovery profile (profiles.py): the functions' RESPAWN_TIME_SCALE, so that
    # a head start's drain (a machine kind's real notice window) reads in the profile's time
    time_scale: float = 1.0
    grace_s: float = 25.0
    sweep_every_s: float = 5.0
    timeout_s: float = 1800.0
    workdir: Path = Path(".respawn")
    compile_cache: Path | None = None  # the machines' compilation cache (--compile-cache); None: WORKDIR/compile-cache
    progress_every_s: float = 5.0
    bus: str = "auto"  # auto (the emulator when it can run) | emulator | in-process
    entrypoint: list[str] | None = None  # run on every machine instead of `python -m trainer` (with the job's args)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # Secret Manager reference -> value
    uploads: list[tuple[Path, str]] = field(default_factory=list)  # --upload: (directory, gs:// prefix), a dataset
    stand_in: bool = True  # the machines' CPU processes stand in for their TPU or GPU (False: as a wrong image)
    # The fleet mode (bench/bench_fleet.py): machines as state only, no script or trainer (`trainers` False); each
    # function as a pool of one-request instances (entry point -> instances, Terraform's max_instance_count; none: one
    # threaded server), a request cut at `function_timeout_s`; with `gcs_latency_s`, the functions' storage calls go
    # through a GcsProxy (that latency per call, GCS's write rate per object) and each push through a PushRecorder
    trainers: bool = True
    function_instances: dict[str, int] = field(default_factory=dict)
    function_timeout_s: int = 0
    gcs_latency_s: float | None = None
    push_policy: PushPolicy | None = None  # the emulator's push subscriptions: ack deadline, redelivery backoff

    def __post_init__(self) -> None:
        # Resolved once, here: every path the machines and trainers get lies under it, and a trainer (like a real
        # machine's) takes absolute paths only, whatever directory the run started from.
        self.workdir = self.workdir.resolve()


def checkpoint_buckets(messages: Iterable[dict[str, Any]]) -> list[str]:
    """The buckets the jobs' `checkpoint_uri`s name (created in fake-gcs-server before the jobs run)."""
    found = (re.match(r"gs://([^/]+)", str(m.get("checkpoint_uri", ""))) for m in messages)
    return sorted({m.group(1) for m in found if m})


@dataclass
class Outcome:
    job: dict[str, Any] | None
    events: list[dict[str, Any]]
    machines_left: int
    timed_out: bool
    run_dir: Path
    bus: str
    notifications: int | None = None  # status notices recorded (None: the in-process bus carries none)
    secrets: dict[str, Any] | None = None  # the job had secrets: where they reached, and where they leaked
    history: History | None = None  # the deployment's preemption history at the end (None: it could not be read)


@dataclass(frozen=True)
class Started:
    """What `LocalCloud.start` brought up and later calls use; the cloud's exit stack stops every piece."""

    gcs: FakeGcs
    server: CloudApiServer
    nodes: Nodes
    bus: Bus
    bus_name: str  # pubsub-emulator | in-process
    store: GcsJobStore
    history: GcsHistoryStore  # the preemption history the functions keep beside the records (placement)
    recorder: StatusRecorder | None  # the status notices (None: the in-process bus carries none)
    gcs_proxy: GcsProxy | None = None  # in front of fake-gcs-server for the functions (Options.gcs_latency_s)
    pushes: dict[str, PushRecorder] = field(default_factory=dict)  # topic -> the recorder in front of its function


class LocalCloud:
    """The deployed system on loopback (see the module docstring): `start` brings it up, `submit` and `start_chaos`
    drive it, leaving the `with` block stops every piece it started."""

    def __init__(
        self, options: Options, say: Callable[[str], None], on_delivery: Callable[[Delivery], None] | None = None
    ) -> None:
        """`on_delivery` sees every push of the in-process bus (the emulator's pushes are not visible)."""
        self.options = options
        self.say = say
        self.on_delivery = on_delivery
        self.run_dir = options.workdir / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.timeline = Timeline(self.run_dir / "timeline.jsonl")
        self._stack = contextlib.ExitStack()
        self._started: Started | None = None
        self._zones: dict[str, str] = {}  # machine -> its zone, from the moment it is READY (chaos reads it)

    @property
    def started(self) -> Started:
        """The pieces `start` brought up (bench/load_test.py reads the bus, store, API and nodes below)."""
        if self._started is None:
            raise RuntimeError("the local cloud is not started: call start() first")
        return self._started

    @property
    def store(self) -> GcsJobStore:
        return self.started.store

    def run(self, message: dict[str, Any], total_steps: int | None = None) -> Outcome:
        """One job to a terminal status (`respawn local run`): start everything, submit, follow, settle, stop."""
        with self._stack:
            self.start(checkpoint_buckets([message]))
            self.advise_mtbi(_zones(message))
            job_id = str(message["job_id"])
            t0 = self.submit(message)
            self.start_chaos(t0)
            self.say(f"submitted {job_id} to {JOBS_TOPIC}; logs in {self.run_dir}")
            run = Run(self.timeline, self.say, self.options.timeout_s, self.options.progress_every_s)
            job, timed_out = follow(run, self.store, job_id, t0, total_steps)
            machines_left = self.machines_left() if timed_out else self.settle()
            job = job if timed_out or job is None else filled_in(job, self.timeline, self.store)
            notifications = notices_sent(self.started.recorder, job)
            return Outcome(
                job,
                self.timeline.events(),
                machines_left,
                timed_out,
                self.run_dir,
                self.started.bus_name,
                notifications,
                self.secrets_report() if self.options.secrets else None,
                self.read_history(),
            )

    def __enter__(self) -> LocalCloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self, what: str, start: Callable[[], Any], stop: Callable[[], Any]) -> Any:
        """Start a server, its stop registered first (a server that fails half-way is stopped too)."""
        t = time.monotonic()
        self._stack.callback(stop)
        value = start()
        self.say(f"started {what} ({time.monotonic() - t:.1f}s)")
        return value

    def start(self, buckets: Iterable[str] = ()) -> None:
        """Start every piece but chaos; `buckets` are created next to the state bucket (the checkpoint buckets).

        Used as a context manager (`with LocalCloud(...) as cloud: cloud.start(); cloud.submit(...)`), everything
        started here is stopped on exit, trainers first."""
        self._started = self._bring_up(buckets)

    def _bring_up(self, buckets: Iterable[str]) -> Started:
        """Each piece in the order its neighbours need it: the API, whose URL the functions need, whose URLs the
        bus needs, which the log router needs, which the nodes need; the API's machine hooks last (the nodes call
        the API back)."""
        timeline = self.timeline
        self._stack.callback(timeline.close)
        gcs = FakeGcs()
        self._start("fake-gcs-server", gcs.start, gcs.stop)
        self._stack.enter_context(patched_env({**gcs.env(), "GOOGLE_CLOUD_PROJECT": PROJECT}))
        for bucket in (STATE_BUCKET, *buckets):
            gcs.create_bucket(bucket)
        for directory, uri in self.options.uploads:
            gcs.upload(directory, uri)

        server = self._cloud_api()
        emulator = self._emulator()
        proxy = None if self.options.gcs_latency_s is None else GcsProxy(gcs.url, self.options.gcs_latency_s)
        if proxy is not None:
            self._start("GCS proxy", proxy.start, proxy.stop)
        functions = self._functions(server, (proxy or gcs).env(), emulator)
        urls = {JOBS_TOPIC: functions.urls["on_job_message"], EVENTS_TOPIC: functions.urls["on_event"]}
        pushes = {topic: PushRecorder(url) for topic, url in urls.items()} if proxy is not None else {}
        for topic, front in pushes.items():
            urls[topic] = self._start(f"push recorder for {topic}", front.start, front.stop).url
        endpoints = {topic: push_endpoint(url, PROJECT, topic) for topic, url in urls.items()}
        bus, bus_name = self._bus(endpoints, emulator is not None)
        recorder: StatusRecorder | None = None
        if emulator is not None:
            recorder = StatusRecorder(PROJECT, self.run_dir / "status.jsonl")
            self._stack.callback(recorder.close)
        router = LogRouter(bus, EVENTS_TOPIC, timeline)
        ticker = SweepTicker(bus, EVENTS_TOPIC, self.options.sweep_every_s).start()
        self._stack.callback(ticker.stop)
        nodes = Nodes(
            project=PROJECT,
            base_env=trainer_env(self.options, gcs),
            log_dir=self._dir("machines"),
            grace_s=self.options.grace_s,
            route=router.route,
            mark_preempted=server.preempt,
            set_state=server.set_state,
            timeline=timeline,
            entrypoint=self.options.entrypoint,
            secrets=self.options.secrets,
            timings=self.options.machine_timings,
            time_scale=self.options.time_scale,
            compute_api=f"{server.url}/compute/v1/",
            trainers=self.options.trainers,
        )
        self._stack.callback(nodes.stop)  # teardown kills the trainers first (after chaos, started later)

        def on_ready(machine: CloudMachine) -> None:
            timeline.add("state", machine=machine.name, zone=machine.zone, state="READY")
            self._zones[machine.name] = machine.zone
            refs, pids = machine.metadata.get("respawn-secrets") or "", lambda: nodes.pids(machine.name)
            nodes.on_ready(
                machine, then=lambda: check_trainers(timeline, machine.name, refs, pids, self.options.secrets)
            )

        def on_deleted(machine: CloudMachine) -> None:
            timeline.add("deleted", t=machine.deleted_at, machine=machine.name, zone=machine.zone)
            nodes.on_deleted(machine.name)

        server.connect(on_ready=on_ready, on_deleted=on_deleted, on_metadata=nodes.on_metadata)
        settings = Settings(project=PROJECT, state_bucket=STATE_BUCKET)
        store, history = bootstrap.job_store(settings), bootstrap.history_store(settings)
        return Started(gcs, server, nodes, bus, bus_name, store, history, recorder, proxy, pushes)

    def _cloud_api(self) -> CloudApiServer:
        """The TPU/Compute API, started, its calls copied to the timeline."""
        server = api_server(self.options)
        self._start(f"TPU/Compute API {server.url}", server.start, server.stop)
        watch_calls(server, self.timeline, self._stack)
        return server

    def _functions(
        self, server: CloudApiServer, storage: dict[str, str], emulator: PubSubEmulator | None
    ) -> FunctionServers:
        """functions-framework serving on_job_message and on_event, configured as deployed against the local pieces
        (`storage`: the variables that point the storage client at fake-gcs-server or its proxy)."""
        env = {
            "RESPAWN_PROJECT": PROJECT,
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "RESPAWN_STATE_BUCKET": STATE_BUCKET,
            "RESPAWN_TPU_ENDPOINT": server.url,
            "RESPAWN_COMPUTE_ENDPOINT": server.url,
            "RESPAWN_JOBS_TOPIC": JOBS_TOPIC,
            "RESPAWN_EVENTS_TOPIC": EVENTS_TOPIC,
            TIME_SCALE: repr(self.options.time_scale),
            IMAGES: json.dumps(TRAINER_IMAGES),
            **storage,
        }
        if emulator is not None:  # the functions publish status notices there, as deployed
            env.update(emulator.env(), RESPAWN_STATUS_TOPIC=STATUS_TOPIC)
        options = self.options
        functions = FunctionServers(env, self._dir("functions"), options.function_instances, options.function_timeout_s)
        self._start("functions-framework (on_job_message, on_event)", functions.start, functions.stop)
        return functions

    @property
    def bus(self) -> Bus:
        return self.started.bus

    def submit(self, message: dict[str, Any]) -> float:
        """Publish one job message to the jobs topic; returns the time recorded as its submission."""
        job_id = str(message["job_id"])
        t = float(self.timeline.add("submitted", job_id=job_id)["t"])
        self.bus.publish(JOBS_TOPIC, json.dumps(message).encode(), {"job_id": job_id})
        return t

    @property
    def nodes(self) -> Nodes:
        return self.started.nodes

    def start_chaos(self, t0: float) -> Chaos:
        """Preemptions and worker chaos per the options (`preempt_at` counts from t0); stopped on exit before the
        trainers."""
        options = self.options
        nodes = self.nodes

        def act(name: str, action: StepAction) -> None:
            assert action.worker is not None  # a worker action names its worker (step_actions)
            nodes.act(name, action.action, action.worker)

        chaos = Chaos(
            ready=nodes.ready,
            preempt=nodes.preempt,
            vms=nodes.vms,
            t0=t0,
            at=options.preempt_at,
            at_steps=options.preempt_at_steps,
            step_of=nodes.step,
            mtbi=options.mtbi,
            zone_of=self.zone_of,
            seed=options.seed,
            actions=step_actions(
                kill_worker=options.kill_worker_at_steps,
                hang_worker=options.hang_worker_at_steps,
                host_error=options.host_error_at_steps,
            ),
            act=act,
        )
        self._stack.callback(chaos.start().stop)
        return chaos

    def advise_mtbi(self, zones: Iterable[str]) -> None:
        """The local Advice API's estimated uptime of each of `zones` is its --mtbi (the zones named have theirs
        from the start; a plain --mtbi, every zone's, is filled in here for the job's zones)."""
        every = self.options.mtbi.every_s if self.options.mtbi else None
        if every is not None:
            for zone in zones:
                self.server.advice.mtbi_s.setdefault(zone, every)

    def read_history(self) -> History | None:
        """The preemption history the functions kept in the state bucket, with the observations the sweep has not
        folded in yet (None, said once, when unreadable)."""
        try:
            return current(self.started.history)[0]
        except Exception as e:  # the report goes on without it
            self.say(f"cannot read the preemption history: {type(e).__name__}: {e}".splitlines()[0][:300])
            return None

    def zone_of(self, machine: str) -> str | None:
        """The zone of a machine that has been READY (None before)."""
        return self._zones.get(machine)

    def _dir(self, name: str) -> Path:
        path = self.run_dir / name
        path.mkdir(exist_ok=True)
        return path

    def _emulator(self) -> PubSubEmulator | None:
        """The Pub/Sub emulator, started, when the options and this machine allow it; None for the in-process bus."""
        problem = PubSubEmulator.missing() if self.options.bus == "auto" else None
        if self.options.bus == "emulator" or (self.options.bus == "auto" and problem is None):
            emulator = PubSubEmulator(project=PROJECT)
            self._start("Pub/Sub emulator", emulator.start, emulator.stop)
            self._stack.enter_context(patched_env(emulator.env()))
            return emulator
        if problem:
            self.say(f"notice: {problem}; using the in-process push bus instead (it carries no status notices)")
        return None

    def _bus(self, endpoints: dict[str, str], emulator: bool) -> tuple[Bus, str]:
        copies = max(1, self.options.duplicate_deliveries)
        if emulator:
            bus: Bus = EmulatorBus(PROJECT, endpoints, copies, self.options.push_policy)
            name = "pubsub-emulator"
        else:
            bus = InProcessBus(PROJECT, endpoints, copies, on_delivery=self.on_delivery)
            name = "in-process"
        self._stack.callback(bus.close)
        return bus, name

    def secrets_report(self) -> dict[str, Any]:
        """Secrets: trainer processes that held them all, and the files holding a value: under the workdir (run
        logs, timeline, compile and reference caches) and every object of fake-gcs-server (records, checkpoints)."""
        roots = [self.options.workdir, Path(self.started.gcs.root)]
        return secrets_report(self.timeline, self.options.secrets, roots)

    def settle(self, wait_s: float = 20.0) -> int:
        """Give the control plane a moment to delete the last machines; returns how many are left."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (self.machines_left() or self.nodes.alive()):
            time.sleep(0.1)
        return self.machines_left()

    @property
    def server(self) -> CloudApiServer:
        return self.started.server

    def machines_left(self) -> int:
        """Objects the cloud still holds of what the attempts created: TPU nodes and queued resources (waiting ones
        have no node yet), instances, managed instance groups, their templates, workload policies and resize
        requests (the local API's `leftovers`)."""
        return len(self.server.leftovers())


def trainer_env(options: Options, gcs: FakeGcs) -> dict[str, str]:
    """What every trainer process of the cloud starts from, fake-gcs-server's address included; its grace period
    is its machine's (respawn/machine.py), as in the cloud."""
    stand_in = {"RESPAWN_DEVICES_STAND_IN": "cpu"} if options.stand_in else {}  # respawn_trainer's check
    return {**local_trainer_env(options.workdir, compile_cache=options.compile_cache), **gcs.env(), **stand_in}


def filled_in(job: dict[str, Any], timeline: Timeline, store: GcsJobStore, wait_s: float = 10.0) -> dict[str, Any]:
    """The final record once the trainer's own last entry, where the timeline holds one, has filled in what its
    startup script's exit code said first (entries arrive in any order: respawn.decide._filled_in)."""
    attempt = job["attempts"][-1]["n"] if job.get("attempts") else None
    own = [
        e
        for e in timeline.events()
        if e["kind"] == "entry" and e.get("attempt") == attempt and "source" not in e["payload"]
        if e["payload"].get("event") in ("completed", "failed")
    ]
    deadline = time.monotonic() + wait_s
    while own and job.get("result", {}).get("source") == EXIT_CODE and time.monotonic() < deadline:
        time.sleep(0.1)
        loaded, _ = store.load(job["job_id"])
        job = loaded.to_dict() if loaded is not None else job
    return job


def notices_sent(recorder: StatusRecorder | None, job: dict[str, Any] | None) -> int | None:
    """How many status notices the functions published, once the one of the job's final status is in (10 s at
    most); None where the bus carries none."""
    if recorder is None:
        return None
    final = job["status"] if job is not None else None
    recorder.wait_for(lambda notices: any(n["new_status"] == final for n in notices), 10.0)
    return len(recorder.notices())


def api_server(options: Options) -> CloudApiServer:
    """The TPU/Compute API with the options' capacity, stockouts and Advice API figures (not started)."""
    no_capacity: dict[str, int | None] = {zone: 0 for zone, n in options.stockouts.items() if n is None}

    def queue_waits(stockouts: dict[str, int | None]) -> dict[str, float | None]:
        return {zone: None if n is None else float(n) for zone, n in stockouts.items()}

    return CloudApiServer(
        create_delay_s=options.creation_delay_s,
        capacity=no_capacity,
        stockouts={zone: n for zone, n in options.stockouts.items() if n is not None},
        queue_waits=queue_waits(options.stockouts),
        spot_stockouts=dict(options.spot_stockouts),
        spot_queue_waits=queue_waits(options.spot_stockouts),
        unoffered=dict(options.unoffered),
        advice_seed=options.seed,
        advice_mtbi_s=dict(options.mtbi.zones) if options.mtbi else None,
    )


def _zones(message: dict[str, Any]) -> list[str]:
    """Every zone a job message allows: its `zones` and each tier's."""
    tiers = message.get("tiers") or ()
    return list(dict.fromkeys([*message.get("zones", ()), *(z for t in tiers for z in t.get("zones", ()))]))


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGINT / SIGTERM / SIGHUP raise KeyboardInterrupt in the main thread, so teardown always runs
    (SIGINT too when the shell started the command with it ignored, as `cmd &` does)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
