"""The local machine's timed steps: the docker shim's pulls and trainer start, apt-get's Docker install, and the real
startup script on a local VM pulling the image once per machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from localcloud.machines import machine_host
from localcloud.machines.machine_host import CloudLogging, MetadataServer
from localcloud.machines.vms import machine_step
from respawn.adapters.startup import DATA_DIR_ENV, IMAGE_MARK_ENV, TAKEOVER_LABEL, startup_script
from respawn.jobs import JobSpec, TpuMachine
from respawn.machine import NOTICE_ENV

FUNCTIONS = str(Path(machine_host.__file__).resolve().parents[2])
IMAGE = "us-docker.pkg.dev/proj/repo/trainer:1"


def shim(tool: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "localcloud.machines.machine_host", tool, *args]
    return subprocess.run(command, env={"PYTHONPATH": FUNCTIONS, **env}, capture_output=True, text=True, timeout=60)


def steps(stderr: str) -> list[tuple[str, float, float]]:
    found = (machine_step(line.encode()) for line in stderr.splitlines())
    return [s for s in found if s is not None]


def test_a_pull_takes_the_pull_time_once_then_the_refresh_time(tmp_path: Path) -> None:
    env = {machine_host.DOCKER_DIR: str(tmp_path), machine_host.PULL_S: "0.4", machine_host.REFRESH_S: "0"}
    assert shim("docker", ["image", "inspect", IMAGE], env).returncode == 1
    first = shim("docker", ["pull", IMAGE], env)
    assert first.stdout == f"Status: Downloaded newer image for {IMAGE}\n"
    ((name, start, end),) = steps(first.stderr)
    assert name == "pull" and end - start >= 0.4
    second = shim("docker", ["pull", IMAGE], env)
    assert second.stdout == f"Status: Image is up to date for {IMAGE}\n"
    ((_, start, end),) = steps(second.stderr)
    assert end - start < 0.4
    inspect = shim("docker", ["image", "inspect", IMAGE], env)
    assert inspect.returncode == 0 and json.loads(inspect.stdout) == [{"RepoTags": [IMAGE], "Config": {"Labels": None}}]
    labelled = {**env, machine_host.IMAGE_LABELS: json.dumps({TAKEOVER_LABEL: "1"})}
    labels = shim("docker", ["image", "inspect", "--format", machine_host.LABELS_FORMAT, IMAGE], labelled)
    assert labels.returncode == 0 and labels.stdout == f'{{"{TAKEOVER_LABEL}":"1"}}\n'
    assert shim("docker", ["image", "inspect", "--format", "{{.Id}}", IMAGE], env).returncode == 1
    assert shim("docker", ["image", "inspect", "other:1"], env).stderr.strip().endswith("No such image: other:1")


def test_the_trainer_starts_after_the_start_delay_and_a_stop_meanwhile_ends_it(tmp_path: Path) -> None:
    program = "import time; print(time.time(), flush=True)"
    env = {
        machine_host.DOCKER_DIR: str(tmp_path),
        machine_host.IMAGE_CMD: json.dumps([sys.executable, "-c", program]),
        machine_host.START_S: "0.5",
    }
    t0 = time.time()
    ran = shim("docker", ["run", "--rm", "--name", "t", IMAGE], env)
    assert ran.returncode == 0 and float(ran.stdout) - t0 >= 0.5
    slow = {**env, machine_host.START_S: "30"}
    run = subprocess.Popen(
        [sys.executable, "-m", "localcloud.machines.machine_host", "docker", "run", "--rm", "--name", "t", IMAGE],
        env={"PYTHONPATH": FUNCTIONS, **slow},
    )
    try:
        deadline = time.monotonic() + 20
        while machine_host.container_pid(tmp_path, "t") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shim("docker", ["stop", "-t", "5", "t"], slow).returncode == 0  # the container exists meanwhile
        assert run.wait(timeout=10) == 143
    finally:
        run.kill()
        run.wait()


def test_apt_get_installs_docker_onto_the_vms_path_in_the_install_time(tmp_path: Path) -> None:
    bin_dir = machine_host.install(tmp_path / "bin")
    env = {machine_host.BIN_DIR: str(bin_dir), machine_host.VM_BIN: str(tmp_path / "vm"), machine_host.INSTALL_S: "0.3"}
    assert shim("apt-get", ["-q", "update"], env).returncode == 0
    assert not (tmp_path / "vm" / "docker").exists()
    installed = shim("apt-get", ["-q", "-y", "install", "docker.io"], env)
    assert installed.returncode == 0 and (tmp_path / "vm" / "docker").exists()
    ((name, start, end),) = steps(installed.stderr)
    assert name == "install" and end - start >= 0.3
    assert not (bin_dir / "docker").exists() and (bin_dir / "tools" / "bash").exists()


def boot(
    home: Path, bin_dir: Path, metadata: MetadataServer, logging: CloudLogging, docker: bool
) -> subprocess.CompletedProcess[str]:
    """One boot of a local VM whose disk is `home`: its startup script, with or without Docker on its image."""
    path = f"{home / 'bin'}:{bin_dir}:{bin_dir / 'tools'}"
    if docker:
        path = f"{machine_host.docker_package(bin_dir)}:{path}"
    env = {
        "PATH": path,
        "HOME": str(home),
        "GCE_METADATA_HOST": metadata.host,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": logging.endpoint,
        NOTICE_ENV: str(home / "notice"),
        IMAGE_MARK_ENV: str(home / "var-lib-respawn" / "trainer-image"),
        DATA_DIR_ENV: str(home / "var-lib-respawn" / "data"),
        machine_host.DOCKER_DIR: str(home / "docker"),
        machine_host.IMAGE_CMD: json.dumps([sys.executable, "-c", "print('trained')"]),
        machine_host.BIN_DIR: str(bin_dir),
        machine_host.VM_BIN: str(home / "bin"),
        machine_host.INSTALL_S: "0.1",
        machine_host.PULL_S: "0.1",
    }
    script = home.parent / "startup-script.sh"
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_a_local_vm_without_docker_installs_it_pulls_once_and_reuses_the_image_at_its_next_boot(tmp_path: Path) -> None:
    spec = JobSpec(
        job_id="job-1",
        machine=TpuMachine("v6e-8", api="compute"),
        zones=("us-central1-a",),
        image=IMAGE,
        checkpoint_uri="gs://bucket/runs/job-1",
        args=(),
    )
    (tmp_path / "startup-script.sh").write_text(startup_script(spec, 1))
    bin_dir = machine_host.install(tmp_path / "shims")
    metadata = MetadataServer("p", {})
    said: list[str] = []
    logging = CloudLogging(lambda log, payload: said.append(payload["event"]))
    home = tmp_path / "w-0"
    home.mkdir()
    try:
        first = boot(home, bin_dir, metadata, logging, docker=False)
        after_first = list(said)
        second = boot(home, bin_dir, metadata, logging, docker=False)  # the same disk: Docker and the image are there
    finally:
        metadata.close()
        logging.close()
    assert first.returncode == 0, first.stderr
    assert [name for name, _, _ in steps(first.stderr)] == ["install", "pull"]
    assert second.returncode == 0, second.stderr
    assert steps(second.stderr) == []  # nothing installed, nothing pulled
    assert "not pulled again" in second.stderr
    assert after_first == ["completed"] and said == ["completed", "completed"]  # the exit code's, once a boot
