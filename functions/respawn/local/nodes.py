"""The machines of the local cloud: each worker VM of a READY machine runs its real startup script (bash).

A READY machine keeps the startup and shutdown scripts of its metadata in its run directory (`NAME/`) and runs the
startup script once per worker VM, as Compute Engine does, with local stand-ins for only what a VM gets from outside
itself (machine_host.py): its metadata server, `docker`, a snap's `gcloud`, Cloud Logging and Secret Manager. So the
trainer's command, environment and grace period, the secrets it reads and the entries it writes from the trainer's
exit code are the script's own (respawn/machine.py). The script's output (the container's too) goes to the worker's
log file (`NAME.log`, `NAME-w-I.log`); lifecycle entries (the trainer's on its stdout, the script's own through the
VM's Cloud Logging endpoint) become the LogEntries google-cloud-logging writes, for the log router; worker 0's
progress lines are read for live progress. Each worker's script and its container run in process groups of their own.

A machine boots as its `MachineTimings` say (respawn/local/profiles.py): its scripts start `boot_s` after READY;
a boot image without Docker (`docker_install_s`) has no `docker` on the VM's PATH until the script installs it; a
baked one holds the trainer image in the VM's image store; the docker shim times pulls and the trainer's start.
Each timed step a shim reports (`STEP_MARK` lines) is a `machine_step` in the timeline.

The machine names its worker VMs (`CloudMachine.workers`, in worker order): a TPU node's hidden `t1v-n-...-w-I`, a
Compute Engine slice's MIG VMs `NAME-w-x7k2`, a single VM itself. Preempting a machine is what the cloud does: the
metadata server says `preempted` (a Spot VM that asked for a longer notice, scheduling.preemptionNoticeDuration,
stays up that long, scaled, before anything else), each VM runs its shutdown script (the notice, then `docker stop
-t GRACE`), and the VM is off (every process killed) once the notice window (`grace_s`) is over; then the machine is
marked PREEMPTED and one `compute.instances.preempted` is emitted per worker VM. On a Compute Engine slice each
worker is its own Spot VM, so one VM is preempted: its worker alone gets the notice, the API marks that VM
TERMINATED and only its event is routed; the other workers stop with it (the trainer's hosts agree on a notice any
of them got) or are stopped when respawn deletes the group. A trainer that exits on its own leaves its machine
READY, as on a real VM: the control plane decides. A VM with a host error is off at once: nobody speaks for its
trainer (its VM, the whole TPU node, is TERMINATED and `compute.instances.hostError` routed first). Deleting a
machine shuts every VM down (SIGTERM to the script, whose trap stops the container), off after a few seconds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from respawn.adapters.startup import IMAGE_MARK_ENV, TAKEOVER_LABEL
from respawn.local import machine_host
from respawn.local.cloudapi import CloudMachine
from respawn.local.compute_checks import seconds
from respawn.local.emulators import free_port, start_group
from respawn.local.logentries import host_event_entry, preempted_entry, trainer_entry
from respawn.local.machine_host import CloudLogging, MetadataServer, SecretManager
from respawn.local.profiles import MachineTimings
from respawn.local.slices import LocalSlice, compile_bytecode
from respawn.local.timeline import Timeline
from respawn.machine import CONTAINER, DRAIN_MARKER_METADATA, NOTICE_ENV, NOTICE_FILE, START_AFTER_METADATA, TRAINER_LOG
from respawn.parsing import TRAINER_EVENTS

_STEP = re.compile(r"\bstep[\s=:]+(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss[\s=:]+([-+0-9.eE]+|nan|inf)", re.IGNORECASE)

KILL_WAIT_S = 5.0  # how long SIGKILL may take to be reaped before it is given up on
BOOT_WAIT_S = 30.0  # how long a boot waits for each worker's script to start its container (or end), beyond its timings
DELETE_WINDOW_S = 5.0  # a deleted machine's VMs are off this long after their shutdown begins
BASH = shutil.which("bash") or "/bin/bash"
TRAINER = (sys.executable, "-m", "trainer")  # the trainer image's entrypoint, run with this interpreter
TRAINER_USER = "10001:10001"  # the trainer image's USER (trainer/Dockerfile's useradd --uid)


def notice_lead_s(machine: CloudMachine) -> float:
    """The metadata notice a Spot VM asked for before its soft off (its scheduling's preemptionNoticeDuration, a
    slice's from its template), in real seconds; 0 when none."""
    return float(seconds((machine.resource.get("scheduling") or {}).get("preemptionNoticeDuration")) or 0)


def progress(line: str) -> tuple[int, float] | None:
    """(step, loss) from a progress line of the trainer (`step 120/300 loss 3.2100 ...`), else None.

    Only lines with both a step and a loss count: they report a step that was trained (`started at step 270`
    and `stopped at step 410` do not)."""
    step, loss = _STEP.search(line), _LOSS.search(line)
    if not step or not loss:
        return None
    try:
        return int(step.group(1)), float(loss.group(1))
    except ValueError:
        return None


def machine_step(line: bytes) -> tuple[str, float, float] | None:
    """(step, start, end) from a shim's timed-step line (machine_host.mark), else None."""
    text = line.decode(errors="replace").strip()
    if not text.startswith(machine_host.STEP_MARK + " "):
        return None
    try:
        found = json.loads(text.removeprefix(machine_host.STEP_MARK))
        return str(found["step"]), float(found["start"]), float(found["end"])
    except (ValueError, KeyError, TypeError):
        return None


def lifecycle_entry(line: bytes, job_id: str, attempt: int) -> dict[str, Any] | None:
    """The lifecycle entry on a stdout line (RESPAWN_LOG_SINK=stdout): a JSON object naming a lifecycle event of
    this job and attempt. None for anything else a program prints (a plain log line), however odd."""
    if not line.lstrip().startswith(b"{"):
        return None
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or payload.get("event") not in TRAINER_EVENTS:
        return None
    if payload.get("job_id") != job_id or payload.get("attempt") != attempt or isinstance(payload["attempt"], bool):
        return None
    return payload


@dataclass
class Worker:
    """One worker VM of a machine: its startup script's process (`proc`), its metadata server, the Cloud Logging
    endpoint its scripts write to, and its home (the notice file, the docker shim's containers)."""

    index: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    metadata: MetadataServer
    cloud_logging: CloudLogging
    home: Path
    env: dict[str, str]  # the VM's environment, which its scripts run with
    readers: list[threading.Thread] = field(default_factory=list)
    stopped: bool = False  # its trainer is SIGSTOPped: hung

    def container(self) -> int | None:
        """The process of the trainer's container (its process group's leader), None when none runs."""
        return machine_host.container_pid(self.home / "docker", CONTAINER)


@dataclass
class Node:
    """A READY machine and its trainer processes."""

    machine: CloudMachine
    job_id: str
    attempt: int
    machine_slice: LocalSlice
    workers: list[Worker] = field(default_factory=list)
    preempting: bool = False
    deleted: bool = False
    step: int | None = None  # the last training step worker 0 reported

    def instance(self, worker: int) -> str:
        """The Compute Engine VM of a worker, as the machine names it (`CloudMachine.workers`)."""
        return self.machine.workers[worker]

    @property
    def vms(self) -> int:
        """How many VMs a preemption or a host error may take one of: every worker of a Compute Engine slice is its
        own VM; a TPU node's worker VMs are lost together, and a single VM is the machine (1)."""
        return self.machine_slice.hosts if self.machine.api == "compute" else 1

    def vm(self, worker: int | None) -> int | None:
        """The worker whose VM alone is hit, or None when the whole machine is (see `vms`)."""
        return worker if self.vms > 1 else None


@dataclass(frozen=True)
class Image:
    """The trainer image a local machine's `docker` runs: its command (`python -m trainer`, or the local cloud's
    `entrypoint`), its environment (`env`, what every local trainer starts from) and its labels (respawn's trainer's
    image, trainer/Dockerfile, says that its trainer takes over a head start's job itself)."""

    env: Mapping[str, str]
    command: Sequence[str] = TRAINER

    @property
    def labels(self) -> dict[str, str] | None:
        return {TAKEOVER_LABEL: "1"} if tuple(self.command) == TRAINER else None

    @property
    def user(self) -> str:
        """The image's USER: respawn's trainer image runs as its own user; an entrypoint's image names none (root)."""
        return TRAINER_USER if tuple(self.command) == TRAINER else ""

    @property
    def workdir(self) -> str:
        """The image's WORKDIR: respawn's trainer image has its own; an entrypoint's program runs where the local
        cloud was started (its project directory stands for the user's image: `python train.py` finds train.py)."""
        return "" if tuple(self.command) == TRAINER else os.getcwd()


@dataclass(frozen=True)
class CloudHooks:
    """The cloud around the machines: Cloud Logging's router, and the API that marks a machine PREEMPTED or sets
    its state, the whole machine or one worker's VM (`preempt(name, worker)`, `set_state(name, state, worker)`;
    worker None: every VM; each returns None when there is no such machine: deleted meanwhile)."""

    route: Callable[[dict[str, Any]], None]
    mark_preempted: Callable[[str, int | None], object]
    set_state: Callable[[str, str, int | None], object]


class Nodes:
    """Starts, preempts, breaks and stops the trainer processes of READY machines."""

    def __init__(
        self,
        *,
        project: str,
        base_env: Mapping[str, str],
        log_dir: Path,
        grace_s: float,
        route: Callable[[dict[str, Any]], None],
        mark_preempted: Callable[[str, int | None], object],
        timeline: Timeline,
        set_state: Callable[[str, str, int | None], object] = lambda name, state, worker: None,
        entrypoint: Sequence[str] | None = None,
        secrets: Mapping[str, str] | None = None,
        timings: MachineTimings | None = None,
        time_scale: float = 1.0,
    ) -> None:
        """`mark_preempted(name, worker)` and `set_state(name, state, worker)` change the machine in the cloud API
        (CloudHooks). `grace_s` is the notice window: a preempted VM is off this long after the notice (its trainer
        has its machine kind's grace period, respawn/machine.py, from its shutdown script's `docker stop -t`).
        `entrypoint` replaces `python -m trainer`; `secrets`: {reference: value}, what the local Secret Manager has;
        `timings`: how long each machine takes from READY to its trainer's first step; `time_scale`: local seconds
        per real second, for a Spot VM's metadata notice before its soft off (scheduling.preemptionNoticeDuration)."""
        # A noticed trainer's handover trains on for part of its grace: within this cloud's notice window, which
        # may be shorter (`grace_s`), and in a replay of real timings at time_scale shrunk alike, as the machine's
        # steps are
        scaled = {"RESPAWN_TEST_TIME_SCALE": f"{time_scale:g}"} if time_scale != 1.0 else {}
        image_env = {k: v for k, v in base_env.items() if k != "HOME"}  # docker sets HOME from the image's USER
        image_env |= {"PYTHONUNBUFFERED": "1", "RESPAWN_TEST_WINDOW_S": f"{grace_s:g}", **scaled}
        self.image = Image(image_env, list(entrypoint) if entrypoint else TRAINER)
        compile_bytecode()  # the image's bytecode, as its build writes it
        self.timings = timings or MachineTimings()
        self.secret_manager = SecretManager(secrets or {})
        self.bin_dir = machine_host.install(log_dir / ".bin")
        self.cloud = CloudHooks(route, mark_preempted, set_state)
        self.project = project
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.time_scale = time_scale
        self.timeline = timeline
        self._lock = threading.RLock()
        self._nodes: dict[str, Node] = {}
        self._ready: dict[str, float] = {}  # READY and not being preempted -> since
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._stopping = threading.Event()  # set by stop(): a boot still waiting gives up

    # ---- hooks of the cloud API -------------------------------------------------------------------------------------

    def on_ready(self, machine: CloudMachine, then: Callable[[], None] | None = None) -> None:
        """Boot the machine: `boot_s` after READY its startup script runs on every worker VM; `then()` once each has
        started its container (or ended), as a VM that has booted. Returns at once: a booting machine never holds
        the API's hooks (another machine's READY or deletion)."""
        meta = machine.metadata
        job_id, attempt = meta.get("respawn-job-id", ""), int(meta.get("respawn-attempt") or 0)
        node = Node(machine, job_id, attempt, LocalSlice(len(machine.workers), machine.chips_per_host))
        with self._lock:  # atomic with stop(): a machine that comes up during teardown gets no trainer
            if self._closed:
                return
            self._nodes[machine.name] = node
            self._ready[machine.name] = time.time()
        self._spawn(self._boot, node, then)

    def _boot(self, node: Node, then: Callable[[], None] | None) -> None:
        """The VMs boot; their scripts start unless the machine was preempted or deleted or the cloud stopped."""
        timings = self.timings
        if self._stopping.wait(timings.boot_s):
            return
        with self._lock:
            if self._closed or node.deleted or node.preempting:
                return
            self._start_workers(node)
        wait = BOOT_WAIT_S + timings.docker_install_s + timings.image_pull_s + timings.image_refresh_s
        deadline = time.monotonic() + wait
        for worker in node.workers:
            while worker.container() is None and worker.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        if then is not None:
            then()

    def _start_workers(self, node: Node) -> None:
        """Every worker VM's startup script, in its process group (the lock held)."""
        machine, meta = node.machine, node.machine.metadata
        run = self.log_dir / machine.name  # the machine's run directory: the scripts it ran, each worker's home
        run.mkdir(parents=True, exist_ok=True)
        (run / "startup-script.sh").write_text(meta.get("startup-script", ""))
        (run / "shutdown-script.sh").write_text(meta.get("shutdown-script", ""))
        if START_AFTER_METADATA in meta:  # a head start: its trainers wait for the noticed machine's final save
            until, marker = float(meta[START_AFTER_METADATA]), meta.get(DRAIN_MARKER_METADATA)
            self.timeline.add("start_after", machine=machine.name, attempt=node.attempt, until=until, marker=marker)
        port = free_port() if node.machine_slice.hosts > 1 else 0  # the slice's JAX coordinator, fresh per boot
        for index in node.machine_slice.workers:
            home = run / f"w-{index}"
            home.mkdir(exist_ok=True)
            if self.timings.image_on_boot_disk and meta.get("respawn-image"):  # baked into the boot image
                machine_host.add_image(home / "docker", meta["respawn-image"])
            server = MetadataServer(self.project, self._attributes(node, index))
            cloud_logging = CloudLogging(functools.partial(self._script_entry, node, index))
            env = self._vm_env(node, index, port, home, server, cloud_logging)
            proc = start_group(
                [BASH, str(run / "startup-script.sh")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            log = (self.log_dir / node.machine_slice.log_name(machine.name, index)).open("ab")
            worker = Worker(index, proc, log, server, cloud_logging, home, env)
            node.workers.append(worker)
            tag = node.machine_slice.tag(index)
            self.timeline.add(
                "trainer_start", machine=machine.name, zone=machine.zone, attempt=node.attempt, pid=proc.pid, **tag
            )
            assert proc.stdout is not None and proc.stderr is not None
            worker.readers = [
                self._spawn(self._read_stdout, node, worker, proc.stdout),
                self._spawn(self._read_stderr, node, worker, proc.stderr),
            ]
            self._spawn(self._reap, node, worker)

    def _attributes(self, node: Node, worker: int) -> dict[str, str]:
        """The metadata attributes a worker VM's server has: the machine's, and on a TPU VM its place in the slice
        (`agent-worker-number`, `worker-network-endpoints`: every host is on loopback)."""
        attributes = dict(node.machine.metadata)
        if node.machine.kind == "tpu":
            attributes["agent-worker-number"] = str(worker)
            attributes["worker-network-endpoints"] = node.machine_slice.endpoints()
        return attributes

    def _vm_env(
        self, node: Node, worker: int, port: int, home: Path, server: MetadataServer, cloud_logging: CloudLogging
    ) -> dict[str, str]:
        """A worker VM's environment: its tools first on PATH, its metadata server, Cloud Storage (fake-gcs-server,
        where the script writes and polls a head start's drain marker, as the trainers' checkpoints go there), Cloud
        Logging and Secret Manager (the local ones, where gcloud's endpoint overrides name them), its notice file, and
        for its `docker` the image (a slice's worker: with what its host gives the trainer)."""
        image_env = node.machine_slice.host_env(self.image.env, worker, port)
        t = self.timings
        if t.docker_install_s:  # a boot image without Docker: only the image's tools until apt-get installs it
            path = f"{home / 'bin'}:{self.bin_dir}:{self.bin_dir / 'tools'}"
        else:
            path = f"{machine_host.docker_package(self.bin_dir)}:{self.bin_dir}:/usr/local/bin:/usr/bin:/bin"
        return {
            "PATH": path,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "GCE_METADATA_HOST": server.host,
            **{k: v for k, v in self.image.env.items() if k == "STORAGE_EMULATOR_HOST"},
            NOTICE_ENV: str(home / NOTICE_FILE.lstrip("/")),  # under the VM: the script makes its directory
            IMAGE_MARK_ENV: str(home / "var-lib-respawn" / "trainer-image"),  # on the VM's disk
            machine_host.DOCKER_DIR: str(home / "docker"),
            machine_host.IMAGE_ENV: json.dumps(image_env),
            machine_host.IMAGE_CMD: json.dumps(list(self.image.command)),
            machine_host.IMAGE_LABELS: json.dumps(self.image.labels),
            machine_host.IMAGE_USER: self.image.user,
            machine_host.IMAGE_WORKDIR: self.image.workdir,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": cloud_logging.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": self.secret_manager.endpoint,
            machine_host.BIN_DIR: str(self.bin_dir),
            machine_host.VM_BIN: str(home / "bin"),
            machine_host.INSTALL_S: f"{t.docker_install_s:g}",
            machine_host.PULL_S: f"{t.image_pull_s:g}",
            machine_host.REFRESH_S: f"{t.image_refresh_s:g}",
            machine_host.START_S: f"{t.trainer_start_s:g}",
        }

    def on_deleted(self, name: str) -> None:
        with self._lock:
            self._ready.pop(name, None)
            node = self._nodes.get(name)
            if node is None:
                return
            node.deleted = True
        for worker in node.workers:
            if worker.proc.poll() is None:
                self._spawn(self._terminate, worker, DELETE_WINDOW_S)

    # ---- chaos ----------------------------------------------------------------------------------------------------

    def ready(self) -> list[tuple[str, float]]:
        """READY machines not being preempted, oldest first: (name, ready since)."""
        with self._lock:
            return sorted(self._ready.items(), key=lambda kv: kv[1])

    def step(self, name: str) -> int | None:
        """The last training step worker 0 of `name` reported."""
        with self._lock:
            node = self._nodes.get(name)
        return node.step if node is not None else None

    def pids(self, name: str) -> list[int]:
        """The process ids of the trainers (containers) running on the workers of `name`, worker 0 first."""
        with self._lock:
            node = self._nodes.get(name)
        found = [w.container() for w in node.workers] if node is not None else []
        return [pid for pid in found if pid is not None]

    def vms(self, name: str) -> int:
        """How many VMs a preemption of `name` may take one of (Node.vms); 1 for a machine that is gone."""
        with self._lock:
            node = self._nodes.get(name)
        return node.vms if node is not None else 1

    def preempt(self, name: str, worker: int | None = None) -> None:
        """Preempt `name`: on a Compute Engine slice the VM of `worker` alone (every VM when None), anywhere else the
        whole machine (`worker` is ignored)."""
        with self._lock:
            node = self._nodes.get(name)
            vm = node.vm(worker) if node is not None else None
            if node is not None and vm is not None and not node.machine_slice.has_worker(vm):
                raise ValueError(f"{name} has no worker {vm}; allowed: {node.machine_slice.workers_allowed()}")
            self._ready.pop(name, None)
            if node is None or node.preempting:
                return
            node.preempting = True
        hit = {} if vm is None else {"worker": vm, "instance": node.instance(vm)}
        workers = node.machine_slice.hosts if vm is None else 1
        self.timeline.add("notice", machine=name, zone=node.machine.zone, workers=workers, **hit)
        self._spawn(self._preempt, node, vm)

    def _preempt(self, node: Node, vm: int | None) -> None:
        """The notice to the VMs preempted (`preempted` on their metadata servers, their shutdown scripts: the notice
        file, `docker stop -t GRACE`), each VM off at the end of the notice window, the VMs marked in the API, then
        each VM's system event."""
        noticed = [w for w in node.workers if vm is None or w.index == vm]
        for worker in noticed:
            worker.metadata.preempted = True
        lead = notice_lead_s(node.machine) * self.time_scale
        if lead and (self._stopping.wait(lead) or node.deleted):  # the soft off comes after the metadata notice
            self.timeline.add("preempt_skipped", machine=node.machine.name, reason="deleted during its notice")
            return
        stoppers = [self._spawn(self._shut_down, node, w, self.grace_s) for w in noticed]
        for thread in stoppers:
            thread.join()
        for worker in noticed:
            for reader in worker.readers:
                reader.join(timeout=5)
        m = node.machine
        if self.cloud.mark_preempted(m.name, vm) is None:  # deleted meanwhile (the job completed): nothing to preempt
            self.timeline.add("preempt_skipped", machine=m.name, reason="deleted")
            return
        instances = [node.instance(i) for i in (node.machine_slice.workers if vm is None else (vm,))]
        hit = {} if vm is None else {"worker": vm}
        self.timeline.add("preempted", machine=m.name, zone=m.zone, instance=instances[0], instances=instances, **hit)
        for instance in instances:  # every VM preempted logs its own system event
            self.cloud.route(preempted_entry(project=self.project, zone=m.zone, instance=instance, now=time.time()))

    def act(self, name: str, action: str, worker: int) -> None:
        """Worker chaos (chaos.py): `kill-worker`, `hang-worker` or `host-error` on worker `worker` of `name`."""
        if action not in ("kill-worker", "hang-worker", "host-error"):
            raise ValueError(f"{action!r} is not a worker action; allowed: kill-worker, hang-worker, host-error")
        with self._lock:
            node = self._nodes.get(name)
            booted = node is not None and len(node.workers) > worker >= 0
            if node is None or not node.machine_slice.has_worker(worker) or node.deleted or not booted:
                self.timeline.add("chaos_skipped", machine=name, action=action, worker=worker)
                return
            target = node.workers[worker]
            if action == "host-error":
                self._ready.pop(name, None)  # its node is TERMINATED: not a target any more
        if action == "host-error":
            self._spawn(self._host_error, node, target)
            return
        container = target.container()
        if container is None:  # its script has not started the trainer, or it ended
            self.timeline.add("chaos_skipped", machine=name, action=action, worker=worker)
            return
        if action == "kill-worker":  # the trainer alone dies (an OOM kill): its script speaks for it
            self.timeline.add("kill_worker", machine=name, worker=worker, pid=container)
            self._signal(container, signal.SIGKILL)
        else:  # hang-worker
            target.stopped = True
            self.timeline.add("hang_worker", machine=name, worker=worker, pid=container)
            self._signal(container, signal.SIGSTOP)

    def _host_error(self, node: Node, worker: Worker) -> None:
        """The worker's VM dies: TERMINATED in the API (a TPU node whole, a slice's VM alone), then the system event,
        then the process is gone."""
        m = node.machine
        vm = node.vm(worker.index)
        if self.cloud.set_state(m.name, "TERMINATED", vm) is None:
            self.timeline.add("chaos_skipped", machine=m.name, action="host-error", worker=worker.index)
            return
        instance = node.instance(worker.index)
        self.timeline.add(
            "state", machine=m.name, zone=m.zone, state="TERMINATED", **({} if vm is None else {"worker": vm})
        )
        self.timeline.add("host_error", machine=m.name, zone=m.zone, worker=worker.index, instance=instance)
        method = "compute.instances.hostError"
        self.cloud.route(
            host_event_entry(method=method, project=self.project, zone=m.zone, instance=instance, now=time.time())
        )
        self._off(worker)

    # ---- processes ------------------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        """`sig` to the process group `pid` leads (a worker's script, or its container)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _off(self, worker: Worker) -> None:
        """The worker's VM is off: its script and its container are killed where they stand, and nothing of it
        reaches Cloud Logging any more."""
        container = worker.container()
        self._signal(worker.proc.pid, signal.SIGKILL)
        if container is not None:
            self._signal(container, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=KILL_WAIT_S)
        worker.cloud_logging.close()

    def _shutting_down(self, worker: Worker) -> None:
        """The VM's shutdown begins: the docker daemon stops with it (each container with its own stop timeout, in
        parallel with the scripts), and its snap gcloud refuses to run (machine_host.gcloud)."""
        (worker.home / machine_host.SHUTTING_DOWN).touch()
        self._spawn(machine_host.stop_all, worker.home / "docker")

    def _terminate(self, worker: Worker, window: float) -> None:
        """The worker's VM shuts down: SIGTERM to its script (whose trap leaves the notice and stops the container
        with the grace period), off after `window` (at once when its trainer is stopped: nothing is left to save)."""
        self._shutting_down(worker)
        self._signal(worker.proc.pid, signal.SIGTERM)
        if not worker.stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=window)
        self._off(worker)

    def _shut_down(self, node: Node, worker: Worker, window: float) -> None:
        """A preempted VM: its shutdown script runs (ACPI soft off) while the docker daemon stops each container with
        that container's own stop timeout (google-shutdown-scripts.service is ordered after the network and rsyslog
        only, so systemd stops docker.service in parallel), and the VM is off after the notice `window`. The
        script's `notice` entry (written to the VM's Cloud Logging endpoint) goes to the router as its other entries."""
        deadline = time.monotonic() + window
        script = self.log_dir / node.machine.name / "shutdown-script.sh"
        shutdown = start_group(
            [BASH, str(script)], env=worker.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=worker.log
        )
        self._shutting_down(worker)  # systemd stops docker.service alongside the shutdown script
        assert shutdown.stdout is not None
        reader = self._spawn(self._read_stdout, node, worker, shutdown.stdout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shutdown.wait(timeout=window)
        if not worker.stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._signal(shutdown.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shutdown.wait(timeout=KILL_WAIT_S)
        reader.join(timeout=KILL_WAIT_S)
        self._off(worker)

    def _read_stdout(self, node: Node, worker: Worker, stream: IO[bytes]) -> None:
        """A worker's script's stdout (its startup script's, or its shutdown script's): the trainer's lifecycle entries
        to the router, every line to the worker's log (while it is open: a shutdown script may outlive the startup
        script)."""
        for raw in stream:
            payload = lifecycle_entry(raw, node.job_id, node.attempt)
            if payload is None:
                self._log_line(node, worker, raw)
                continue
            with contextlib.suppress(ValueError):  # the log closed with the startup script
                worker.log.write(raw)
            if not self._closed:  # the whole cloud is stopping: nobody reads entries any more
                self._emit(node, payload)

    def _emit(self, node: Node, payload: dict[str, Any]) -> None:
        """Wrap a lifecycle payload into the LogEntry google-cloud-logging writes and hand it to the router."""
        m, now = node.machine, time.time()
        self.timeline.add("entry", t=now, machine=m.name, zone=m.zone, attempt=node.attempt, payload=payload)
        self.cloud.route(
            trainer_entry(
                payload,
                project=self.project,
                zone=m.zone,
                machine=m.name,
                job_id=str(payload.get("job_id") or node.job_id),
                attempt=int(payload.get("attempt") or node.attempt),
                now=now,
            )
        )

    def _script_entry(self, node: Node, index: int, log: str, payload: dict[str, Any]) -> None:
        """An entry a worker's script wrote to Cloud Logging: a lifecycle entry of this attempt (the exit code's, the
        `notice`) to the router and the worker's log, anything else (a note for the operator) to the worker's log."""
        worker = node.workers[index]
        line = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
        if log != TRAINER_LOG or lifecycle_entry(line, node.job_id, node.attempt) is None:
            self._log_line(node, worker, f"{log}: {json.dumps(payload)}\n".encode())
            return
        with contextlib.suppress(ValueError):  # the log closed with the startup script
            worker.log.write(line)
        if not self._closed:
            self._emit(node, payload)

    def _read_stderr(self, node: Node, worker: Worker, stream: IO[bytes]) -> None:
        for raw in stream:
            self._log_line(node, worker, raw)

    def _log_line(self, node: Node, worker: Worker, raw: bytes) -> None:
        """A plain log line: to the worker's log file; a shim's timed step to the timeline; worker 0's are read for
        progress (step, loss)."""
        with contextlib.suppress(ValueError):  # the log closed with the startup script
            worker.log.write(raw)
        timed = machine_step(raw)
        if timed is not None:
            name, start, end = timed
            tag = node.machine_slice.tag(worker.index)
            self.timeline.add(
                "machine_step", t=end, machine=node.machine.name, attempt=node.attempt, step=name, start=start, **tag
            )
        if worker.index != 0:
            return
        found = progress(raw.decode(errors="replace"))
        if found is not None:
            step, loss = found
            node.step = step
            self.timeline.add("step", machine=node.machine.name, attempt=node.attempt, step=step, loss=loss)

    def _reap(self, node: Node, worker: Worker) -> None:
        code = worker.proc.wait()
        for reader in worker.readers:
            reader.join(timeout=10)
        m = node.machine
        self.timeline.add(
            "trainer_exit", machine=m.name, attempt=node.attempt, code=code, **node.machine_slice.tag(worker.index)
        )
        worker.log.close()
        worker.metadata.close()

    def alive(self) -> list[str]:
        """Machines with a live trainer process."""
        with self._lock:
            return [n for n, node in self._nodes.items() if any(w.proc.poll() is None for w in node.workers)]

    def processes(self) -> int:
        """Trainer processes alive (every worker of every machine)."""
        with self._lock:
            return sum(w.proc.poll() is None for node in self._nodes.values() for w in node.workers)

    def stop(self) -> None:
        """Kill every trainer's process group (teardown); no trainer starts after this."""
        self._stopping.set()
        with self._lock:
            self._closed = True
            workers = [w for node in self._nodes.values() for w in node.workers]
            self._ready.clear()
        stoppers = [self._spawn(self._terminate, w, 2.0) for w in workers if w.proc.poll() is None]
        for thread in stoppers:
            thread.join()
        for worker in workers:
            self._off(worker)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
        self.secret_manager.close()
