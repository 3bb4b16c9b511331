"""The trainer image and library pin a JAX that finds the hosts of a Compute Engine TPU slice, and one the project
itself installs and tests with."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

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
