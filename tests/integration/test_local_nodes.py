"""The local cloud's machines: a trainer killed without a word gets the `failed` entry the startup script writes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from respawn import parsing
from respawn.events import TrainerFailed
from respawn.local.cloudapi import CloudMachine
from respawn.local.nodes import Nodes
from respawn.local.timeline import Timeline
from respawn.machine import GRACE_S

REPO = Path(__file__).resolve().parents[2]


def machine(tmp_path: Path) -> CloudMachine:
    metadata = {
        "respawn-job-id": "crashy",
        "respawn-attempt": "2",
        "respawn-checkpoint-uri": str(tmp_path / "ckpt"),
        "respawn-args": json.dumps(["--model=none", "--steps=100000", "--step-time=0.05", "--log-every=1"]),
        "respawn-env": "{}",
    }
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


def nodes(tmp_path: Path, routed: list[dict[str, Any]], got: threading.Event) -> Nodes:
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
    assert event.error == "the trainer exited with code -9"
    assert "worker" not in entry["jsonPayload"]  # a one-host machine: no worker field


def test_a_deleted_machine_is_no_failure(tmp_path: Path) -> None:
    with a_started_trainer(tmp_path) as (n, routed, _):
        n.on_deleted("crashy-a2")
        deadline = time.monotonic() + 30
        while n.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the reaper has run
    assert not n.alive()
    assert "failed" not in [e["jsonPayload"].get("event") for e in routed]


def test_a_secret_without_a_value_is_the_attempts_failure_and_no_trainer_starts(tmp_path: Path) -> None:
    routed: list[dict[str, Any]] = []
    got = threading.Event()
    n = nodes(tmp_path, routed, got)
    ref = "projects/respawn-local/secrets/hf-token/versions/1"
    m = machine(tmp_path)
    m.metadata["respawn-secrets"] = json.dumps({"HF_TOKEN": ref})
    try:
        n.on_ready(m)
        entry = wait_for(routed, got, "failed")
        assert n.pids("crashy-a2") == [] and not n.alive()
    finally:
        n.stop()
    event = parsing.log_entry_event(entry)
    assert isinstance(event, TrainerFailed) and (event.job_id, event.attempt) == ("crashy", 2)
    assert event.error == f"could not read secret HF_TOKEN from {ref}"
