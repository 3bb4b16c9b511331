"""The handed MTBI on a local machine: the metadata server serves `respawn-mtbi-s` as Google's does, the real startup
script runs the trainer with RESPAWN_MTBI_S, and the trainer's Young/Daly interval reads it."""

from __future__ import annotations

import itertools
import urllib.request

from localcloud.machines.machine_host import MetadataServer, container_env
from respawn.adapters.startup import MTBI_ENV, MTBI_METADATA, docker_run_argv, machine_metadata
from respawn.jobs import GpuMachine, JobSpec
from respawn_trainer.env import load_env

SPEC = JobSpec(job_id="job-1", machine=GpuMachine("g2-standard-8", "nvidia-l4", 1), zones=("us-central1-a",),
               image="trainer:1", checkpoint_uri="gs://bucket/job-1")  # fmt: skip


def env_options(argv: list[str]) -> list[tuple[str, str]]:
    """The `-e` options of a docker command line, as the local docker shim reads them."""
    return [(flag, value) for flag, value in itertools.pairwise(argv) if flag == "-e"]


def test_a_local_machine_serves_the_handed_mtbi_and_its_trainer_reads_it() -> None:
    meta = machine_metadata(SPEC, 2, mtbi_s=5400.4)
    server = MetadataServer("proj", meta)
    try:
        url = f"http://{server.host}/computeMetadata/v1/instance/attributes/{MTBI_METADATA}"
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})) as answer:
            assert answer.read().decode() == "5400"
    finally:
        server.close()
    argv = docker_run_argv(SPEC, 2, mtbi_s=5400.4)
    env = container_env(env_options(argv), {})
    assert env[MTBI_ENV] == "5400" and f"{MTBI_ENV}=5400" in meta["startup-script"]
    assert load_env(env).mtbi_s == 5400.0  # the trainer's checkpoint interval follows the zone


def test_without_a_figure_the_trainer_keeps_its_default() -> None:
    argv = docker_run_argv(SPEC, 1)
    assert MTBI_METADATA not in machine_metadata(SPEC, 1) and not any(a.startswith(MTBI_ENV) for a in argv)
    assert load_env(container_env(env_options(argv), {})).mtbi_s == 3600.0
