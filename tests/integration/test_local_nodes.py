"""The local cloud's machines: a trainer killed without a word gets the `failed` entry the startup script writes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import bucket_dir

from localcloud.apis.cloudapi import CloudMachine
from localcloud.machines.nodes import Nodes
from localcloud.timeline import Timeline
from respawn import parsing
from respawn.adapters.startup import machine_metadata
from respawn.events import TrainerFailed
from respawn.jobs import GpuMachine, JobSpec
from respawn.machine import GRACE_S

pytestmark = pytest.mark.waits

REPO = Path(__file__).resolve().parents[2]


def machine(tmp_path: Path, **changes: Any) -> CloudMachine:
    """A READY GPU VM of job crashy, attempt 2, whose metadata is what respawn gives a real one."""
    spec = JobSpec(
        job_id="crashy",
        machine=GpuMachine("g2-standard-8", "nvidia-l4", 1),
        zones=("us-central1-a",),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri=bucket_dir(tmp_path / "ckpt"),
        args=("--model=none", "--steps=100000", "--step-time=0.05", "--log-every=1"),
        **changes,
    )
    metadata = machine_metadata(spec, 2)
    return CloudMachine(
        "gpu",
        "crashy-a2",
        "us-central1-a",
        "p",
        {},
        metadata,
        "RUNNING",
        time.time(),
        api="compute",
        workers=("crashy-a2",),
        chips_per_host=1,
    )


def nodes(
    tmp_path: Path, routed: list[dict[str, Any]], got: threading.Event, secrets: dict[str, str] | None = None
) -> Nodes:
    def route(entry: dict[str, Any]) -> None:
        routed.append(entry)
        got.set()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return Nodes(
        project="p",
        base_env=env,
        log_dir=tmp_path,
        grace_s=5,
        route=route,
        mark_preempted=lambda name, worker: name,
        timeline=Timeline(),
        secrets=secrets,
    )


def wait_for(routed: list[dict[str, Any]], got: threading.Event, event: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got.wait(timeout=0.5)
        got.clear()
        found = [e for e in routed if e["jsonPayload"].get("event") == event]
        if found:
            return found[-1]
    raise TimeoutError(f"no {event} entry in {[e['jsonPayload'].get('event') for e in routed]}")


@contextlib.contextmanager
def a_started_trainer(tmp_path: Path) -> Iterator[tuple[Nodes, list[dict[str, Any]], threading.Event]]:
    """Nodes with one READY machine whose trainer has logged `started`; stopped on the way out."""
    routed: list[dict[str, Any]] = []
    got = threading.Event()
    n = nodes(tmp_path, routed, got)
    try:
        n.on_ready(machine(tmp_path))
        wait_for(routed, got, "started")
        yield n, routed, got
    finally:
        n.stop()


def test_a_trainer_killed_without_a_word_is_reported_failed(tmp_path: Path) -> None:
    with a_started_trainer(tmp_path) as (n, routed, got):
        (pid,) = n.pids("crashy-a2")
        assert psutil.Process(pid).environ()["RESPAWN_GRACE_S"] == str(GRACE_S["gpu"])  # a GPU VM's, as in the cloud
        os.killpg(pid, signal.SIGKILL)  # an OOM kill: the trainer says nothing
        entry = wait_for(routed, got, "failed")
    event = parsing.log_entry_event(entry)
    assert isinstance(event, TrainerFailed) and (event.job_id, event.attempt) == ("crashy", 2)
    assert event.error == "the trainer exited with code 137"  # docker's code for a container killed by SIGKILL
    assert entry["jsonPayload"]["source"] == "exit-code" and entry["jsonPayload"]["worker"] == 0
    # the machine ran the real startup script, kept in its run directory; its output is the machine's log
    assert (tmp_path / "crashy-a2" / "startup-script.sh").read_text() == machine(tmp_path).metadata["startup-script"]
    assert "respawn-startup: trainer exited with code 137" in (tmp_path / "crashy-a2.log").read_text()


def test_a_deleted_machine_is_no_failure(tmp_path: Path) -> None:
    with a_started_trainer(tmp_path) as (n, routed, _):
        n.on_deleted("crashy-a2")
        deadline = time.monotonic() + 30
        while n.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the reaper has run
    assert not n.alive()
    assert "failed" not in [e["jsonPayload"].get("event") for e in routed]


REF = "projects/respawn-local/secrets/hf-token/versions/1"


def test_a_secret_without_a_value_is_the_attempts_failure_and_no_trainer_starts(tmp_path: Path) -> None:
    routed: list[dict[str, Any]] = []
    got = threading.Event()
    n = nodes(tmp_path, routed, got)
    try:
        n.on_ready(machine(tmp_path, secrets=(("HF_TOKEN", REF),)))
        entry = wait_for(routed, got, "failed")
        assert n.pids("crashy-a2") == []
    finally:
        n.stop()
    event = parsing.log_entry_event(entry)
    assert isinstance(event, TrainerFailed) and (event.job_id, event.attempt) == ("crashy", 2)
    assert event.error == f"could not read secret HF_TOKEN from {REF}"


def test_secrets_reach_the_trainer_through_the_scripts_own_reads(tmp_path: Path) -> None:
    routed: list[dict[str, Any]] = []
    got = threading.Event()
    n = nodes(tmp_path, routed, got, secrets={REF: "hf_s3cret value"})
    try:
        n.on_ready(machine(tmp_path, secrets=(("HF_TOKEN", REF),)))
        wait_for(routed, got, "started")
        (pid,) = n.pids("crashy-a2")
        assert psutil.Process(pid).environ()["HF_TOKEN"] == "hf_s3cret value"
    finally:
        n.stop()
    assert "hf_s3cret" not in (tmp_path / "crashy-a2.log").read_text()


def test_a_preempted_gpu_vm_runs_its_shutdown_script_and_its_trainer_stops_in_its_grace_period(tmp_path: Path) -> None:
    with a_started_trainer(tmp_path) as (n, routed, got):
        n.preempt("crashy-a2")
        entry = wait_for(routed, got, "stopped")
        deadline = time.monotonic() + 30
        while n.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert (tmp_path / "crashy-a2" / "w-0" / "run" / "respawn" / "notice").exists()  # left by the shutdown script
    assert "failed" not in [(e.get("jsonPayload") or {}).get("event") for e in routed]
    assert entry["jsonPayload"]["job_id"] == "crashy"
    methods = [(e.get("protoPayload") or {}).get("methodName") for e in routed]
    assert methods.count("compute.instances.preempted") == 1  # the VM's system event, after it is off
