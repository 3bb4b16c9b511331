"""Worlds of several slices on loopback: each slice's hosts are trainer processes (1 CPU device each here), each slice
has a metadata server of its own (its own `instance/preempted`), and all of them serve one `respawn-world` key with
the metadata server's hanging GET (`wait_for_change`, `last_etag`, `timeout_sec`), as a VM's does."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from trainer_harness import Run, start

from localcloud.machines.quiet_server import QuietServer
from respawn_trainer.slice_env import free_port, host_env

PREFIX = "/computeMetadata/v1/"
WORLD_KEY = "instance/attributes/respawn-world"
LOSS = re.compile(r" step (\d+)/\d+ loss (\S+) ")


class WorldKey:
    """The `respawn-world` value every member's metadata server serves; set() wakes the hanging GETs."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.etag = 0
        self.changed = threading.Condition()

    def set(self, version: int, members: list[int], coordinator: str | None = None, step: int | None = None) -> None:
        """Without a coordinator, the control plane's value (version, members, step): the trainers find it."""
        world: dict[str, Any] = {"version": version, "members": members, "step": step}
        if coordinator is not None:
            world.update(coordinator=coordinator, process_ids={})
        with self.changed:
            self.value, self.etag = json.dumps(world), self.etag + 1
            self.changed.notify_all()

    def answer(self, query: dict[str, str]) -> tuple[str | None, str]:
        """The value and its ETag, after waiting (wait_for_change) for one other than last_etag, at most timeout_sec."""
        with self.changed:
            if query.get("wait_for_change") == "true":
                seen = query.get("last_etag", str(self.etag))
                self.changed.wait_for(lambda: str(self.etag) != seen, timeout=float(query.get("timeout_sec", 60)))
            return self.value, str(self.etag)


class SliceMetadata:
    """One slice's metadata server: `instance/preempted` (preempted) and the world key; counts the key's GETs."""

    def __init__(self, key: WorldKey) -> None:
        self.preempted, self.key, self.world_gets = False, key, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                name = path.removeprefix(PREFIX)
                if name == "instance/preempted":
                    self._answer(b"TRUE" if outer.preempted else b"FALSE", "0")
                    return
                if name != WORLD_KEY:
                    self.send_error(404)
                    return
                outer.world_gets += 1
                value, etag = outer.key.answer(dict(urllib.parse.parse_qsl(query)))
                if value is None:
                    self.send_error(404)
                else:
                    self._answer(value.encode(), etag)

            def _answer(self, body: bytes, etag: str) -> None:
                self.send_response(200)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/computeMetadata/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def coordinator() -> str:
    return f"127.0.0.1:{free_port()}"


def world_env(env: dict[str, str], version: int, slice_: int, metadata: SliceMetadata, root: Path) -> dict[str, str]:
    """The environment of slice `slice_`'s one host in world `version`: its own sink, local copy dir, metadata."""
    return {
        **env,
        **host_env(1, 1),  # JAX_PLATFORMS, gloo, one CPU device; the coordinator comes from the world key
        "RESPAWN_WORLD_VERSION": str(version),
        "RESPAWN_SLICE": str(slice_),
        "RESPAWN_METADATA_URL": metadata.url,
        "RESPAWN_LOCAL_COPY_DIR": str(root / f"local-{slice_}"),
        "RESPAWN_LOG_SINK": str(root / f"entries-{slice_}.jsonl"),
        "RESPAWN_NOTICE_FILE": str(root / f"notice-{slice_}"),
    }


def start_world(
    env: dict[str, str],
    version: int,
    members: list[int],
    servers: dict[int, SliceMetadata],
    root: Path,
    args: list[str],
) -> dict[int, Run]:
    return {s: start(world_env(env, version, s, servers[s], root), args) for s in members}


def losses(runs: list[Run]) -> dict[int, list[float]]:
    """Every loss each step was logged with, over the runs (a step trained twice shows twice)."""
    found: dict[int, list[float]] = {}
    for run in runs:
        for step, loss in LOSS.findall("".join(run.stderr)):
            found.setdefault(int(step), []).append(float(loss))
    return found


def finish_all(runs: dict[int, Run], timeout: float = 180.0) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    return {s: run.finish(max(deadline - time.monotonic(), 0.01)) for s, run in runs.items()}


def tails(runs: dict[int, Run]) -> str:
    return "\n".join(f"--- slice {s} (exit {r.proc.poll()}):\n{r.tail(20)}" for s, r in runs.items())


def entries_of(root: Path, slice_: int) -> list[dict[str, Any]]:
    path = root / f"entries-{slice_}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
