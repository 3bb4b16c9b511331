"""The machine's scripts (respawn/adapters/*.sh) as shellcheck reads them, and as they ship.

shellcheck is Debian's package (`make setup` installs it); without it these tests skip, and fail under
RESPAWN_REQUIRE_EMULATORS=1 (CI). Each source file is checked alone (less the checks that need the whole script: the
values and common.sh it reads), and then the scripts as a machine gets them, rendered for jobs that together take
every branch of the rendering: GPU and TPU, a slice, secrets, an Artifact Registry image, a digest, a longer notice.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from test_startup import SECRETS, SLICE, spec

from respawn.adapters.startup import shutdown_script, startup_script

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "functions" / "respawn" / "adapters"
SOURCES = sorted(SCRIPTS.glob("*.sh"))
# Needing the whole script: "referenced but not assigned" and "appears unused" (the values and common.sh's variables)
ALONE_EXCLUDES = "SC2154,SC2034"


def shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    problem = "shellcheck is not installed: `make setup` installs Debian's package (apt-get install shellcheck)"
    if os.environ.get("RESPAWN_REQUIRE_EMULATORS") == "1" or os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


def check(path: Path, *options: str) -> None:
    done = subprocess.run([shellcheck(), "--format=gcc", *options, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


HOSTILE_ARGS = ("it's $(not) a `command`", "a,b")  # the values are data: shellcheck must not read them as shell
JOBS = {
    "gpu": spec("gpu", image="nvcr.io/nvidia/jax:24.04", preemption_notice_s=60, secrets=SECRETS, args=HOSTILE_ARGS),
    "tpu-slice": spec(tpu=SLICE, args=HOSTILE_ARGS),  # an Artifact Registry image: docker logs in
    "tpu-digest": spec("compute", tpu="v6e-8", image="us-docker.pkg.dev/p/r/t@sha256:" + "a" * 64),
}


def test_every_script_is_package_data() -> None:
    """The functions ship the scripts they render (pyproject's package-data), so a new one must be listed."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["respawn"]
    root = REPO / "functions" / "respawn"
    assert SOURCES
    assert [p.name for p in SOURCES if not any(fnmatch.fnmatch(str(p.relative_to(root)), g) for g in patterns)] == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_each_script_file_passes_shellcheck(source: Path) -> None:
    check(source, f"--exclude={ALONE_EXCLUDES}")


@pytest.mark.parametrize("name", sorted(JOBS))
def test_the_rendered_scripts_pass_shellcheck(tmp_path: Path, name: str) -> None:
    for script, text in [
        ("startup", startup_script(JOBS[name], 3, 5400)),
        ("shutdown", shutdown_script(JOBS[name], 3)),
    ]:
        path = tmp_path / f"{name}-{script}.sh"
        path.write_text(text)
        check(path)
