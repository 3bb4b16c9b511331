"""`respawn local run` of a 4-host TPU slice end to end: a preemption, a worker killed, a worker's host error.

The real command in a subprocess, as in test_local_run.py: every attempt is 4 trainer processes under JAX's
multi-controller runtime on loopback. Each disruption recovers the whole slice once; the job ends with the
parameters of an uninterrupted 4-process reference run. (A hung worker needs the job's hang_timeout, 2 minutes
at least: the acceptance run of examples/slice.yaml covers it, the node mechanics are in test_local_slice.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import need
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

STEPS = 40
CHAOS = ["--preempt-at-step", "10", "--kill-worker-at-step", "20:2", "--host-error-at-step", "30:3"]


def test_a_slice_survives_a_preemption_a_killed_worker_and_a_host_error(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    job = yaml.safe_load((ROOT / "examples" / "slice.yaml").read_text())
    job["job_id"] = "slice-it"
    job["args"] = ["--model=nano", f"--steps={STEPS}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    # The in-process bus leaves the Pub/Sub emulator's JVM out: the 4 trainer processes of an attempt share 2 cores
    # (test_local_run.py covers both buses).
    fast = ["--creation-delay", "0.5s", "--sweep-every", "2s"]
    env = {"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}
    report, stderr = run_local(path, tmp_path, env=env, chaos=[*CHAOS, *fast], timeout=900)
    detail = f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-4000:]}"
    assert report["status"] == "SUCCEEDED", detail
    assert report["hosts"] == 4, detail
    assert report["exact"] is True, detail  # against 4 processes x 4 devices, uninterrupted
    assert report["final_step"] == STEPS, detail
    # the preemption and the host error are losses; the killed worker is the one failure
    assert report["preemptions"] == 2 and report["failures"] == 1, detail
    assert [c["action"] for c in report["chaos"]] == ["kill-worker", "host-error"], detail
    assert [z["end"] for z in report["zones"]][-1] == "completed" and report["attempts"] == 4, detail
    assert report["max_live_machines"] <= 2, detail  # a head start overlaps the noticed machine with its successor
    assert report["machines_left"] == 0 and report["processes_left"] == 0, detail
    timeline = [json.loads(line) for line in (Path(report["run_dir"]) / "timeline.jsonl").read_text().splitlines()]
    starts = [e for e in timeline if e["kind"] == "trainer_start"]
    assert len(starts) == 4 * 4 and {e["worker"] for e in starts} == {0, 1, 2, 3}, detail
    # The killed worker's container exits 137 (128 + SIGKILL). Its startup script's `failed` entry races the
    # peers', whose collectives broke at once: whichever arrives first ends the attempt and the slice's deletion
    # stops the rest, on a real VM as here. Either way the attempt ends failed, once.
    killed = [e["code"] for e in timeline if e["kind"] == "trainer_exit" and (e["attempt"], e.get("worker")) == (2, 2)]
    assert killed == [137], detail
    failed = [e["payload"] for e in timeline if e["kind"] == "entry" and e["payload"].get("event") == "failed"]
    assert any(p.get("attempt") == 2 for p in failed), detail
