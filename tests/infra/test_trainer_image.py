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


def dockerfile_install(
    variant: str, tmp_path: Path, dockerfile: str = "trainer/Dockerfile"
) -> subprocess.CompletedProcess[str]:
    """A Dockerfile's install step (trainer/Dockerfile's by default) run by sh as `docker build --build-arg
    VARIANT=variant` runs it, with `pip` and `useradd` stood in for by scripts that print their arguments: the shell
    as written, not a copy."""
    text = (REPO / dockerfile).read_text(encoding="utf-8")
    (run,) = [r for r in re.findall(r"^RUN ((?:.*\\\n)*.*)$", text, re.M) if re.search(r"pip install .*jax\[", r)]
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


# What jax[cuda12] installs for CUDA: jax 0.10.2's extra `cuda12` is jax-cuda12-plugin[with-cuda]==0.10.2, whose
# Requires-Dist for `with-cuda` (sys_platform == "linux") are these, lower bounds only. Read from PyPI's metadata of
# jax-cuda12-plugin 0.10.2 (https://pypi.org/project/jax-cuda12-plugin/0.10.2/, with `pip install --dry-run --report`).
PLUGIN_JAX = "0.10.2"
PLUGIN_CUDA_REQUIREMENTS = (
    "nvidia-cublas-cu12>=12.1.3.1",
    "nvidia-cuda-cupti-cu12>=12.1.105",
    "nvidia-cuda-nvcc-cu12>=12.6.85",
    "nvidia-cuda-runtime-cu12>=12.1.105",
    "nvidia-cudnn-cu12<10.0,>=9.8",
    "nvidia-cufft-cu12>=11.0.2.54",
    "nvidia-cusolver-cu12>=11.4.5.107",
    "nvidia-cusparse-cu12>=12.1.0.106",
    "nvidia-nccl-cu12>=2.18.1",
    "nvidia-nvjitlink-cu12>=12.1.105",
    "nvidia-cuda-nvrtc-cu12>=12.1.55",
    "nvidia-nvshmem-cu12>=3.2.5",
)
# The wheels versioned as the CUDA toolkit is (12.8.x): ptxas (nvcc) and nvJitLink compile PTX, which the driver must
# be as new as; the others go with them
TOOLKIT_WHEELS = (
    "nvidia-cublas-cu12",
    "nvidia-cuda-cupti-cu12",
    "nvidia-cuda-nvcc-cu12",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-runtime-cu12",
    "nvidia-nvjitlink-cu12",
)


def cuda_pins() -> dict[str, str]:
    text = (REPO / "trainer" / "cuda-constraints.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines) and all(re.fullmatch(r"[a-z0-9-]+", n) for n in pins), lines
    return pins


def driver_cuda() -> tuple[int, int]:
    """The CUDA version of the GPU VMs' driver, from the boot image family's name (common-cu128-...: 12.8)."""
    from respawn.adapters.compute import DLVM_IMAGE

    found = re.search(r"/family/common-cu(\d\d)(\d)-", DLVM_IMAGE)
    assert found, DLVM_IMAGE
    return int(found[1]), int(found[2])


def test_the_cuda_wheels_are_pinned_to_the_cuda_of_the_gpu_vms_driver() -> None:
    """Each CUDA wheel jax[cuda12] installs is pinned, within the plugin's bounds; the toolkit's at the driver's CUDA
    (12.8, the boot image's), not the newest on PyPI (12.9 and up): a PTX compiler newer than the driver makes XLA
    disable parallel compilation."""
    from packaging.requirements import Requirement

    assert dockerfile_arg("JAX_VERSION") == PLUGIN_JAX, "a new JAX: read its plugin's CUDA requirements again"
    wanted = {r.name: r.specifier for r in map(Requirement, PLUGIN_CUDA_REQUIREMENTS)}
    pins = cuda_pins()
    assert sorted(pins) == sorted(wanted)
    assert {name: version for name, version in pins.items() if version not in wanted[name]} == {}
    major, minor = driver_cuda()
    assert (major, minor) == (12, 8)
    assert {name: pins[name] for name in TOOLKIT_WHEELS if version(pins[name])[:2] != (major, minor)} == {}


@pytest.mark.parametrize(
    ("dockerfile", "variant", "constraints"),
    [
        ("trainer/Dockerfile", "cuda", "/app/cuda-constraints.txt"),
        ("trainer/Dockerfile", "tpu", None),
        ("trainer/Dockerfile", "cpu", None),
        ("examples/byo/Dockerfile", "cuda12", "/src/cuda-constraints.txt"),
        ("examples/byo/Dockerfile", "tpu", None),
    ],
)
def test_the_cuda_variant_installs_with_those_pins(
    dockerfile: str, variant: str, constraints: str | None, tmp_path: Path
) -> None:
    """`docker build --build-arg VARIANT=cuda trainer/` (and the bring-your-own example's cuda12) passes the pins to
    pip as constraints, from a file the build copies in; the other variants install no CUDA and take none."""
    done = dockerfile_install(variant, tmp_path, dockerfile)
    assert done.returncode == 0, done.stderr
    pip = next(line for line in done.stdout.splitlines() if line.startswith("pip install")).split()
    given = [pip[i + 1] for i, arg in enumerate(pip) if arg == "--constraint"]
    assert given == ([constraints] if constraints else [])
    if constraints:  # copied there before the install step
        copies = re.findall(r"^COPY (.+)$", (REPO / dockerfile).read_text(encoding="utf-8"), re.M)
        dests = [c.split()[-1] for c in copies if any(s.endswith("cuda-constraints.txt") for s in c.split()[:-1])]
        assert constraints in [d + "cuda-constraints.txt" if d.endswith("/") else d for d in dests], copies
