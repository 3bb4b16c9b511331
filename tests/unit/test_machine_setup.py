"""What the startup script readies before the trainer: Docker and the NVIDIA Container Toolkit from apt, the NVIDIA
driver, and the data directory on the machine's own disk. Run for real by bash, as tests/unit/test_startup.py runs it,
with fake `apt-get`, `gpg`, `systemctl` and NVIDIA repository first on PATH, and the script's system paths (apt's
sources, the keyrings) moved under the test's directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_startup import BASH, calls, docker_run, no_sleep, said, spec
from test_startup import fakes as fakes  # the fixture: fake docker, curl (metadata server, APIs), nvidia-*

from respawn.adapters import startup
from respawn.adapters.startup import startup_script
from respawn.jobs import JobSpec

LOCKED = "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1432 (unattended-upgr)"
# apt-get as a boot image has it: each call recorded; the first FAKE_APT_LOCKED calls find the lock held (after
# their DPkg::Lock::Timeout, which they must ask for), every `install` fails with FAKE_APT_ERROR where it is set, and
# an install that succeeds puts the packages' commands on the machine: docker (the fake one), nvidia-ctk.
FAKE_APT = """#!{python} -S
import json, os, pathlib, shutil, sys
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(["apt-get", *sys.argv[1:]]) + "\\n")
count = pathlib.Path(log + ".apt")
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
print("Reading package lists...")
if n <= int(os.environ.get("FAKE_APT_LOCKED", "0")):
    sys.exit({locked!r})
if "install" in sys.argv and os.environ.get("FAKE_APT_ERROR"):
    print("Building dependency tree...")
    sys.exit(os.environ["FAKE_APT_ERROR"])
if "install" in sys.argv:
    bin_dir = pathlib.Path(os.environ["FAKE_BIN"])
    for package, command in (("docker.io", "docker"), ("nvidia-container-toolkit", "nvidia-ctk")):
        if package in sys.argv:
            shutil.copy(bin_dir.parent / "packages" / command, bin_dir / command)
"""
FAKE_GPG = """#!/bin/sh
printf '["gpg", "%s"]\\n' "$*" >> "$FAKE_LOG"
while [ "$#" -gt 0 ]; do [ "$1" = -o ] && { cat > "$2"; exit 0; }; shift; done
exit 2
"""
FAKE_SYSTEMCTL = """#!/bin/sh
printf '["systemctl", "%s"]\\n' "$*" >> "$FAKE_LOG"
"""
# curl: NVIDIA's repository (its key and its list, as nvidia.github.io serves them; FAKE_NVIDIA_DOWN: unreachable),
# anything else to the fake metadata server and APIs of test_startup.py
FAKE_CURL = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    https://nvidia.github.io/*)
      printf '["curl", "GET", "%s", null, null]\\n' "$a" >> "$FAKE_LOG"
      [ -z "${{FAKE_NVIDIA_DOWN-}}" ] || exit 6
      case "$a" in
        */gpgkey) echo "-----BEGIN PGP PUBLIC KEY BLOCK-----" ;;
        *.list) echo 'deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /' ;;
        *) exit 22 ;;
      esac
      exit 0 ;;
  esac
done
exec {curl} "$@"
"""


@pytest.fixture
def machine(tmp_path: Path, fakes: dict[str, str]) -> dict[str, str]:
    """A GPU image without the NVIDIA Container Toolkit (and, with `without("docker")`, a boot image without Docker):
    `apt-get install` puts what it installs on PATH."""
    tools = tmp_path / "apt-bin"
    tools.mkdir()
    fakes_bin = Path(fakes["PATH"].split(":")[0])
    packages = tmp_path / "packages"
    packages.mkdir()
    for command in ("docker", "nvidia-ctk"):
        shutil.copy(fakes_bin / command, packages / command)
    (fakes_bin / "nvidia-ctk").unlink()
    for name, text in (
        ("apt-get", FAKE_APT.format(python=sys.executable, locked=LOCKED)),
        ("gpg", FAKE_GPG),
        ("systemctl", FAKE_SYSTEMCTL),
        ("curl", FAKE_CURL.format(curl=fakes_bin / "curl")),
    ):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    (tmp_path / "etc-apt").mkdir()
    (tmp_path / "keyrings").mkdir()
    env = {**fakes, "PATH": f"{tools}:{fakes['PATH']}", "FAKE_BIN": str(fakes_bin)}
    no_sleep(env)  # the pauses between tries
    return env


def without(env: dict[str, str], command: str) -> None:
    (Path(env["FAKE_BIN"]) / command).unlink()


def run_on(tmp_path: Path, env: dict[str, str], s: JobSpec, **extra: str) -> subprocess.CompletedProcess[str]:
    """The startup script as rendered for `s`, with apt's sources and the keyrings under tmp_path."""
    text = startup_script(s, 3)
    for system, here in (("/etc/apt/sources.list.d", "etc-apt"), ("/usr/share/keyrings", "keyrings")):
        assert system in text
        text = text.replace(system, str(tmp_path / here))
    script = tmp_path / "startup.sh"
    script.write_text(text)
    return subprocess.run(
        [BASH, str(script)], cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=60
    )


def apt_calls(env: dict[str, str]) -> list[list[str]]:
    return [c for c in calls(env) if c[0] == "apt-get"]


def failed(env: dict[str, str]) -> dict[str, Any]:
    ((payload, severity),) = said(env)
    assert payload["event"] == "failed" and severity == "ERROR", payload
    return payload


def test_the_nvidia_toolkit_install_waits_for_apts_lock_and_tries_again(
    tmp_path: Path, machine: dict[str, str]
) -> None:
    """At first boot unattended-upgrades holds apt's lock: each apt-get waits for it (DPkg::Lock::Timeout), and an
    update that still finds it held is tried again; then the toolkit installs, docker is configured for GPUs, and
    the trainer runs."""
    result = run_on(tmp_path, machine, spec("gpu"), FAKE_APT_LOCKED="2")

    assert result.returncode == 0, result.stderr
    apt = apt_calls(machine)
    assert [c[-1] for c in apt] == ["update", "update", "update", "nvidia-container-toolkit"], apt
    assert all("DPkg::Lock::Timeout=120" in c for c in apt), apt
    assert LOCKED in result.stderr and "failed (try 2): " + LOCKED in result.stderr  # apt's own lines, and the cause
    listed = (tmp_path / "etc-apt" / "nvidia-container-toolkit.list").read_text()
    assert listed.startswith(f"deb [signed-by={tmp_path / 'keyrings'}/nvidia-container-toolkit-keyring.gpg] https://")
    assert ["nvidia-ctk", "runtime", "configure", "--runtime=docker"] in calls(machine)
    assert ["systemctl", "restart docker"] in calls(machine)
    assert docker_run(machine)[-2:] == [spec("gpu").image, "--steps=10"]  # the trainer ran
    assert not [p for p, _ in said(machine) if p["event"] == "failed"]


@pytest.mark.parametrize(
    ("kind", "package", "why"),
    [
        ("gpu", "nvidia-container-toolkit", "could not install the NVIDIA Container Toolkit"),
        ("compute", "docker.io", "could not install docker"),  # a Compute Engine TPU image has no Docker
    ],
)
def test_an_apt_install_that_keeps_failing_fails_the_attempt_with_its_cause(
    tmp_path: Path, machine: dict[str, str], kind: str, package: str, why: str
) -> None:
    if kind == "compute":
        without(machine, "docker")
    error = f"E: Unable to locate package {package}"
    result = run_on(tmp_path, machine, spec(kind), FAKE_APT_ERROR=error)

    assert result.returncode == 1
    installs = [c for c in apt_calls(machine) if "install" in c]
    assert len(installs) == 4 and all("DPkg::Lock::Timeout=120" in c for c in installs)
    assert failed(machine)["error"] == f"{why}: apt-get install {package} failed 4 times ({error})"
    assert not [c for c in calls(machine) if c[:2] == ["docker", "run"]]  # no trainer


def test_a_lock_held_through_every_try_names_the_lock(tmp_path: Path, machine: dict[str, str]) -> None:
    result = run_on(tmp_path, machine, spec("gpu"), FAKE_APT_LOCKED="9")

    assert result.returncode == 1
    assert len(apt_calls(machine)) == 4  # four updates, each waiting for the lock
    why = "could not install the NVIDIA Container Toolkit"
    assert failed(machine)["error"] == f"{why}: apt-get install nvidia-container-toolkit failed 4 times ({LOCKED})"


def test_an_unreachable_nvidia_repository_fails_the_attempt_naming_it(tmp_path: Path, machine: dict[str, str]) -> None:
    result = run_on(tmp_path, machine, spec("gpu"), FAKE_NVIDIA_DOWN="1")

    assert result.returncode == 1
    assert apt_calls(machine) == []
    assert failed(machine)["error"] == (
        "could not install the NVIDIA Container Toolkit: https://nvidia.github.io/libnvidia-container unreachable"
        " (4 tries)"
    )


def test_a_driver_that_never_comes_up_fails_the_attempt_with_nvidia_smis_words(
    tmp_path: Path, machine: dict[str, str]
) -> None:
    smi = Path(machine["FAKE_BIN"]) / "nvidia-smi"
    words = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    smi.write_text(f'#!/bin/sh\necho "{words}"\nexit 9\n')
    result = run_on(tmp_path, machine, spec("gpu"))

    assert result.returncode == 1
    assert failed(machine)["error"] == f"the NVIDIA driver did not come up in 10 minutes (nvidia-smi: {words})"
    assert not [c for c in calls(machine) if c[:2] == ["docker", "run"]]


def test_the_data_directory_is_on_the_machines_disk_mounted_and_named_to_the_trainer(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    """The trainer's copies of a dataset go to a directory of the machine (kept for its later attempts), writable
    to the container's user whatever its uid, not into the container's writable layer."""
    result = subprocess.run(
        [BASH, "-c", startup_script(spec("compute", tpu="v6e-8"), 3)],
        cwd=tmp_path,
        env=fakes,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    data_dir = Path(fakes[startup.DATA_DIR_ENV])
    assert data_dir.is_dir() and stat.S_IMODE(data_dir.stat().st_mode) == 0o1777
    argv = docker_run(fakes)
    mount = argv.index(f"{startup.DATA_DIR}:{startup.DATA_DIR}")
    assert argv[mount - 1] == "-v" and startup.DATA_DIR.startswith("/var/lib/")  # the VM's disk, not /tmp or /run
    assert argv[argv.index(startup.DATA_DIR_ENV) - 1] == "-e"
    passed = json.loads(Path(fakes["FAKE_LOG"] + ".env").read_text())
    assert passed[startup.DATA_DIR_ENV] == str(data_dir)
    assert os.path.isabs(startup.DATA_DIR)
