"""`--model=none`: no JAX, each step sleeps --step-time. For load tests of the control plane.

Progress is a one-line JSON marker `none-progress.json` under the checkpoint URI (local or gs://, through
fsspec), written whole (rename on a file system; GCS object writes are atomic), so restarts resume too.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import fsspec
from fsspec.implementations.local import LocalFileSystem

from trainer.schedule import SaveDone

MARKER = "none-progress.json"


class SleepEngine:
    def __init__(self, seed: int, step_time: float, checkpoint_uri: str) -> None:
        self.seed, self.step_time = seed, step_time
        self.fs, root = fsspec.core.url_to_fs(checkpoint_uri)
        self.path = f"{root.rstrip('/')}/{MARKER}"
        self.step = 0
        self._done: list[SaveDone] = []

    def restore(self) -> int:
        if self.fs.exists(self.path):
            self.step = int(json.loads(self.fs.cat_file(self.path))["step"])
        return self.step

    def run_step(self, step: int) -> None:
        time.sleep(self.step_time)
        self.step = step

    def loss(self) -> float:
        return 0.0

    def save(self, step: int) -> float:
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

    def agree(self, flag: bool) -> bool:
        return flag

    def agree_max(self, value: float) -> float:
        return value

    def fingerprint(self) -> str:
        return hashlib.sha256(f"none|{self.seed}|{self.step}".encode()).hexdigest()

    def close(self) -> None:
        return None
