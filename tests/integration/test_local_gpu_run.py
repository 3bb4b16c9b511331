"""`respawn local run` of a GPU machine of 2 VMs end to end: a MIG of 2 a3-highgpu-8g VMs recovered whole.

The real command in a subprocess, as test_local_compute_run.py runs a TPU slice. examples/gpu-multi-vm.yaml is a
MIG of 2 VMs of 8 GPUs each; locally each VM is a trainer process with 8 CPU devices standing in for its GPUs, and
the two join by jax.distributed, each learning its place among the MIG's VMs from the Compute API as a real VM's
startup script does. One VM is preempted (its worker alone gets the notice), a worker is killed without a word,
and every Pub/Sub message is pushed twice: each disruption recovers the whole group once, one MIG deleted and one
created, and the job ends with the parameters of an uninterrupted 2-process reference run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import need
from test_local_compute_run import FAST, IN_PROCESS, MIG, calls, detail, timeline
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "gpu-multi-vm.yaml"
STEPS = 30


def test_a_two_vm_a3_job_survives_a_vm_preemption_and_a_killed_worker(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    job = yaml.safe_load(EXAMPLE.read_text())
    assert job["machine"]["machine_type"] == "a3-highgpu-8g" and job["machine"]["vms"] == 2
    job.update(
        job_id="gpu-vms-it",
        head_start=False,  # the preempted VM's own system event ends the attempt (test_local_head_start_run.py)
        args=["--model=nano", f"--steps={STEPS}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"],
    )
    path = tmp_path / "gpu-vms-it.yaml"
    path.write_text(yaml.safe_dump(job))
    chaos = ["--preempt-at-step", "10", "--kill-worker-at-step", "20:1", "--duplicate-deliveries", "2", "--seed", "1"]
    report, stderr = run_local(path, tmp_path, env=IN_PROCESS, chaos=[*chaos, *FAST], timeout=900)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED", why
    assert report["hosts"] == 2, why
    assert report["exact"] is True, why  # against 2 processes x 8 devices, uninterrupted
    assert report["final_step"] == STEPS, why
    assert (report["preemptions"], report["failures"], report["attempts"]) == (1, 1, 3), why
    assert [z["end"] for z in report["zones"]] == ["preempted", "failed", "completed"], why
    assert report["max_live_machines"] <= 1, why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why

    events = timeline(report)
    (preempted,) = [e for e in events if e["kind"] == "preempted"]
    (instance,) = preempted["instances"]  # one VM of the group, not the group
    assert instance.startswith("gpu-vms-it-a1-w-") and len(instance.rsplit("-", 1)[1]) == 4, why
    names = [f"gpu-vms-it-a{n}" for n in (1, 2, 3)]
    assert calls(events, "create", MIG) == names, why  # one create per recovery, however often it was asked
    assert sorted(e["machine"] for e in events if e["kind"] == "deleted") == names, why  # and one delete
    starts = [e for e in events if e["kind"] == "trainer_start"]
    assert len(starts) == 3 * 2 and {e["worker"] for e in starts} == {0, 1}, why
    machines = Path(report["run_dir"]) / "machines"
    for n in (1, 2, 3):  # each VM found its place among its MIG's VMs, and the two joined as 2 processes
        logs = [(machines / f"gpu-vms-it-a{n}-w-{w}.log").read_text(errors="replace") for w in (0, 1)]
        ids = [re.findall(r"process (\d) of 2 \(8 local devices of 16\)", log) for log in logs]
        assert sorted(i for found in ids for i in set(found)) == ["0", "1"], (n, ids, why)
