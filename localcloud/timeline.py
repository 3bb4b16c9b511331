"""What happened during a local run, in order: the raw material of the report, the plot and the tests.

Kinds recorded (each with `t`, seconds since the epoch, and `machine` where it applies):
  submitted                     the job message was published (t0 of the run)
  create_call                   the cloud API received a create for `machine` in `zone`
  state                         `machine` changed state (`state`: CREATING, READY, TERMINATED, ...; `zone`)
  deleted                       `machine` was deleted
  notice                        chaos told `machine` it is being preempted (SIGTERM to its `workers`)
  preempted                     `machine` is PREEMPTED and its system events were emitted (`instances`, one per
                                worker VM; `instance` the first)
  trainer_start / trainer_exit  a trainer process of `machine` started (`pid`) / exited (`code`); `worker` on a
                                multi-host slice
  start_after                   `machine` (attempt `attempt`) is a head start's: its startup script runs no trainer
                                before `until` (epoch s), when the noticed machine it replaces is off
  kill_worker / hang_worker     chaos SIGKILLed / SIGSTOPped `worker` of `machine`
  host_error                    `worker`'s VM (`instance`) had a host error: `machine` TERMINATED, its event emitted
  entry                         a lifecycle entry of `machine` (`payload`): its trainer's, its startup script's, or
                                its shutdown script's `notice`
  step                          a training step of `machine`'s trainer, worker 0 (`step`, `loss`)
  secrets                       a trainer process (`pid`) of `machine` holds its secrets (`names`, `delivered`:
                                whether its environment has every value; never a value)
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class Timeline:
    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._file = path.open("a") if path else None

    def add(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"t": fields.pop("t", None) or time.time(), "kind": kind, **fields}
        with self._lock:
            self._events.append(event)
            if self._file:
                self._file.write(json.dumps(event) + "\n")
                self._file.flush()
        return event

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """In the order they were recorded (not always the order of `t`: API calls are copied in late)."""
        with self._lock:
            return [e for e in self._events if kind is None or e["kind"] == kind]

    def last(self, kind: str) -> dict[str, Any] | None:
        found = self.events(kind)
        return found[-1] if found else None

    def close(self) -> None:
        with self._lock:
            if self._file:
                self._file.close()
                self._file = None
