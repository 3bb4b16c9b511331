"""The trainer image and library pin a JAX that finds the hosts of a Compute Engine TPU slice, and one the project
itself installs and tests with."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from tfconfig import REPO

# JAX's changelog, 0.10.0 (April 16, 2026): "Fixed a bug where calling `jax.distributed.initialize()` on a GCE TPU
# Managed Instance Group raised an `IndexError` (#36593)" - the slice's worker-network-endpoints metadata is host
# names there, which older releases could not parse (jax/_src/clusters/cloud_tpu_cluster.py).
MIG_FIX = (0, 10, 0)


def version(text: str) -> tuple[int, ...]:
    """`0.10.2` -> (0, 10, 2); a pre-release or local suffix (`0.10.2rc1`, `0.10.2+cuda`) is cut off."""
    found = re.match(r"\d+(\.\d+)*", text)
    assert found, text
    return tuple(int(part) for part in found[0].split("."))


def dockerfile_jax(path: str) -> tuple[int, ...]:
    found = re.search(r"^ARG JAX_VERSION=(\S+)$", (REPO / path).read_text(encoding="utf-8"), re.M)
    assert found, path
    return version(found[1])


def test_the_trainer_image_pins_a_jax_that_reads_slice_metadata() -> None:
    assert dockerfile_jax("trainer/Dockerfile") >= MIG_FIX
    assert dockerfile_jax("examples/byo/Dockerfile") >= MIG_FIX  # the bring-your-own example builds the same way


def test_the_trainer_library_requires_that_jax() -> None:
    project = tomllib.loads((REPO / "trainer" / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (jax,) = [d for d in project["dependencies"] if re.match(r"jax\b(?!-)", d)]
    floor = re.fullmatch(r"jax>=(\S+)", jax)
    assert floor, jax
    assert version(floor[1]) >= MIG_FIX


def test_the_pinned_jax_is_the_one_the_project_installs_and_tests() -> None:
    """A pin the project cannot install would be untested: the image's JAX is the environment's."""
    installed = version(metadata.version("jax"))
    assert installed >= MIG_FIX
    assert dockerfile_jax("trainer/Dockerfile") == installed


def test_version_reads_release_numbers_only() -> None:
    assert version("0.10.2") == (0, 10, 2) > (0, 9, 9) and version("0.10.2rc1") == (0, 10, 2)
    assert version("0.4.35") < MIG_FIX


def test_every_pin_of_the_image_is_the_version_the_tests_run() -> None:
    """The image installs trainer/requirements.txt: each pin (Grain and ArrayRecord for --data among them) is the
    version installed here, so the image runs what the trainer's tests ran."""
    text = (REPO / "trainer" / "requirements.txt").read_text(encoding="utf-8")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", text, re.M))
    assert {"grain", "array-record", "orbax-checkpoint"} <= set(pins)
    assert {name: metadata.version(name) for name in pins} == pins


def test_the_local_cloud_runs_respawns_image_as_the_user_its_dockerfile_makes() -> None:
    """trainer/Dockerfile: `useradd --uid N ... trainer` and `USER trainer`; the local docker runs its trainer as N."""
    from localcloud.machines.vms import TRAINER_USER

    text = (REPO / "trainer" / "Dockerfile").read_text()
    (uid,) = re.findall(r"useradd [^\n]*--uid (\d+)[^\n]* trainer\b", text)
    assert re.search(r"^USER trainer$", text, re.M)
    assert f"{uid}:{uid}" == TRAINER_USER


def dockerfile_install(variant: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """trainer/Dockerfile's install step run by bash as `docker build --build-arg VARIANT=variant` runs it, with
    `pip` and `useradd` stood in for by scripts that print their arguments: the shell as written, not a copy."""
    text = (REPO / "trainer" / "Dockerfile").read_text(encoding="utf-8")
    (run,) = [r for r in re.findall(r"^RUN ((?:.*\\\n)*.*)$", text, re.M) if "pip install --requirement" in r]
    for tool in ("pip", "useradd"):
        stub = tmp_path / tool
        stub.write_text(f'#!/bin/sh\necho {tool} "$@"\n')
        stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "VARIANT": variant, "JAX_VERSION": dockerfile_arg("JAX_VERSION")}
    return subprocess.run(["/bin/sh", "-c", run], env=env, capture_output=True, text=True, timeout=30)


def dockerfile_arg(name: str) -> str:
    found = re.search(rf"^ARG {name}=(\S+)$", (REPO / "trainer" / "Dockerfile").read_text(encoding="utf-8"), re.M)
    assert found, name
    return found[1]


@pytest.mark.parametrize(("variant", "extra"), [("cuda", "cuda12"), ("tpu", "tpu"), ("cpu", "cpu")])
def test_each_variant_installs_a_jax_extra_the_tested_jax_has(variant: str, extra: str, tmp_path: Path) -> None:
    """`docker build --build-arg VARIANT=cuda trainer/` is valid as written: its install step installs
    jax[cuda12] (JAX's CUDA 12 wheels from PyPI, as JAX's installation guide says) at the JAX the tests run, and
    that JAX release declares the extra."""
    done = dockerfile_install(variant, tmp_path)
    assert done.returncode == 0, done.stderr
    pip = next(line for line in done.stdout.splitlines() if line.startswith("pip install"))
    assert f"jax[{extra}]=={metadata.version('jax')}" in pip.split()
    assert "--requirement" in pip.split() and "/app/requirements.txt" in pip.split()
    assert extra in (metadata.metadata("jax").get_all("Provides-Extra") or [])


def test_an_unknown_variant_fails_the_build_and_says_which_are_allowed(tmp_path: Path) -> None:
    done = dockerfile_install("rocm", tmp_path)
    assert done.returncode == 1 and "pip install" not in done.stdout
    assert "VARIANT must be cpu, tpu or cuda, got 'rocm'" in done.stderr
    assert dockerfile_arg("VARIANT") == "cpu"  # a plain `docker build trainer/` is the CPU image


def test_the_local_cloud_runs_trainers_in_the_environment_its_dockerfile_sets() -> None:
    """What every local trainer starts from (IMAGE_ENV) is what trainer/Dockerfile's ENV sets."""
    from localcloud.machines.slices import IMAGE_ENV

    (block,) = re.findall(r"^ENV ((?:[^\n]*\\\n)*[^\n]*)$", (REPO / "trainer" / "Dockerfile").read_text(), re.M)
    dockerfile_env = dict(re.findall(r"(\w+)=(\S+?)(?:\s*\\)?$", block, re.M))
    assert IMAGE_ENV and IMAGE_ENV.items() <= dockerfile_env.items(), dockerfile_env
