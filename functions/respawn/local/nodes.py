"""The machines of the local cloud: one trainer process per READY machine.

A machine that becomes READY starts `python -m trainer` from its structured
metadata (respawn-args, respawn-env, respawn-job-id, respawn-attempt,
respawn-checkpoint-uri; the image is not run) in its own process group. Every
stdout line of the trainer is a lifecycle entry; it is wrapped into the
LogEntry google-cloud-logging would write and handed to the log router. Its
stderr is kept in a log file and read for live progress (step, loss).

Preempting a machine does what Compute Engine does to a Spot VM: SIGTERM (the
ACPI soft-off), SIGKILL after the grace period, then the machine is PREEMPTED
and the `compute.instances.preempted` system event is emitted (on the hidden
worker VM `t1v-n-<hash>-w-0` for a TPU node, on the instance for a GPU VM).

A trainer that exits on its own (completed, or crashed after its `failed`
entry) leaves its machine READY, as the startup script does on a real VM: the
control plane decides what happens to it. A trainer killed without a last word
(OOM, segfault) gets the `failed` entry the startup script writes for it.
Deleting a machine stops its trainer.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from respawn.local.cloudapi import CloudMachine
from respawn.local.emulators import start_group
from respawn.local.logentries import preempted_entry, tpu_worker_name, trainer_entry
from respawn.local.timeline import Timeline

_STEP = re.compile(r"\bstep[\s=:]+(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"\bloss[\s=:]+([-+0-9.eE]+|nan|inf)", re.IGNORECASE)


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


@dataclass
class Trainer:
    machine: CloudMachine
    job_id: str
    attempt: int
    proc: subprocess.Popen[bytes]
    readers: list[threading.Thread] = field(default_factory=list)
    preempting: bool = False
    deleted: bool = False
    last_word: bool = False  # the trainer logged completed, failed or stopped itself
    step: int | None = None  # the last training step it reported


def trainer_argv(metadata: Mapping[str, str]) -> list[str]:
    args = json.loads(metadata.get("respawn-args") or "[]")
    return [sys.executable, "-m", "trainer", *[str(a) for a in args]]


def trainer_env(metadata: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    """The trainer's environment, as the startup script would set it on a real machine."""
    env = {**base, **json.loads(metadata.get("respawn-env") or "{}")}
    env.update(
        RESPAWN_JOB_ID=metadata["respawn-job-id"],
        RESPAWN_ATTEMPT=str(metadata["respawn-attempt"]),
        RESPAWN_CHECKPOINT_URI=metadata["respawn-checkpoint-uri"],
        RESPAWN_LOG_SINK="stdout",
        PYTHONUNBUFFERED="1",
    )
    return env


class Nodes:
    """Starts, preempts and stops the trainer processes of READY machines."""

    def __init__(
        self,
        *,
        project: str,
        base_env: Mapping[str, str],
        log_dir: Path,
        grace_s: float,
        route: Callable[[dict[str, Any]], None],
        mark_preempted: Callable[[str], object],
        timeline: Timeline,
    ) -> None:
        self.project = project
        self.base_env = dict(base_env)
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.route = route
        self.mark_preempted = mark_preempted
        self.timeline = timeline
        self._lock = threading.RLock()
        self._trainers: dict[str, Trainer] = {}
        self._ready: dict[str, float] = {}  # READY and not being preempted -> since
        self._threads: list[threading.Thread] = []
        self._closed = False

    # ---- hooks of the cloud API -------------------------------------------------------------------------------------

    def on_ready(self, machine: CloudMachine) -> None:
        with self._lock:  # atomic with stop(): a machine that comes up during teardown gets no trainer
            if not self._closed:
                self._start_trainer(machine)

    def _start_trainer(self, machine: CloudMachine) -> None:
        meta = machine.metadata
        job_id, attempt = meta.get("respawn-job-id", ""), int(meta.get("respawn-attempt") or 0)
        log = (self.log_dir / f"{machine.name}.log").open("ab")
        proc = start_group(
            trainer_argv(meta),
            env=trainer_env(meta, self.base_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        trainer = Trainer(machine, job_id, attempt, proc)
        self.timeline.add("trainer_start", machine=machine.name, zone=machine.zone, attempt=attempt, pid=proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        trainer.readers = [
            self._spawn(self._read_stdout, trainer, proc.stdout, log),
            self._spawn(self._read_stderr, trainer, proc.stderr, log),
        ]
        self._spawn(self._reap, trainer, log)
        self._trainers[machine.name] = trainer
        self._ready[machine.name] = time.time()

    def on_deleted(self, name: str) -> None:
        with self._lock:
            self._ready.pop(name, None)
            trainer = self._trainers.get(name)
            if trainer is not None:
                trainer.deleted = True
        if trainer is not None and trainer.proc.poll() is None:
            self._spawn(self._terminate, trainer, 5.0)

    # ---- chaos ----------------------------------------------------------------------------------------------------

    def ready(self) -> list[tuple[str, float]]:
        """READY machines not being preempted, oldest first: (name, ready since)."""
        with self._lock:
            return sorted(self._ready.items(), key=lambda kv: kv[1])

    def step(self, name: str) -> int | None:
        """The last training step the trainer of `name` reported."""
        with self._lock:
            trainer = self._trainers.get(name)
        return trainer.step if trainer is not None else None

    def preempt(self, name: str) -> None:
        with self._lock:
            self._ready.pop(name, None)
            trainer = self._trainers.get(name)
            if trainer is None or trainer.preempting:
                return
            trainer.preempting = True
        self.timeline.add("notice", machine=name, zone=trainer.machine.zone)
        self._spawn(self._preempt, trainer)

    def _preempt(self, trainer: Trainer) -> None:
        self._terminate(trainer, self.grace_s)
        for reader in trainer.readers:
            reader.join(timeout=5)
        m = trainer.machine
        try:
            self.mark_preempted(m.name)
        except KeyError:  # deleted meanwhile (the job completed): nothing left to preempt
            self.timeline.add("preempt_skipped", machine=m.name, reason="deleted")
            return
        instance = tpu_worker_name(m.name) if m.kind == "tpu" else m.name
        entry = preempted_entry(project=self.project, zone=m.zone, instance=instance, now=time.time())
        self.timeline.add("preempted", machine=m.name, zone=m.zone, instance=instance)
        self.route(entry)

    # ---- processes ------------------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    @staticmethod
    def _terminate(trainer: Trainer, grace: float) -> None:
        """SIGTERM to the trainer's process group; SIGKILL when it outlives the grace period."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(trainer.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            trainer.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(trainer.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            trainer.proc.wait(timeout=5)

    def _read_stdout(self, trainer: Trainer, stream: IO[bytes], log: IO[bytes]) -> None:
        for raw in stream:
            log.write(raw)
            try:
                payload = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(payload, dict) or "event" not in payload:
                continue
            trainer.last_word |= payload["event"] in ("completed", "failed", "stopped")
            self._emit(trainer, payload)

    def _emit(self, trainer: Trainer, payload: dict[str, Any]) -> None:
        """Wrap a lifecycle payload into the LogEntry google-cloud-logging writes and hand it to the router."""
        m, now = trainer.machine, time.time()
        self.timeline.add("entry", t=now, machine=m.name, zone=m.zone, attempt=trainer.attempt, payload=payload)
        self.route(
            trainer_entry(
                payload,
                project=self.project,
                zone=m.zone,
                machine=m.name,
                job_id=str(payload.get("job_id") or trainer.job_id),
                attempt=int(payload.get("attempt") or trainer.attempt),
                now=now,
            )
        )

    def _read_stderr(self, trainer: Trainer, stream: IO[bytes], log: IO[bytes]) -> None:
        for raw in stream:
            log.write(raw)
            found = progress(raw.decode(errors="replace"))
            if found is not None:
                step, loss = found
                trainer.step = step
                self.timeline.add("step", machine=trainer.machine.name, attempt=trainer.attempt, step=step, loss=loss)

    def _reap(self, trainer: Trainer, log: IO[bytes]) -> None:
        code = trainer.proc.wait()
        for reader in trainer.readers:
            reader.join(timeout=10)
        log.close()
        self.timeline.add("trainer_exit", machine=trainer.machine.name, attempt=trainer.attempt, code=code)
        if code != 0 and not (trainer.last_word or trainer.preempting or trainer.deleted or self._closed):
            # Killed without a word (OOM, segfault): the startup script logs the `failed` entry for it.
            error = f"the trainer exited with code {code} without a lifecycle entry"
            self._emit(
                trainer, {"event": "failed", "job_id": trainer.job_id, "attempt": trainer.attempt, "error": error}
            )

    def alive(self) -> list[str]:
        with self._lock:
            return [n for n, t in self._trainers.items() if t.proc.poll() is None]

    def stop(self) -> None:
        """Kill every trainer's process group (teardown); no trainer starts after this."""
        with self._lock:
            self._closed = True
            trainers = list(self._trainers.values())
            self._ready.clear()
        for trainer in trainers:
            if trainer.proc.poll() is None:
                self._terminate(trainer, 2.0)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(trainer.proc.pid, signal.SIGKILL)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
