"""Run `python -m trainer` as a real process (or the N processes of a multi-host slice on loopback): watch its
progress, signal it, read its lifecycle entries."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from respawn_trainer.slice_env import free_port, worker_env

REPO = Path(__file__).resolve().parents[2]
# One configuration everywhere, so every run after the first loads its programs from the compilation cache.
ARGS = ["--model=nano", "--steps=120", "--seed=7", "--checkpoint-every=10", "--log-every=1"]
STEPS = 120
PROGRESS = re.compile(r" step (\d+)/\d+ loss ")
COMPLETED = re.compile(r"completed step (\d+): loss \S+ params_sha256 ([0-9a-f]{64})")
TMP_MARK = ".orbax-checkpoint-tmp"


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run of ARGS."""

    params_sha256: str
    final_loss: float
    checkpoints: Path  # its checkpoint directory (copy before changing it)


def trainer_env(checkpoint_uri: str, sink: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env.update(
        RESPAWN_JOB_ID="job-test",
        RESPAWN_ATTEMPT="1",
        RESPAWN_CHECKPOINT_URI=checkpoint_uri,
        RESPAWN_LOG_SINK=str(sink),
        RESPAWN_COMPILE_CACHE=str(cache),
        RESPAWN_GRACE_S="10",
        JAX_PLATFORMS="cpu",
    )
    env.update(extra)
    return env


@dataclass
class Run:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    stderr: list[str] = field(default_factory=list)
    step: int = 0  # the newest step seen in the progress lines

    def wait_step(self, target: int, timeout: float = 120.0) -> int:
        """Block until the trainer reports a step >= target; returns that step (or the last one if it exited)."""
        deadline = time.monotonic() + timeout
        while self.step < target:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise TimeoutError(f"no step {target} within {timeout}s:\n{self.tail()}") from None
            if line is None:
                return self.step
            match = PROGRESS.search(line)
            if match:
                self.step = int(match.group(1))
        return self.step

    def signal(self, sig: int) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def finish(self, timeout: float = 180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def tail(self, n: int = 30) -> str:
        return "".join(self.stderr[-n:])


def start(env: dict[str, str], args: list[str] | None = None) -> Run:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *(ARGS if args is None else args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = Run(proc)

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            run.stderr.append(line)
            run.lines.put(line)
        run.lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return run


def run_to_end(env: dict[str, str], args: list[str] | None = None, timeout: float = 180.0) -> tuple[int, Run]:
    run = start(env, args)
    code = run.finish(timeout)
    return code, run


def entries(sink: Path) -> list[dict]:
    if not sink.exists():
        return []
    return [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]


def last(sink: Path, event: str) -> dict:
    found = [e for e in entries(sink) if e["event"] == event]
    assert found, f"no {event} entry in {[e['event'] for e in entries(sink)]}"
    return found[-1]


def assert_no_step_redone_after_stops(sink: Path) -> None:
    """After each `stopped` the next attempt's first step is stopped.step + 1: started.restored_step == stopped.step."""
    events = entries(sink)
    stops = [i for i, e in enumerate(events) if e["event"] == "stopped"]
    assert stops
    for i in stops:
        following = next(e for e in events[i + 1 :] if e["event"] == "started")
        assert following["restored_step"] == events[i]["step"]


class EntryClock:
    """Polls a sink file and notes when each entry appeared (time.monotonic()), to check the rate of entries."""

    def __init__(self, sink: Path, every: float = 0.02) -> None:
        self.sink, self.every = sink, every
        self.seen: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            found = entries(self.sink)
            now = time.monotonic()
            self.seen += [(now, e) for e in found[len(self.seen) :]]
            self._stop.wait(self.every)

    def stop(self) -> list[tuple[float, dict]]:
        self._stop.set()
        self._thread.join()
        return self.seen


def committed_steps(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


def saving(directory: Path) -> list[str]:
    """Step directories of saves in flight (not yet committed by the atomic rename)."""
    return [p.name for p in directory.iterdir() if TMP_MARK in p.name] if directory.exists() else []


def kill_hard(run: Run) -> None:
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=30)


class MetadataServer:
    """The GCE metadata server on loopback: `instance/preempted` answers FALSE until preempt(), then TRUE; any
    other path under /computeMetadata/v1/ answers from `answers`, else 404. POSTs (any path) are recorded with
    their Authorization header: a stand-in for a Google API the machine's token authorizes."""

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.preempted = False
        self.requests: list[dict[str, str]] = []
        self.posts: list[tuple[str, str, dict]] = []  # path, Authorization, JSON body
        outer = self
        prefix = "/computeMetadata/v1/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append({"path": self.path, "flavor": self.headers.get("Metadata-Flavor", "")})
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                    return
                key = self.path.removeprefix(prefix)
                if key == "instance/preempted":
                    self._answer(b"TRUE" if outer.preempted else b"FALSE")
                elif self.path.startswith(prefix) and key in (answers or {}):
                    self._answer((answers or {})[key].encode())
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.posts.append((self.path, self.headers.get("Authorization", ""), body))
                self._answer(b"{}")

            def _answer(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.root}/computeMetadata/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def worker_sink(sink: Path, worker: int) -> Path:
    """Worker 0 writes to `sink` itself; the others to a file of their own (which must stay empty)."""
    return sink if worker == 0 else sink.with_name(f"{sink.stem}.worker{worker}{sink.suffix}")


@dataclass
class Slice:
    """The trainer processes of one multi-host slice: worker i is TPU_WORKER_ID i."""

    runs: list[Run]
    sink: Path

    @property
    def lead(self) -> Run:
        return self.runs[0]

    def wait_step(self, target: int, timeout: float = 180.0) -> int:
        """Worker 0's newest step once it is >= target (every worker runs the same steps)."""
        return self.lead.wait_step(target, timeout)

    def signal(self, sig: int, workers: list[int] | None = None) -> float:
        for i in range(len(self.runs)) if workers is None else workers:
            if self.runs[i].proc.poll() is None:
                self.runs[i].proc.send_signal(sig)
        return time.monotonic()

    def kill_all(self) -> None:
        """What a launcher does once a worker is gone: SIGKILL the rest."""
        self.signal(signal.SIGKILL)
        for run in self.runs:
            run.proc.wait(timeout=30)

    def finish(self, timeout: float = 240.0) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [run.proc.wait(timeout=max(deadline - time.monotonic(), 0.01)) for run in self.runs]
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise

    def hashes(self) -> list[str | None]:
        """The params_sha256 each process logged when it completed (None: it did not)."""
        found = [COMPLETED.findall("".join(run.stderr)) for run in self.runs]
        return [f[-1][1] if f else None for f in found]

    def tail(self, n: int = 15) -> str:
        return "\n".join(f"--- worker {i} (exit {r.proc.poll()}):\n{r.tail(n)}" for i, r in enumerate(self.runs))


def start_slice(
    env: dict[str, str], hosts: int, devices_per_host: int, args: list[str] | None = None, port: int | None = None
) -> Slice:
    """`hosts` trainer processes with the environment of a TPU slice's workers (respawn_trainer.slice_env), on
    loopback."""
    port = port or free_port()
    sink = Path(env["RESPAWN_LOG_SINK"])
    runs = [
        start(
            {**env, **worker_env(i, hosts, port, devices_per_host), "RESPAWN_LOG_SINK": str(worker_sink(sink, i))}, args
        )
        for i in range(hosts)
    ]
    return Slice(runs, sink)


def run_slice_to_end(
    env: dict[str, str], hosts: int, devices_per_host: int, args: list[str] | None = None, timeout: float = 240.0
) -> tuple[list[int], Slice]:
    run = start_slice(env, hosts, devices_per_host, args)
    return run.finish(timeout), run
