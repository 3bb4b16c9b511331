"""The local stand-ins for what a machine gets from outside: its metadata server, `docker`, `gcloud`, Secret Manager."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from localcloud.machines import machine_host
from localcloud.machines.machine_host import CloudLogging, MetadataServer, SecretManager, container_env

pytestmark = pytest.mark.waits

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


def call(url: str, body: bytes | None = None, token: bool = True) -> tuple[int, str]:
    """GET (or POST `body`) as the machine's scripts do with curl: with the machine's token."""
    request = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer local"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_secret_manager_answers_the_access_call_with_the_value_in_base64() -> None:
    manager = SecretManager({REF: "s3cret\nvalue"})
    try:
        status, body = call(f"{manager.endpoint}v1/{REF}:access")
        assert status == 200 and base64.b64decode(json.loads(body)["payload"]["data"]) == b"s3cret\nvalue"
        assert call(f"{manager.endpoint}v1/{REF}0:access")[0] == 404
        assert call(f"{manager.endpoint}v1/{REF}:access", token=False)[0] == 401
    finally:
        manager.close()


def test_cloud_logging_hands_each_entry_of_an_entries_write_to_the_machine() -> None:
    got: list[tuple[str, dict[str, object]]] = []
    server = CloudLogging(lambda log, payload: got.append((log, payload)))
    entry = {"logName": "projects/p/logs/respawn-trainer", "resource": {"type": "global"}, "jsonPayload": {"a": 1}}
    write = f"{server.endpoint}v2/entries:write"
    try:
        assert call(write, json.dumps({"entries": [entry]}).encode()) == (200, "{}")
        assert call(write, json.dumps({"entries": [entry]}).encode(), token=False)[0] == 401
        assert call(write, b'{"entries": [{"logName": 3}]}')[0] == 400
        assert call(f"{server.endpoint}v2/entries:list", b"{}")[0] == 404
    finally:
        server.close()
    assert got == [("respawn-trainer", {"a": 1})]


def test_the_images_gcloud_is_a_snap_that_fails_once_the_vm_shuts_down(tmp_path: Path) -> None:
    running = shim("gcloud", ["logging", "write", "respawn-trainer", "{}"], {"HOME": str(tmp_path)})
    assert running.returncode == 2 and "has no" in running.stderr
    (tmp_path / machine_host.SHUTTING_DOWN).touch()
    stopping = shim("gcloud", ["logging", "write", "respawn-trainer", "{}"], {"HOME": str(tmp_path)})
    assert stopping.returncode == 1 and "TransactionIsDestructive" in stopping.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="switching users needs root")
def test_a_container_runs_as_the_images_user_and_writes_only_where_it_may(tmp_path: Path) -> None:
    """uid 10001, as respawn's trainer image: its HOME is its own; a directory made by root with mode 0755 (the
    notice file's before it was 1777) is not writable to it; 1777 is."""
    state, closed, open_ = tmp_path / "docker", tmp_path / "closed", tmp_path / "open"
    closed.mkdir(mode=0o755)
    open_.mkdir()
    open_.chmod(0o1777)
    script = (
        "import os, pathlib; print(os.getuid(), os.getgid()); pathlib.Path(os.environ['HOME'], 'h').touch(); "
        f"pathlib.Path({str(open_)!r}, 'f').touch(); pathlib.Path({str(closed)!r}, 'f').touch()"
    )
    environ = {machine_host.DOCKER_DIR: str(state), machine_host.IMAGE_USER: "10001:10001", "PATH": "/usr/bin:/bin"}
    ran = shim(
        "docker",
        ["run", "--name", "c", "img", "-c", script],
        environ | {machine_host.IMAGE_CMD: json.dumps([sys.executable])},
    )
    assert ran.stdout.splitlines()[0] == "10001 10001", ran.stderr
    assert "Permission denied" in ran.stderr and ran.returncode == 1, ran.stderr
    assert (open_ / "f").stat().st_uid == 10001 and not (closed / "f").exists()
    assert "runs as user 10001:10001" in ran.stderr


def test_the_daemon_stops_each_container_with_its_own_stop_timeout(tmp_path: Path) -> None:
    """A container that takes 1.5 s to stop on SIGTERM: killed at docker's default (here shortened) without
    --stop-timeout, given its time with it."""
    state = tmp_path / "docker"
    environ = {machine_host.DOCKER_DIR: str(state), machine_host.IMAGE_CMD: json.dumps([sys.executable, "-c"])}
    slow = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))"
    slow += "; time.sleep(60)"
    runs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "localcloud.machines.machine_host",
                "docker",
                "run",
                "--name",
                name,
                *opts,
                "img",
                slow,
            ],
            env={**environ, "PYTHONPATH": str(Path(machine_host.__file__).resolve().parents[2])},
        )
        for name, opts in (("default", []), ("given", ["--stop-timeout", "5"]))
    }
    deadline = time.monotonic() + 20
    while any(machine_host.container_pid(state, name) is None for name in runs) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the programs have set their handlers
    (state / "default.stop-timeout").write_text("0.5")  # docker's 10 s, shortened
    machine_host.stop_all(state)
    codes = {name: proc.wait(timeout=10) for name, proc in runs.items()}
    assert codes == {"default": 137, "given": 0}


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
