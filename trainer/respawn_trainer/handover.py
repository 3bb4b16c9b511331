"""A head start's two trainers hand the job over through two small objects beside the checkpoints.

The noticed machine's trainer (RESPAWN_HANDOVER=PREFIX, every attempt of a job with a head start) trains on after a
preemption notice until its successor says it is ready (`PREFIX.ready`), within half its grace less two saves, then
saves and writes `PREFIX.exited` once that save is durable. The successor's trainer (RESPAWN_TAKEOVER=PREFIX, the
noticed attempt's, and RESPAWN_START_AFTER, on a head start's machine whose image starts early) sets itself up while
the noticed one trains, writes `PREFIX.ready`, and restores only once `PREFIX.exited` exists or the noticed machine
is off (RESPAWN_START_AFTER, epoch seconds). So the job stops training only for one save and one restore.

PREFIX is a gs:// object prefix (Cloud Storage's JSON API with the metadata server's token, or STORAGE_EMULATOR_HOST's
server without one, as Google's client libraries do; no client library to import on the way to the first step) or
a local path. Everything here is best effort: a lost object costs time, never a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from respawn_trainer.env import RunEnv
from respawn_trainer.lifecycle import MetadataServer
from respawn_trainer.notice import metadata_preempted

log = logging.getLogger("trainer")
POLL_S = 0.1  # how often a waiting trainer asks for the other's object
TIMEOUT_S = 5.0
READY, EXITED = ".ready", ".exited"


class Objects:
    """Small objects by URI: gs://BUCKET/OBJECT through Cloud Storage's JSON API, else local files."""

    def __init__(self, token: Callable[[], str] | None = None) -> None:
        host = os.environ.get("STORAGE_EMULATOR_HOST", "")
        self.base = (host if "://" in host else f"http://{host}") if host else "https://storage.googleapis.com"
        self.token = None if host else token

    def _request(
        self, url: str, data: bytes | None = None, content_type: str = "application/json"
    ) -> urllib.request.Request:
        headers = {"Content-Type": content_type} if data is not None else {}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token()}"
        return urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        return bucket, urllib.parse.quote(name, safe="")

    def exists(self, uri: str) -> bool:
        if not uri.startswith("gs://"):
            return os.path.exists(uri)
        bucket, name = self._split(uri)
        try:
            with urllib.request.urlopen(
                self._request(f"{self.base}/storage/v1/b/{bucket}/o/{name}"), timeout=TIMEOUT_S
            ):
                return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def get(self, uri: str) -> bytes | None:
        """The object's bytes, or None where there is none yet (objects.get with alt=media:
        https://cloud.google.com/storage/docs/json_api/v1/objects/get)."""
        if not uri.startswith("gs://"):
            try:
                return Path(uri).read_bytes()
            except FileNotFoundError:
                return None
        bucket, name = self._split(uri)
        url = f"{self.base}/storage/v1/b/{bucket}/o/{name}?alt=media"
        try:
            with urllib.request.urlopen(self._request(url), timeout=TIMEOUT_S) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def put(self, uri: str, payload: dict[str, object]) -> None:
        self.write(uri, json.dumps(payload).encode())

    def write(self, uri: str, data: bytes, content_type: str = "application/json") -> None:
        """One upload (https://cloud.google.com/storage/docs/uploading-objects, JSON API, uploadType=media), whole or
        not at all; a local file is renamed into place, so that a reader never sees half of it either."""
        if not uri.startswith("gs://"):
            path = Path(uri)
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f".{path.name}.{os.getpid()}.part")
            part.write_bytes(data)
            os.replace(part, path)
            return
        bucket, name = self._split(uri)
        url = f"{self.base}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        with urllib.request.urlopen(self._request(url, data, content_type), timeout=TIMEOUT_S) as response:
            response.read()


def say(objects: Objects, uri: str, payload: dict[str, object]) -> None:
    """Write one of the two objects; a failure is logged, and the other side waits for its bound instead."""
    try:
        objects.put(uri, payload)
    except (OSError, ValueError) as e:
        log.warning("could not write %s (%s)", uri, e)


def wait_for(objects: Objects, uri: str, until: float, stop: Callable[[], bool]) -> str:
    """Poll for `uri` until it exists ("found"), the epoch second `until` passes ("timeout") or stop() ("stopped")."""
    warned = False
    while True:
        if stop():
            return "stopped"
        try:
            if objects.exists(uri):
                return "found"
        except (OSError, ValueError) as e:
            if not warned:
                log.warning("cannot read %s (%s); still waiting", uri, e)
                warned = True
        if time.time() >= until:
            return "timeout"
        time.sleep(POLL_S)


def preempted(notice_file: str | None, metadata_url: str | None = None) -> bool:
    """Whether the notice is a preemption (a deletion by respawn, for a cancel or a hang, has no successor to hand
    over to): the metadata server says `instance/preempted` TRUE, or the startup or shutdown script wrote `preempted`
    in the notice file. The server first: the docker daemon stops the container in parallel with the shutdown script,
    so SIGTERM may come before the script has written the file."""
    if metadata_url and metadata_preempted(metadata_url):
        return True
    if not notice_file:
        return False
    try:
        return Path(notice_file).read_text().strip() == "preempted"
    except OSError:
        return False


def objects_for(env: RunEnv) -> Objects:
    server = MetadataServer(env.metadata_url) if env.metadata_url else None
    return Objects(server.token if server else None)


class Notice(Protocol):
    @property
    def noticed(self) -> bool: ...
    def notice(self, source: str, after_s: float = 0.0) -> None: ...


class Handover:
    """The noticed side: trains on after a preemption notice until the successor is ready, then hands over."""

    def __init__(self, env: RunEnv, objects: Objects) -> None:
        assert env.handover
        window = min(env.grace_s, env.window_s or env.grace_s)  # a local cloud's VM may be off before the grace ends
        self.prefix, self.grace_s, self.notice_file = env.handover, window * env.time_scale, env.notice_file
        self.metadata_url = env.metadata_url
        self.objects, self.longest_save_s = objects, 0.0
        self._thread: threading.Thread | None = None

    def saved(self, seconds: float) -> None:
        """A save took this long, start to durable: the final one may too."""
        self.longest_save_s = max(self.longest_save_s, seconds)

    def train_on_s(self) -> float:
        """How long to train on after the notice: half the grace less two of the longest saves, on a preemption."""
        if not preempted(self.notice_file, self.metadata_url):
            return 0.0
        return max(0.0, self.grace_s / 2 - 2 * self.longest_save_s)

    def on_notice(self, watch: Notice) -> float:
        """At SIGTERM: seconds to train on, and meanwhile a watch for the successor's `ready` (the notice at once)."""
        seconds = self.train_on_s()
        if seconds > 0 and self._thread is None:
            until = time.time() + seconds

            def watch_ready() -> None:
                if wait_for(self.objects, self.prefix + READY, until, lambda: watch.noticed) == "found":
                    watch.notice("the next machine is ready")

            self._thread = threading.Thread(target=watch_ready, name="handover", daemon=True)
            self._thread.start()
        return seconds

    def drained(self, job_id: str, attempt: int, step: int) -> None:
        """The final save on the notice is durable: the successor may restore it."""
        say(self.objects, self.prefix + EXITED, {"job_id": job_id, "attempt": attempt, "step": step})


def take_over(env: RunEnv, objects: Objects, watch: Notice, primary: bool) -> tuple[str, float]:
    """The successor's side, before its restore: `ready`, then the wait. (outcome of wait_for, seconds waited)."""
    assert env.takeover
    began = time.monotonic()
    if primary:
        say(objects, env.takeover + READY, {"job_id": env.job_id, "attempt": env.attempt})
    outcome = wait_for(objects, env.takeover + EXITED, env.start_after, lambda: watch.noticed)
    waited = time.monotonic() - began
    log.info("%.2fs waiting for %s: %s", waited, env.takeover + EXITED, _OUTCOMES[outcome])
    return outcome, waited


_OUTCOMES = {
    "found": "its final save is done; restoring it",
    "timeout": "not written by RESPAWN_START_AFTER, when that machine is off; restoring the newest save",
    "stopped": "this machine got the notice meanwhile; exiting without a save",
}
