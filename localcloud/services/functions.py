"""The two Cloud Functions, run locally by functions-framework exactly as deployed (functions/main.py).

By default each is one server handling many requests at once on threads; with `instances` (the fleet mode), a
function is a pool of that many instances taking one request each, as Terraform deploys it (function_pool.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import respawn
from localcloud.services.emulators import start_group, stop_group, wait_http
from respawn_trainer.slice_env import free_port

MAIN = Path(str(respawn.__file__)).resolve().parents[1] / "main.py"  # functions/main.py, beside the respawn package
TARGETS = ("on_job_message", "on_event")


def functions_framework_argv(target: str, port: int) -> list[str]:
    exe = shutil.which("functions-framework", path=str(Path(sys.executable).parent)) or shutil.which(
        "functions-framework"
    )
    head = [exe] if exe else [sys.executable, "-m", "functions_framework"]
    return [*head, "--target", target, "--source", str(MAIN), "--signature-type", "cloudevent", "--port", str(port)]


def pool_argv(target: str, port: int, instances: int, timeout_s: int) -> list[str]:
    """The function as `instances` instances of one request each (function_pool.py), `timeout_s` per request."""
    head = [sys.executable, "-m", "localcloud.services.function_pool", "--target", target, "--source", str(MAIN)]
    return [*head, "--port", str(port), "--instances", str(instances), "--timeout", str(timeout_s)]


class FunctionServers:
    """One functions-framework server per entry point, each in its own process group; an entry point named in
    `instances` runs as a pool of that many one-request instances, each request cut at `timeout_s` (0: never)."""

    def __init__(
        self, env: Mapping[str, str], log_dir: Path, instances: Mapping[str, int] | None = None, timeout_s: int = 0
    ) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = log_dir
        self.instances = dict(instances or {})
        self.timeout_s = timeout_s
        self.urls: dict[str, str] = {}
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> FunctionServers:
        for target in TARGETS:
            port = free_port()
            log = (self.log_dir / f"{target}.log").open("ab")
            n = self.instances.get(target)
            proc = start_group(
                pool_argv(target, port, n, self.timeout_s) if n else functions_framework_argv(target, port),
                env={**self.env, "THREADS": "16"},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(MAIN.parent),
            )
            log.close()
            self._procs.append(proc)
            self.urls[target] = f"http://127.0.0.1:{port}"
        for proc, url in zip(self._procs, self.urls.values(), strict=True):
            wait_http(url, timeout=60, proc=proc)
        return self

    def stop(self) -> None:
        for proc in self._procs:
            stop_group(proc, grace=3)
        self._procs.clear()
