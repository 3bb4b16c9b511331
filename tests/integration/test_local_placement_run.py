"""Placement on the local cloud: three zones, the first interrupting about every 20 s, the second about every 5 s and
the last about every 5 minutes (`--mtbi ZONE=DURATION,...`). Ranked (the default), respawn leaves a zone once it
interrupted the job and does most of the training in the long-lived zone, ending SUCCEEDED;
`placement: ordered` keeps the list's order (the same zone after a preemption). Where the job trains is the
control plane's alone: the trainer is the sleeper (`--model=none`, STEP_S a step, no JAX), whose steps cost no CPU
and take the same time on a loaded machine (exactness through preemptions: test_local_run.py and the slice runs).

--seed 5 fixes each zone's lifetimes: the first machine in us-central1-a lives 4.3 s, in us-south1-a 0.4 s, in
us-west4-a 860 s (chaos.py draws each zone's rounds from a stream of its own, scaled by the zone's MTBI). The three
zones are examples/three-zones.yaml's, each offering its v5e.
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

pytestmark = [pytest.mark.emulator, pytest.mark.slow, pytest.mark.waits]
A, B, C = "us-central1-a", "us-south1-a", "us-west4-a"
IN_PROCESS = {"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}
STEPS = 300
STEP_S = 0.1  # at most 10 steps/s: the first two zones' 4.3 s and 0.4 s machines train well under half of STEPS
CHAOS = ["--mtbi", f"{A}=20s,{B}=5s,{C}=5m", "--seed", "5", "--creation-delay", "0.5s", "--sweep-every", "2s"]


def job_file(folder: Path, steps: int, **fields: Any) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "three-zones.yaml").read_text())
    job["args"] = [
        "--model=none",
        f"--steps={steps}",
        f"--step-time={STEP_S}",
        "--checkpoint-every=20",
        "--log-every=1",
    ]
    job["head_start"] = False  # zone choice alone; the head start's own run is test_local_head_start_run.py
    job.update(fields)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def detail(report: dict[str, Any], stderr: str) -> str:
    return f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-3000:]}"


def test_ranked_placement_trains_mostly_in_the_long_lived_zone(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    # The in-process bus: the Pub/Sub emulator's JVM left out (test_local_run.py covers both)
    path = job_file(tmp_path, STEPS)
    report, stderr = run_local(path, tmp_path, "--no-reference", chaos=CHAOS, env=IN_PROCESS, timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["final_step"] == STEPS, why
    zones = [z["zone"] for z in report["zones"]]
    assert zones[0] == A and zones[-1] == C and zones.index(C) <= 2, why  # A and B each lost once at most
    steps = {row["zone"]: row["productive_steps"] for row in report["by_zone"]}
    assert sum(steps.values()) == STEPS and steps[C] > STEPS / 2, why
    assert all(z["placement"].startswith(z["zone"]) for z in report["zones"]), why  # decide's reason for each
    learned = {row["zone"]: row for row in report["history"]}
    # each preempted attempt in A is one interruption there (decayed by the minutes since: 0.999 a while later; a
    # loaded machine trains slower, C's machine may then end too, and ranked placement may come back to A)
    lost_in_a = sum(1 for z in report["zones"] if z["zone"] == A and z["end"] in ("preempted", "lost"))
    assert lost_in_a >= 1 and learned[A]["interruptions"] == pytest.approx(lost_in_a, abs=0.01 * lost_in_a), why
    assert learned[C]["mtbi_s"] > learned[A]["mtbi_s"], why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why


def test_ordered_placement_follows_the_list(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    path = job_file(tmp_path, 200, placement="ordered", job_id="three-zones-ordered")
    report, stderr = run_local(path, tmp_path, "--no-reference", chaos=CHAOS, timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["final_step"] == 200, why
    assert report["preemptions"] >= 1 and {z["zone"] for z in report["zones"]} == {A}, why  # the same zone again
    assert all("list order" in z["placement"] for z in report["zones"]), why
