"""`--model=none`: no JAX; each step sleeps --step-time. For load tests of the control plane.

The state is {"step": N}; its checkpoint is a one-line JSON marker `none-progress.json` under the checkpoint
URI (local or gs://, through fsspec), written whole (rename on a file system; GCS object writes are atomic),
so restarts resume too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from respawn_trainer.schedule import SaveDone

MARKER = "none-progress.json"


def sleep_step(step_time: float) -> Callable[[Any, int], Any]:
    def step(state: Any, number: int) -> Any:
        time.sleep(step_time)
        return {"step": number}

    return step


class MarkerCheckpoints:
    """A respawn_trainer checkpointer for the sleeper's state."""

    def __init__(self, checkpoint_uri: str) -> None:
        self.fs, root = fsspec.core.url_to_fs(checkpoint_uri)
        self.path = f"{root.rstrip('/')}/{MARKER}"
        self._done: list[SaveDone] = []

    def restore_newest(self, template: Any, agree_any: Callable[[bool], bool]) -> tuple[Any, int] | None:
        if not self.fs.exists(self.path):
            return None
        step = int(json.loads(self.fs.cat_file(self.path))["step"])
        return {"step": step}, step

    def save(self, step: int, state: Any) -> float:
        started = time.monotonic()
        self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        body = json.dumps({"step": step})
        if isinstance(self.fs, LocalFileSystem):
            tmp = f"{self.path}.{os.getpid()}.tmp"  # each process its own: every worker of a slice saves here
            self.fs.pipe_file(tmp, body.encode())
            self.fs.mv(tmp, self.path)
        else:
            self.fs.pipe_file(self.path, body.encode())
        blocking = time.monotonic() - started
        self._done.append(SaveDone(step, blocking, blocking))
        return blocking

    def poll(self) -> list[SaveDone]:
        done, self._done = self._done, []
        return done

    def wait(self) -> list[SaveDone]:
        return self.poll()

    def close(self) -> None:
        return None
