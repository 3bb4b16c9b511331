"""The machines of the local cloud: a READY machine's trainer processes, doing what a VM and Compute Engine do.

A READY machine runs what its startup script would (`python -m trainer`, or `--entrypoint`) from its metadata
and secrets, as its slice's processes (slices.py), each in its own process group. Lifecycle lines on stdout
become the LogEntries google-cloud-logging writes, for the log router; every other line goes to the worker's log
file (`NODE.log`, `NODE-w-I.log`), worker 0's read for live progress.

The machine names its worker VMs (`CloudMachine.workers`, in worker order): a TPU node's hidden `t1v-n-...-w-I`,
a Compute Engine slice's MIG VMs `NAME-w-XXXX`, a single VM itself. Preempting a machine sends SIGTERM to every
worker, SIGKILL after the grace period, then marks the machine PREEMPTED and emits one
`compute.instances.preempted` per worker VM. On a Compute Engine slice each worker is its own Spot VM, so one VM is
preempted: its worker alone gets the notice and the grace period, the API marks that VM TERMINATED and only its
event is routed; the other workers stop with it (the trainer's hosts agree on a notice any of them got) or are
killed when respawn deletes the group. A trainer that exits on its own leaves its machine READY, as on a real VM:
the control plane decides. A worker that exits without logging its end gets the entry its startup script writes
from the exit code (respawn/machine.py, `exit_code_entry`); one whose VM has a host error says nothing (its VM, the
whole TPU node, is TERMINATED and `compute.instances.hostError` routed first). Deleting kills every worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from respawn.events import EXIT_CODE
from respawn.local.cloudapi import CloudMachine
from respawn.local.logentries import host_event_entry, preempted_entry, trainer_entry
from respawn.local.secret_store import SecretUnavailable, secret_env
from respawn.local.slices import LocalSlice
from respawn.local.timeline import Timeline
from respawn.machine import exit_code_entry, grace_s, trainer_env
from respawn.parsing import TRAINER_EVENTS

_STEP = re.compile(r"\bstep[\s=:]+(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss[\s=:]+([-+0-9.eE]+|nan|inf)", re.IGNORECASE)

KILL_WAIT_S = 5.0  # how long SIGKILL may take to be reaped before it is given up on
TRAINER = (sys.executable, "-m", "trainer")  # the trainer image's entrypoint, run with this interpreter


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
    """One trainer process: worker `index` of its node (0 for a one-host machine)."""

    index: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    readers: list[threading.Thread] = field(default_factory=list)
    logged_its_end: bool = False  # the trainer logged completed, failed or stopped itself
    stopped: bool = False  # SIGSTOPped: hung
    host_error: bool = False  # its VM died of a host error: nobody is left to log a word for it


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
class StartupScript:
    """What a machine's startup script makes of its metadata (adapters/startup.py): the trainer's command and
    environment. `entrypoint` replaces the image's `python -m trainer`; `secrets` are {reference: value}."""

    base_env: Mapping[str, str]
    entrypoint: Sequence[str] | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)

    def argv(self, metadata: Mapping[str, str]) -> list[str]:
        """The job's args after the entrypoint."""
        args = json.loads(metadata.get("respawn-args") or "[]")
        return [*(self.entrypoint or TRAINER), *[str(a) for a in args]]

    def env(self, metadata: Mapping[str, str], kind: str) -> dict[str, str]:
        """The trainer's environment on a machine of `kind` (respawn/machine.py: its grace period included), lifecycle
        entries on stdout, with the values of its secrets; SecretUnavailable for a reference without one."""
        own = trainer_env(
            kind=kind,
            job_id=metadata["respawn-job-id"],
            attempt=int(metadata["respawn-attempt"]),
            checkpoint_uri=metadata["respawn-checkpoint-uri"],
            progress_s=int(metadata.get("respawn-progress-s") or 60),
            env=json.loads(metadata.get("respawn-env") or "{}").items(),
            log_sink="stdout",
        )
        env = {**self.base_env, **dict(own), "PYTHONUNBUFFERED": "1"}
        return {**env, **secret_env(metadata, self.secrets)}


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
    ) -> None:
        """`mark_preempted(name, worker)` and `set_state(name, state, worker)` change the machine in the cloud API
        (CloudHooks). `grace_s` is the notice window: a preempted machine is off (its trainer killed) this long after
        the notice, or sooner where its kind's grace period (respawn/machine.py) is shorter.
        `entrypoint` replaces `python -m trainer`; `secrets`: {reference: value}."""
        self.startup = StartupScript(dict(base_env), list(entrypoint) if entrypoint else None, dict(secrets or {}))
        self.cloud = CloudHooks(route, mark_preempted, set_state)
        self.project = project
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.timeline = timeline
        self._lock = threading.RLock()
        self._nodes: dict[str, Node] = {}
        self._ready: dict[str, float] = {}  # READY and not being preempted -> since
        self._threads: list[threading.Thread] = []
        self._closed = False

    # ---- hooks of the cloud API -------------------------------------------------------------------------------------

    def on_ready(self, machine: CloudMachine) -> None:
        with self._lock:  # atomic with stop(): a machine that comes up during teardown gets no trainer
            if not self._closed:
                self._start_node(machine)

    def _start_node(self, machine: CloudMachine) -> None:
        meta = machine.metadata
        job_id, attempt = meta.get("respawn-job-id", ""), int(meta.get("respawn-attempt") or 0)
        node = Node(machine, job_id, attempt, LocalSlice(len(machine.workers), machine.chips_per_host))
        self._nodes[machine.name] = node
        try:
            env = self.startup.env(meta, machine.kind)
        except SecretUnavailable as e:  # no trainer: the control plane deletes the machine and decides
            self._emit(node, {"event": "failed", "job_id": job_id, "attempt": attempt, "error": str(e)})
            return
        pipes = (subprocess.PIPE, subprocess.PIPE)
        processes = node.machine_slice.start(self.startup.argv(meta), env, lambda _: pipes, stdin=subprocess.DEVNULL)
        for index, proc in enumerate(processes):
            worker = Worker(index, proc, (self.log_dir / node.machine_slice.log_name(machine.name, index)).open("ab"))
            node.workers.append(worker)
            self.timeline.add(
                "trainer_start",
                machine=machine.name,
                zone=machine.zone,
                attempt=attempt,
                pid=proc.pid,
                **node.machine_slice.tag(index),
            )
            assert proc.stdout is not None and proc.stderr is not None
            worker.readers = [
                self._spawn(self._read_stdout, node, worker, proc.stdout),
                self._spawn(self._read_stderr, node, worker, proc.stderr),
            ]
            self._spawn(self._reap, node, worker)
        self._ready[machine.name] = time.time()

    def on_deleted(self, name: str) -> None:
        with self._lock:
            self._ready.pop(name, None)
            node = self._nodes.get(name)
            if node is None:
                return
            node.deleted = True
        for worker in node.workers:
            if worker.proc.poll() is None:
                self._spawn(self._terminate, worker, 5.0)

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
        """The process ids of the workers of `name`, worker 0 first."""
        with self._lock:
            node = self._nodes.get(name)
        return [w.proc.pid for w in node.workers] if node is not None else []

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
        """The notice to the workers on the VMs preempted, SIGKILL after the grace period, the VMs marked in the API,
        then each VM's system event."""
        noticed = [w for w in node.workers if vm is None or w.index == vm]
        # `docker stop -t GRACE` kills the trainer after its machine kind's grace period, or the machine is off first
        grace = min(float(grace_s(node.machine.kind)), self.grace_s)
        stoppers = [self._spawn(self._terminate, w, grace) for w in noticed]
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
        with self._lock:
            node = self._nodes.get(name)
            if node is None or not node.machine_slice.has_worker(worker) or node.deleted:
                self.timeline.add("chaos_skipped", machine=name, action=action, worker=worker)
                return
            target = node.workers[worker]
            if action == "host-error":
                self._ready.pop(name, None)  # its node is TERMINATED: not a target any more
                target.host_error = True
        if action == "kill-worker":
            self.timeline.add("kill_worker", machine=name, worker=worker, pid=target.proc.pid)
            self._signal(target, signal.SIGKILL)
        elif action == "hang-worker":
            target.stopped = True
            self.timeline.add("hang_worker", machine=name, worker=worker, pid=target.proc.pid)
            self._signal(target, signal.SIGSTOP)
        elif action == "host-error":
            self._spawn(self._host_error, node, target)
        else:
            raise ValueError(f"{action!r} is not a worker action; allowed: kill-worker, hang-worker, host-error")

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
        self._signal(worker, signal.SIGKILL)

    # ---- processes ------------------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    @staticmethod
    def _signal(worker: Worker, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.proc.pid, sig)

    @classmethod
    def _terminate(cls, worker: Worker, grace: float) -> None:
        """SIGTERM to the worker's process group; SIGKILL when it outlives the grace period (at once when it is
        stopped: it cannot act on SIGTERM). SIGKILL ends a stopped process too."""
        cls._signal(worker, signal.SIGTERM)
        if not worker.stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=grace)
        cls._signal(worker, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=KILL_WAIT_S)

    def _read_stdout(self, node: Node, worker: Worker, stream: IO[bytes]) -> None:
        for raw in stream:
            payload = lifecycle_entry(raw, node.job_id, node.attempt)
            if payload is None:
                self._log_line(node, worker, raw)
                continue
            worker.log.write(raw)
            worker.logged_its_end |= payload["event"] in ("completed", "failed", "stopped")
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

    def _read_stderr(self, node: Node, worker: Worker, stream: IO[bytes]) -> None:
        for raw in stream:
            self._log_line(node, worker, raw)

    def _log_line(self, node: Node, worker: Worker, raw: bytes) -> None:
        """A plain log line: to the worker's log file; worker 0's are read for progress (step, loss)."""
        worker.log.write(raw)
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
        tag = node.machine_slice.tag(worker.index)
        self.timeline.add("trainer_exit", machine=m.name, attempt=node.attempt, code=code, **tag)
        # nothing to log for it: it logged its end itself, its VM died with it, or the whole cloud is stopping
        nobody_speaks = worker.logged_its_end or worker.host_error or self._closed
        noticed = node.preempting or node.deleted
        said = None if nobody_speaks else exit_code_entry(code, worker.index, noticed=noticed)
        if said is not None:  # what its startup script logs for it
            event = said[0]
            payload: dict[str, Any] = {"event": event, "job_id": node.job_id, "attempt": node.attempt}
            payload.update(tag)
            payload.update(source=EXIT_CODE, exit_code=code)
            if event == "failed":
                payload["error"] = f"the trainer exited with code {code}"
            worker.log.write((json.dumps(payload, separators=(",", ":")) + "\n").encode())  # `respawn logs` reads it
            self._emit(node, payload)
        worker.log.close()

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
        with self._lock:
            self._closed = True
            workers = [w for node in self._nodes.values() for w in node.workers]
            self._ready.clear()
        stoppers = [self._spawn(self._terminate, w, 2.0) for w in workers if w.proc.poll() is None]
        for thread in stoppers:
            thread.join()
        for worker in workers:
            self._signal(worker, signal.SIGKILL)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
