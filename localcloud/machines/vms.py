"""A local machine's worker VMs: each runs its startup script with the VM's environment, its output is read into the
worker's log, the log router and the timeline, and it powers down as a VM does (its shutdown script, SIGTERM, off).

The script's output (the container's too) goes to the worker's log file (`NAME.log`, `NAME-w-I.log`); lifecycle
entries (the trainer's on its stdout, the script's own through the VM's Cloud Logging endpoint) become the LogEntries
google-cloud-logging writes, for the log router; worker 0's progress lines are read for live progress; each timed
step a shim reports (`STEP_MARK` lines) is a `machine_step` in the timeline. Each worker's script and its container
run in process groups of their own.
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

from localcloud.apis.cloudapi import CloudMachine
from localcloud.machines import machine_host
from localcloud.machines.machine_host import CloudLogging, MetadataServer, SecretManager
from localcloud.machines.profiles import MachineTimings
from localcloud.machines.slices import LocalSlice
from localcloud.services.emulators import start_group
from localcloud.services.logentries import trainer_entry
from localcloud.timeline import Timeline
from respawn.adapters.startup import DATA_DIR_ENV, IMAGE_MARK_ENV, TAKEOVER_LABEL
from respawn.machine import CONTAINER, DRAIN_MARKER_METADATA, NOTICE_ENV, NOTICE_FILE, START_AFTER_METADATA, TRAINER_LOG
from respawn.parsing import TRAINER_EVENTS
from respawn_trainer.slice_env import free_port

_STEP = re.compile(r"\bstep[\s=:]+(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss[\s=:]+([-+0-9.eE]+|nan|inf)", re.IGNORECASE)

KILL_WAIT_S = 5.0  # how long SIGKILL may take to be reaped before it is given up on
BASH = shutil.which("bash") or "/bin/bash"
TRAINER = (sys.executable, "-m", "trainer")  # the trainer image's entrypoint, run with this interpreter
TRAINER_FLAG_CHECK = (sys.executable, "-m", "trainer.config")  # its flags checked: exit 2 and why, or 0
TRAINER_USER = "10001:10001"  # the trainer image's USER (trainer/Dockerfile's useradd --uid)


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
    vm_metadata: dict[int, dict[str, str]] = field(default_factory=dict)  # a worker VM's own, once written to it

    def metadata(self, worker: int) -> dict[str, str]:
        """The metadata of a worker's VM: the machine's, or what a setMetadata on that VM alone (a MIG's VM) made it."""
        return dict(self.vm_metadata.get(worker, self.machine.metadata))

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
        """respawn's trainer image's USER, with its own command or an entrypoint's: the image decides the user, not
        the command (the machine's docker runs any other image as root: machine_host.image_user)."""
        return TRAINER_USER

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


class WorkerVms:
    """The worker VMs of the local machines: started, read and powered down. `spawn(target, *args)` runs a thread
    the machines keep track of; `closed()`: the whole cloud is stopping (nobody reads entries any more)."""

    def __init__(
        self,
        *,
        project: str,
        log_dir: Path,
        timeline: Timeline,
        route: Callable[[dict[str, Any]], None],
        image: Image,
        timings: MachineTimings,
        secret_manager: SecretManager,
        bin_dir: Path,
        spawn: Callable[..., threading.Thread],
        closed: Callable[[], bool],
        compute_api: str = "",
    ) -> None:
        self.project = project
        self.log_dir = log_dir
        self.timeline = timeline
        self.route = route
        self.image = image
        self.timings = timings
        self.secret_manager = secret_manager
        self.bin_dir = bin_dir
        self.spawn = spawn
        self.closed = closed
        self.compute_api = compute_api  # the local Compute API's root (.../compute/v1/), where a VM lists its MIG

    def start(self, node: Node) -> None:
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
            server = MetadataServer(self.project, self.attributes(node, index), node.instance(index), machine.zone)
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
                self.spawn(self.read_stdout, node, worker, proc.stdout),
                self.spawn(self._read_stderr, node, worker, proc.stderr),
            ]
            self.spawn(self.reap, node, worker)

    def attributes(self, node: Node, worker: int) -> dict[str, str]:
        """The metadata attributes a worker VM's server has: its VM's metadata, and on a TPU VM its place in the
        slice (`agent-worker-number`, `worker-network-endpoints`: every host is on loopback)."""
        attributes = node.metadata(worker)
        if node.machine.kind == "tpu":
            attributes["agent-worker-number"] = str(worker)
            attributes["worker-network-endpoints"] = node.machine_slice.endpoints()
        return attributes

    def _vm_env(
        self, node: Node, worker: int, port: int, home: Path, server: MetadataServer, cloud_logging: CloudLogging
    ) -> dict[str, str]:
        """A worker VM's environment: its tools first on PATH, its metadata server, Cloud Storage (fake-gcs-server,
        where the script writes and polls a head start's drain marker, as the trainers' checkpoints go there), Cloud
        Logging, Secret Manager and Compute Engine (the local ones, where gcloud's endpoint overrides name them), its
        notice file, and for its `docker` the image (a slice's worker: with what its host gives the trainer)."""
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
            DATA_DIR_ENV: str(home / "var-lib-respawn" / "data"),  # on the VM's disk: the script makes it
            machine_host.DOCKER_DIR: str(home / "docker"),
            machine_host.IMAGE_ENV: json.dumps(image_env),
            machine_host.IMAGE_CMD: json.dumps(list(self.image.command)),
            machine_host.IMAGE_LABELS: json.dumps(self.image.labels),
            machine_host.IMAGE_USER: self.image.user,
            machine_host.IMAGE_WORKDIR: self.image.workdir,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": cloud_logging.endpoint,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": self.secret_manager.endpoint,
            **({"CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": self.compute_api} if self.compute_api else {}),
            machine_host.BIN_DIR: str(self.bin_dir),
            machine_host.VM_BIN: str(home / "bin"),
            machine_host.INSTALL_S: f"{t.docker_install_s:g}",
            machine_host.PULL_S: f"{t.image_pull_s:g}",
            machine_host.REFRESH_S: f"{t.image_refresh_s:g}",
            machine_host.START_S: f"{t.trainer_start_s:g}",
        }

    def read_stdout(self, node: Node, worker: Worker, stream: IO[bytes]) -> None:
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
            if not self.closed():  # the whole cloud is stopping: nobody reads entries any more
                self._emit(node, payload)

    def _emit(self, node: Node, payload: dict[str, Any]) -> None:
        """Wrap a lifecycle payload into the LogEntry google-cloud-logging writes and hand it to the router."""
        m, now = node.machine, time.time()
        self.timeline.add("entry", t=now, machine=m.name, zone=m.zone, attempt=node.attempt, payload=payload)
        self.route(
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
        if not self.closed():
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

    def reap(self, node: Node, worker: Worker) -> None:
        code = worker.proc.wait()
        for reader in worker.readers:
            reader.join(timeout=10)
        m = node.machine
        self.timeline.add(
            "trainer_exit", machine=m.name, attempt=node.attempt, code=code, **node.machine_slice.tag(worker.index)
        )
        worker.log.close()
        worker.metadata.close()

    @staticmethod
    def signal_group(pid: int, sig: int) -> None:
        """`sig` to the process group `pid` leads (a worker's script, or its container)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def off(self, worker: Worker) -> None:
        """The worker's VM is off: its script and its container are killed where they stand, and nothing of it
        reaches Cloud Logging any more."""
        container = worker.container()
        self.signal_group(worker.proc.pid, signal.SIGKILL)
        if container is not None:
            self.signal_group(container, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=KILL_WAIT_S)
        worker.cloud_logging.close()

    def _shutting_down(self, worker: Worker) -> None:
        """The VM's shutdown begins: the docker daemon stops with it (each container with its own stop timeout, in
        parallel with the scripts), and its snap gcloud refuses to run (machine_host.gcloud)."""
        (worker.home / machine_host.SHUTTING_DOWN).touch()
        self.spawn(machine_host.stop_all, worker.home / "docker")

    def terminate(self, worker: Worker, window: float) -> None:
        """The worker's VM shuts down: SIGTERM to its script (whose trap leaves the notice and stops the container
        with the grace period), off after `window` (at once when its trainer is stopped: nothing is left to save)."""
        self._shutting_down(worker)
        self.signal_group(worker.proc.pid, signal.SIGTERM)
        if not worker.stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=window)
        self.off(worker)

    def shut_down(self, node: Node, worker: Worker, window: float) -> None:
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
        reader = self.spawn(self.read_stdout, node, worker, shutdown.stdout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shutdown.wait(timeout=window)
        if not worker.stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.signal_group(shutdown.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shutdown.wait(timeout=KILL_WAIT_S)
        reader.join(timeout=KILL_WAIT_S)
        self.off(worker)
