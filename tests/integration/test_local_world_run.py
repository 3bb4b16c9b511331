"""`respawn local run` of a job of several slices end to end (docs/several-slices.md): 2 slices x 2 hosts.

The real command in a subprocess, as in test_local_slice_run.py: each slice is 2 trainer processes, and the
members' processes are one world under JAX's multi-controller runtime on loopback. Every message is delivered
twice. A slice's preemption re-forms the world in place on the other slice's machines and lets the replacement in
once it is set up; a killed worker breaks the world once, and the same members form the next one in place. Where
the replacement never comes (a stockout), the other slice trains on alone to the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

STEPS = 60
LONG_STEPS = 120
FAST = ["--creation-delay", "0.5s", "--sweep-every", "2s", "--duplicate-deliveries", "2"]
ENV = {"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}  # the in-process bus: 4 trainer processes share 2 cores


def world_job(tmp_path: Path, job_id: str, steps: int = STEPS) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "world.yaml").read_text())
    job["job_id"] = job_id
    job["args"] = ["--model=nano", f"--steps={steps}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def timeline(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(report["run_dir"]) / "timeline.jsonl").read_text().splitlines()]


def started_worlds(report: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(world, slice, restored step) of each slice's worker 0 `started` entry, in order."""
    entries = [e["payload"] for e in timeline(report) if e["kind"] == "entry"]
    return [(p["world"], p["slice"], p["restored_step"]) for p in entries if p.get("event") == "started"]


def test_a_world_trains_on_through_two_preemptions_of_a_slice_and_a_killed_worker(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    chaos = ["--preempt-at-step", "10,25", "--kill-worker-at-step", "18:1", *FAST]
    # the steps after the second preemption outlast its replacement's setup (about 17 s here): the one slice left
    # trains about 3 steps a second, so the replacement joins before the end and the world ends with K slices again
    steps = LONG_STEPS
    report, stderr = run_local(world_job(tmp_path, "world-it", steps), tmp_path, env=ENV, chaos=chaos, timeout=900)
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-4000:]}"
    assert report["status"] == "SUCCEEDED", detail
    assert report["final_step"] == steps, detail
    assert report["preemptions"] == 2 and report["failures"] == 1, detail
    # each step trained once, in order: bitwise the uninterrupted world's where every world that trained had both
    # slices (a one-slice world superseded before its first step), else data-exact (the same batches, summed over
    # fewer processes for a while)
    assert report["exactness"] in ("bitwise", "data-exact"), detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail
    assert report["attempts"] == 4, detail  # 2 slices, and a replacement per preemption; the kill made no machine
    worlds = started_worlds(report)
    versions = [w for w, _, _ in worlds]
    assert versions == sorted(versions) and len(set(versions)) >= 4, detail  # first, after each loss, each join
    members = {w: {s for v, s, _ in worlds if v == w} for w in versions}
    assert members[versions[0]] == members[versions[-1]] == {0, 1}, detail  # K, then K again at the end
    trained = [tuple(w["members"]) for w in report["worlds"]]
    assert trained[0] == trained[-1] == (0, 1) and set(trained) <= {(0, 1), (0,), (1,)}, detail


def test_without_its_replacement_the_world_trains_on_with_one_slice_to_the_end(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    # every queued request waits 45 s for capacity: the first two, and the replacement, which the end overtakes
    chaos = ["--preempt-at-step", "10", "--stockout", "us-central2-b:45", *FAST]
    report, stderr = run_local(world_job(tmp_path, "world-alone"), tmp_path, env=ENV, chaos=chaos, timeout=900)
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-4000:]}"
    assert report["status"] == "SUCCEEDED", detail
    assert report["final_step"] == STEPS and report["preemptions"] == 1, detail
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail  # the queued one deleted too
    worlds = started_worlds(report)
    last_world, survivor, restored = worlds[-1]
    assert restored >= 10 and [w for w, _, _ in worlds if w == last_world] == [last_world], detail  # one slice
    assert [w for w, s, _ in worlds if s != survivor] == [1], detail  # the other trained in the first world only
    # one slice from the preemption on: the same batches, summed over fewer processes (bitwise only by chance)
    assert report["exactness"] in ("data-exact", "bitwise"), detail
