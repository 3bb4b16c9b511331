"""The local stand-ins for what a machine gets from outside: its metadata server, `docker`, `gcloud`, Secret Manager."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from localcloud.machines import machine_host
from localcloud.machines.machine_host import CloudLogging, MetadataServer, SecretManager, container_env
from localcloud.machines.vms import TRAINER_USER, Image

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


def vanish(host: str, request: bytes) -> None:
    """A client that sends `request` and goes away before the answer (its machine deleted mid-request): a reset,
    not a polite close, as a killed process's socket on a VM that powers off."""
    address, _, port = host.partition(":")
    with socket.create_connection((address, int(port)), timeout=5) as s:
        s.sendall(request)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_gone_before_the_answer_leaves_no_traceback_and_the_server_answers_on(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The metadata server and Cloud Logging answer a machine's scripts and trainer; a machine deleted mid-request
    takes its client with it. That is no error of the server's: nothing on stderr (a run that succeeded prints no
    traceback), and the next request is answered."""
    metadata, logging = MetadataServer("proj", {"agent-worker-number": "2"}), CloudLogging(lambda log, entry: None)
    try:
        ask = b"GET /computeMetadata/v1/project/project-id HTTP/1.1\r\nHost: m\r\nMetadata-Flavor: Google\r\n\r\n"
        write = b'POST /v2/entries:write HTTP/1.1\r\nHost: l\r\nContent-Length: 100\r\n\r\n{"entries":'
        for _ in range(10):
            vanish(metadata.host, ask)
            vanish(logging.host, write)  # mid-body
        time.sleep(0.3)  # the servers' threads have met the resets
        assert get(f"http://{metadata.host}/computeMetadata/v1/project/project-id") == (200, "proj")
    finally:
        metadata.close()
        logging.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


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
        ["run", "--name", "c", TRAINER_IMAGE, "-c", script],
        environ | {machine_host.IMAGE_CMD: json.dumps([sys.executable])},
    )
    assert ran.stdout.splitlines()[0] == "10001 10001", ran.stderr
    assert "Permission denied" in ran.stderr and ran.returncode == 1, ran.stderr
    assert (open_ / "f").stat().st_uid == 10001 and not (closed / "f").exists()
    assert "runs as user 10001:10001" in ran.stderr


TRAINER_IMAGE = "us-docker.pkg.dev/respawn-local/respawn/trainer:latest"


def test_the_image_decides_the_user_not_the_command() -> None:
    """respawn's trainer image (either variant, any tag or digest) runs as its USER whether the local cloud runs its
    trainer or a user's program (--entrypoint); any other image as root, as one whose Dockerfile names no USER."""
    entrypoint = Image({}, [sys.executable, "train.py"])
    assert entrypoint.user == Image({}).user == TRAINER_USER
    environ = {machine_host.IMAGE_USER: entrypoint.user}
    for image in (TRAINER_IMAGE, "europe-docker.pkg.dev/p/r/trainer-cuda@sha256:" + "0" * 64, "trainer:v2"):
        assert machine_host.image_user(image, environ) == TRAINER_USER, image
    for image in ("us-docker.pkg.dev/my-project/training/byo-mlp:latest", "us-docker.pkg.dev/p/trainer/llm:1"):
        assert machine_host.image_user(image, environ) == "", image


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="switching users needs root")
def test_a_users_program_in_respawns_trainer_image_runs_as_the_images_user(tmp_path: Path) -> None:
    """`docker run --entrypoint PROGRAM IMAGE`, as a local machine runs a job's --entrypoint: uid 10001 in
    respawn's trainer image, root in the user's own."""
    environ = {
        machine_host.DOCKER_DIR: str(tmp_path / "docker"),
        machine_host.IMAGE_USER: Image({}, [sys.executable, "train.py"]).user,
        "PATH": "/usr/bin:/bin",
    }
    uid = "import os; print(os.getuid())"
    for image, user in ((TRAINER_IMAGE, "10001"), ("us-docker.pkg.dev/my-project/training/byo-mlp:latest", "0")):
        ran = shim("docker", ["run", "--rm", "--entrypoint", sys.executable, image, "-c", uid], environ)
        assert ran.returncode == 0 and ran.stdout.split() == [user], (image, ran.stderr)


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
