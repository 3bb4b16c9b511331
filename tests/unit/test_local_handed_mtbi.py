"""The machine side of the handed MTBI: metadata `respawn-mtbi-s` becomes the trainer's RESPAWN_MTBI_S, unless the
job's env sets it; the local machines' metadata server serves it as Google's does."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from respawn.adapters import startup
from respawn.adapters.startup import docker_run_argv, machine_metadata, startup_script
from respawn.local.machine_host import MetadataServer
from respawn.machine import MTBI_ENV, MTBI_METADATA, mtbi_metadata, takes_handed_mtbi
from respawn.model import GpuMachine, JobSpec

BASH = shutil.which("bash") or "/bin/bash"


def spec(env: tuple[tuple[str, str], ...] = ()) -> JobSpec:
    return JobSpec(job_id="job-1", machine=GpuMachine("g2-standard-8", "nvidia-l4", 1), zones=("us-central1-a",),
                   image="trainer:1", checkpoint_uri="gs://b/job-1", env=env)  # fmt: skip


def test_the_metadata_item_is_whole_seconds_and_absent_without_a_figure() -> None:
    assert mtbi_metadata(5400.4) == {MTBI_METADATA: "5400"}
    assert mtbi_metadata(0.2) == {MTBI_METADATA: "1"}
    assert mtbi_metadata(None) == {}
    with pytest.raises(ValueError, match="mtbi_s: -1 is not a positive number"):
        mtbi_metadata(-1)


def test_the_container_takes_the_handed_figure_unless_the_jobs_env_sets_it() -> None:
    handed, own = spec(), spec(env=((MTBI_ENV, "900"),))
    assert takes_handed_mtbi(handed.env) and not takes_handed_mtbi(own.env)
    argv = docker_run_argv(handed, 1, mtbi_s=5400.0)
    assert argv[argv.index(MTBI_ENV) - 1] == "-e"  # passed by name: set only when the script exported it
    own_argv = docker_run_argv(own, 1, mtbi_s=5400.0)
    assert f"{MTBI_ENV}=900" in own_argv and MTBI_ENV not in own_argv
    assert MTBI_ENV not in docker_run_argv(handed, 1)  # nothing handed: the trainer's default
    meta = machine_metadata(handed, 1, mtbi_s=5400.0)
    assert meta[MTBI_METADATA] == "5400" and f"md attributes/{MTBI_METADATA}" in meta["startup-script"]
    assert MTBI_METADATA not in startup_script(own, 1, 5400.0) and MTBI_METADATA not in startup_script(handed, 1)
    assert MTBI_METADATA not in machine_metadata(handed, 1)


@pytest.mark.parametrize(("served", "exported"), [("5400", "5400"), ("812.5", "812.5"), (None, "unset"),
                                                   ("soon; touch x", "unset"), ("", "unset")])  # fmt: skip
def test_the_script_exports_what_the_metadata_server_hands(served: str | None, exported: str) -> None:
    """The script's own lines, run by bash against the local machines' metadata server."""
    server = MetadataServer("proj", {} if served is None else {MTBI_METADATA: served})
    try:
        script = startup._METADATA + startup._MTBI.format(key=MTBI_METADATA, env=MTBI_ENV)
        script += f'echo "${{{MTBI_ENV}-unset}}"\n'
        out = subprocess.run([BASH, "-c", script], env={"GCE_METADATA_HOST": server.host, "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        server.close()
    assert out.stdout.strip() == exported, out.stderr
