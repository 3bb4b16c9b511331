"""The local stand-ins for what a machine gets from outside: its metadata server, `docker`, `gcloud`, Secret Manager."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from localcloud.machines import machine_host
from localcloud.machines.machine_host import MetadataServer, SecretManager, container_env

REF = "projects/p/secrets/hf/versions/1"


def get(url: str, flavor: bool = True) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"} if flavor else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_the_metadata_server_answers_as_googles_does() -> None:
    server = MetadataServer("proj", {"agent-worker-number": "2", "startup-script": "#!/bin/bash"})
    base = f"http://{server.host}/computeMetadata/v1"
    try:
        assert get(f"{base}/instance/attributes/agent-worker-number") == (200, "2")
        assert get(f"{base}/instance/attributes/agent-worker-number", flavor=False)[0] == 403
        assert get(f"{base}/instance/attributes/worker-network-endpoints")[0] == 404
        assert get(f"{base}/instance/preempted") == (200, "FALSE")
        server.preempted = True
        assert get(f"{base}/instance/preempted") == (200, "TRUE")
        assert get(f"{base}/project/project-id") == (200, "proj")
    finally:
        server.close()


def shim(tool: str, args: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcloud.machines.machine_host", tool, *args],
        env={**env, "PYTHONPATH": str(Path(machine_host.__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=30,
        **kw,  # type: ignore[call-overload]
    )


def test_gcloud_reads_secrets_from_the_local_secret_manager_and_prints_lifecycle_entries(tmp_path: Path) -> None:
    manager = SecretManager({REF: "s3cret\nvalue"})
    env = {machine_host.SECRET_MANAGER: manager.url}
    try:
        assert shim("gcloud", ["secrets", "versions", "access", REF, "--quiet"], env).stdout == "s3cret\nvalue"
        missing = shim("gcloud", ["secrets", "versions", "access", REF + "0", "--quiet"], env)
        assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    finally:
        manager.close()
    entry = shim("gcloud", ["logging", "write", "respawn-trainer", '{"event": "failed"}', "--payload-type=json"], env)
    assert (entry.returncode, entry.stdout) == (0, '{"event":"failed"}\n')


def test_a_container_gets_the_images_environment_and_what_its_options_pass(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("# a comment\nFROM_FILE=f\n")
    environ = {machine_host.IMAGE_ENV: json.dumps({"IMAGE": "i", "KEY": "old"}), "SECRET": "s", "HOST_ONLY": "h"}
    opts = [("-e", "KEY=new"), ("-e", "SECRET"), ("-e", "UNSET"), ("--env-file", str(tmp_path / "env"))]
    opts += [("-e", "RESPAWN_LOG_SINK=cloud")]
    assert container_env(opts, environ) == {
        "IMAGE": "i",
        "KEY": "new",
        "SECRET": "s",
        "FROM_FILE": "f",
        "RESPAWN_LOG_SINK": "stdout",  # the machine reads Cloud Logging's lifecycle entries on stdout
    }


@pytest.mark.parametrize(("trap", "code"), [("", 143), ("signal.signal(signal.SIGTERM, signal.SIG_IGN); ", 137)])
def test_docker_stop_sends_sigterm_then_sigkill_after_its_timeout(tmp_path: Path, trap: str, code: int) -> None:
    program = f"import signal, time; {trap}print('up', flush=True); time.sleep(60)"
    env = {
        machine_host.DOCKER_DIR: str(tmp_path / "docker"),
        machine_host.IMAGE_CMD: json.dumps([sys.executable, "-c", program]),
        "PYTHONPATH": str(Path(machine_host.__file__).resolve().parents[2]),
    }
    run = subprocess.Popen(
        [sys.executable, "-m", "localcloud.machines.machine_host", "docker", "run", "--rm", "--name", "t", "image"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None and run.stdout.readline() == "up\n"
        t0 = time.monotonic()
        stopped = shim("docker", ["stop", "-t", "1", "t"], env)
        assert (stopped.returncode, stopped.stdout) == (0, "t\n")
        assert run.wait(timeout=10) == code  # docker's codes: 128 + the signal that ended the container
        assert time.monotonic() - t0 < (1.0 if not trap else 5.0)
        assert shim("docker", ["stop", "-t", "1", "t"], env).returncode == 1  # --rm: it is gone
    finally:
        run.kill()
        run.wait()


def test_signals_after_the_container_exited_leave_docker_runs_exit_code_its_containers(tmp_path: Path) -> None:
    """A noticed machine is deleted as soon as its trainer's `stopped` entry arrives: the deletion's SIGTERM can
    reach `docker run` just as its container exits 0. The exit code stays the container's (0), or the startup
    script would not write the drain marker the next machine waits for."""
    ignores = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"  # a trainer that saves on SIGTERM, then exits 0
    program = f"import signal, time; {ignores}; print('up', flush=True); time.sleep(0.3)"
    env = {
        machine_host.DOCKER_DIR: str(tmp_path / "docker"),
        machine_host.IMAGE_CMD: json.dumps([sys.executable, "-c", program]),
        "PYTHONPATH": str(Path(machine_host.__file__).resolve().parents[2]),
    }
    for _ in range(3):
        run = subprocess.Popen(
            [sys.executable, "-m", "localcloud.machines.machine_host", "docker", "run", "--rm", "--name", "t", "image"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert run.stdout is not None and run.stdout.readline() == "up\n"
        while run.poll() is None:  # SIGTERM after SIGTERM, up to and past the container's exit
            with contextlib.suppress(ProcessLookupError):
                run.send_signal(signal.SIGTERM)
            time.sleep(0.001)
        assert run.returncode == 0
