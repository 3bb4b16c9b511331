"""bench_handler's event mix exercises the path it names: every job's machines are created and its events applied.

A mix whose jobs fail at their first create (no provider for their machine's API) measures another path, a no-op
and a fresh read per event; the benchmark stops instead of reporting it.
"""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

import pytest
from fakes import InMemoryJobStore

from respawn.adapters.clock import SystemClock
from respawn.service import Service

# bench/ is a folder of scripts, not an installed package: import the script from it.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
bench_handler = importlib.import_module("bench_handler")


def mix(jobs: int = 3) -> list[list[tuple[str, str, dict[str, object]]]]:
    rng = random.Random(7)
    return [bench_handler.job_events(f"job-{i}", rng, 2) for i in range(jobs)]


def test_the_mix_applies_every_event_it_names() -> None:
    provider = bench_handler.InstantProvider()
    latencies, by_label, _ = bench_handler.run(
        [Service(InMemoryJobStore(), {"compute": provider}, SystemClock())], mix(), 1
    )
    assert len(latencies) == sum(len(v) for v in by_label.values()) > 0
    assert {"submit", "started", "checkpoint", "preempted", "completed"} <= set(by_label)
    assert provider.machines == {}  # every job completed and its last machine was deleted


def test_a_mix_whose_machines_cannot_be_created_stops_the_benchmark() -> None:
    service = Service(InMemoryJobStore(), {"gpu": bench_handler.InstantProvider()}, SystemClock())  # no such API
    with pytest.raises(SystemExit, match="did not do what it measures"):
        bench_handler.run([service], mix(), 1)
