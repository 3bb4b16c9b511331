"""The machines of the local cloud: each worker VM of a READY machine runs its real startup script (bash).

A READY machine keeps the startup and shutdown scripts of its metadata in its run directory (`NAME/`) and runs the
startup script once per worker VM, as Compute Engine does, with local stand-ins for only what a VM gets from outside
itself (machine_host.py): its metadata server, `docker`, a snap's `gcloud`, Cloud Logging and Secret Manager. So the
trainer's command, environment and grace period, the secrets it reads and the entries it writes from the trainer's
exit code are the script's own (respawn/machine.py). How a worker VM runs, what is read from its output and how
it powers down: vms.py.

A machine boots as its `MachineTimings` say (localcloud/machines/profiles.py): its scripts start `boot_s` after READY;
a boot image without Docker (`docker_install_s`) has no `docker` on the VM's PATH until the script installs it; a
baked one holds the trainer image in the VM's image store; the docker shim times pulls and the trainer's start.

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

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from localcloud.apis.cloudapi import CloudMachine
from localcloud.apis.compute.checks import seconds
from localcloud.machines import machine_host
from localcloud.machines.machine_host import SecretManager
from localcloud.machines.profiles import MachineTimings
from localcloud.machines.slices import LocalSlice, compile_bytecode
from localcloud.machines.vms import TRAINER, CloudHooks, Image, Node, Worker, WorkerVms
from localcloud.services.logentries import host_event_entry, preempted_entry
from localcloud.timeline import Timeline

BOOT_WAIT_S = 30.0  # how long a boot waits for each worker's script to start its container (or end), beyond its timings
DELETE_WINDOW_S = 5.0  # a deleted machine's VMs are off this long after their shutdown begins


def notice_lead_s(machine: CloudMachine) -> float:
    """The metadata notice a Spot VM asked for before its soft off (its scheduling's preemptionNoticeDuration, a
    slice's from its template), in real seconds; 0 when none."""
    return float(seconds((machine.resource.get("scheduling") or {}).get("preemptionNoticeDuration")) or 0)


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
        compute_api: str = "",
        trainers: bool = True,
    ) -> None:
        """`mark_preempted(name, worker)` and `set_state(name, state, worker)` change the machine in the cloud API
        (CloudHooks). `grace_s` is the notice window: a preempted VM is off this long after the notice (its trainer
        has its machine kind's grace period, respawn/machine.py, from its shutdown script's `docker stop -t`).
        `entrypoint` replaces `python -m trainer`; `secrets`: {reference: value}, what the local Secret Manager has;
        `timings`: how long each machine takes from READY to its trainer's first step; `time_scale`: local seconds
        per real second, for a Spot VM's metadata notice before its soft off (scheduling.preemptionNoticeDuration);
        `compute_api`: the Compute API's root, which a GPU slice's VMs list their MIG from. `trainers=False`: machines
        are state only (the fleet benchmark's hundreds): a READY machine boots nothing and runs no script; preempting
        it marks it in the API and emits its system events (after the notice a Spot VM asked for, as above)."""
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
        self.trainers = trainers
        self._lock = threading.RLock()
        self._nodes: dict[str, Node] = {}
        self._ready: dict[str, float] = {}  # READY and not being preempted -> since
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._stopping = threading.Event()  # set by stop(): a boot still waiting gives up
        self.vm = WorkerVms(
            project=project,
            log_dir=log_dir,
            timeline=timeline,
            route=route,
            image=self.image,
            timings=self.timings,
            secret_manager=self.secret_manager,
            bin_dir=self.bin_dir,
            spawn=self._spawn,
            closed=lambda: self._closed,
            compute_api=compute_api,
        )

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
        if self.trainers:
            self._spawn(self._boot, node, then)

    def _boot(self, node: Node, then: Callable[[], None] | None) -> None:
        """The VMs boot; their scripts start unless the machine was preempted or deleted or the cloud stopped."""
        timings = self.timings
        if self._stopping.wait(timings.boot_s):
            return
        with self._lock:
            if self._closed or node.deleted or node.preempting:
                return
            self.vm.start(node)
        wait = BOOT_WAIT_S + timings.docker_install_s + timings.image_pull_s + timings.image_refresh_s
        deadline = time.monotonic() + wait
        for worker in node.workers:
            while worker.container() is None and worker.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        if then is not None:
            then()

    def on_metadata(self, written: CloudMachine) -> None:
        """The API wrote a machine's metadata (nodes.patch of a TPU node, instances.setMetadata of an instance or of
        one VM of a slice's MIG, `written` being that VM): the VMs it reaches serve it from now on, and their
        metadata servers wake the requests waiting for a change; a VM that boots later starts with it."""
        with self._lock:
            node = self._nodes.get(written.name)
            worker = None
            if node is None:  # a MIG's VM, by its own name
                node = next((n for n in self._nodes.values() if written.name in n.machine.workers), None)
                worker = node.machine.workers.index(written.name) if node is not None else None
            if node is None:
                return
            if worker is None:
                node.machine.metadata = dict(written.metadata)
                node.vm_metadata.clear()
            else:
                node.vm_metadata[worker] = dict(written.metadata)
            for vm in node.workers:
                if worker in (None, vm.index):
                    vm.metadata.set_attributes(self.vm.attributes(node, vm.index))

    def on_deleted(self, name: str) -> None:
        with self._lock:
            self._ready.pop(name, None)
            node = self._nodes.get(name)
            if node is None:
                return
            node.deleted = True
        for worker in node.workers:
            if worker.proc.poll() is None:
                self._spawn(self.vm.terminate, worker, DELETE_WINDOW_S)

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
        stoppers = [self._spawn(self.vm.shut_down, node, w, self.grace_s) for w in noticed]
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
            self.vm.signal_group(container, signal.SIGKILL)
        else:  # hang-worker
            target.stopped = True
            self.timeline.add("hang_worker", machine=name, worker=worker, pid=container)
            self.vm.signal_group(container, signal.SIGSTOP)

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
        self.vm.off(worker)

    # ---- processes ------------------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

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
        stoppers = [self._spawn(self.vm.terminate, w, 2.0) for w in workers if w.proc.poll() is None]
        for thread in stoppers:
            thread.join()
        for worker in workers:
            self.vm.off(worker)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
        self.secret_manager.close()
