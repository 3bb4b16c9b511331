"""`respawn local run` of TPUs through Compute Engine end to end: a MIG slice, a single VM, flex-start, a stockout.

The real command in a subprocess, as in test_local_run.py. A v6e-16 job with no `api` goes through Compute Engine:
a workload policy, an instance template and a MIG of 4 VMs, each VM a trainer process on loopback under JAX's
multi-controller runtime. One VM is preempted (its worker alone gets the notice), a worker is killed without a word,
and every Pub/Sub message is pushed twice: each disruption recovers the whole slice once, one MIG deleted and one
created, and the job ends with the parameters of an uninterrupted 4-process reference run. The cheaper runs are a
v6e-8 instance (one process): a stockout on its insert walks to the next zone and a preemption recovers it; and a
flex-start job waits in its zone's queue for capacity, then runs.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from test_local_run import ROOT, run_local

from localcloud.readout.recovery_split import recoveries
from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "compute-slice.yaml"
ZONES = yaml.safe_load(EXAMPLE.read_text())["zones"]
FAST = ["--creation-delay", "0.5s", "--sweep-every", "2s"]
# The in-process bus leaves the Pub/Sub emulator's JVM out: the 4 trainer processes of an attempt share 2 cores
# (test_local_run.py covers both buses).
IN_PROCESS = {"RESPAWN_HIDE_PUBSUB_EMULATOR": "1"}
MIG = "instanceGroupManagers"  # the collection of the local Compute API's calls on managed instance groups


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the runs of this module: the compilation cache and the cached reference runs."""
    return tmp_path_factory.mktemp("respawn-compute")


def job_file(workdir: Path, job_id: str, args: list[str], **changes: Any) -> Path:
    """examples/compute-slice.yaml with another id, args and `changes` (`machine` merged into its machine)."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job.update(job_id=job_id, args=args)
    job["machine"].update(changes.pop("machine", {}))
    job.update(changes)
    path = workdir / f"{job_id}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def timeline(report: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (Path(report["run_dir"]) / "timeline.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def calls(events: list[dict[str, Any]], verb: str, what: str) -> list[str]:
    """The machines named by the local API's `verb` calls on objects of kind `what`, in order."""
    return [e["machine"] for e in events if e["kind"] == f"{verb}_call" and e.get("what") == what]


def detail(report: dict[str, Any], stderr: str) -> str:
    return f"report: {json.dumps(report, indent=1)[:4000]}\nstderr tail:\n{stderr[-4000:]}"


SLICE_STEPS = 40


def test_a_compute_engine_slice_survives_a_vm_preemption_and_a_killed_worker(workdir: Path) -> None:
    need(FakeGcs.missing())
    args = ["--model=nano", f"--steps={SLICE_STEPS}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"]
    # Without the head start, so that the preempted VM's own system event ends the attempt (its MIG's VM name mapped
    # to the attempt); test_local_head_start_run.py runs the head start.
    path = job_file(workdir, "compute-it", args, head_start=False)
    assert "api" not in yaml.safe_load(path.read_text())["machine"]  # v6e goes through Compute Engine by default
    # Seed 1 takes worker 2's VM: worker 0's own VM gets no notice, its trainer stops on the peer's and exits 0,
    # which must read as `stopped`, not `completed` (the notice file the trainer leaves).
    chaos = ["--preempt-at-step", "10", "--kill-worker-at-step", "20:2", "--duplicate-deliveries", "2", "--seed", "1"]
    chaos += FAST
    report, stderr = run_local(path, workdir, env=IN_PROCESS, chaos=chaos, timeout=900)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED", why
    assert report["hosts"] == 4, why
    assert report["exact"] is True, why  # against 4 processes x 4 devices, uninterrupted
    assert report["final_step"] == SLICE_STEPS, why
    assert (report["preemptions"], report["failures"], report["attempts"]) == (1, 1, 3), why
    assert [z["api"] for z in report["zones"]] == ["compute"] * 3, why
    assert [z["end"] for z in report["zones"]] == ["preempted", "failed", "completed"], why
    assert report["max_live_machines"] <= 1, why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why

    events = timeline(report)
    # one VM of a1 was preempted: its worker alone had the notice, its VM alone logged the system event
    (notice,) = [e for e in events if e["kind"] == "notice"]
    (preempted,) = [e for e in events if e["kind"] == "preempted"]
    assert notice["workers"] == 1 and preempted["worker"] == notice["worker"] == 2, why
    (instance,) = preempted["instances"]
    assert instance.startswith("compute-it-a1-w-") and len(instance.rsplit("-", 1)[1]) == 4, why
    # each recovery: the lost MIG deleted once (by the API, however often a deletion was asked) and its replacement
    # created once
    names = [f"compute-it-a{n}" for n in (1, 2, 3)]
    assert calls(events, "create", MIG) == names, why
    assert sorted(e["machine"] for e in events if e["kind"] == "deleted") == names, why
    starts = [e for e in events if e["kind"] == "trainer_start"]
    assert len(starts) == 3 * 4 and {e["worker"] for e in starts} == {0, 1, 2, 3}, why
    if os.geteuid() == 0 and shutil.which("setpriv"):  # the local machine runs containers as the image's user
        machines = Path(report["run_dir"]) / "machines"
        for n, worker in itertools.product((1, 2, 3), range(4)):
            log = (machines / f"compute-it-a{n}-w-{worker}.log").read_text(errors="replace")
            assert "the container runs as user 10001:10001" in log, (n, worker, log[-2000:])
        # a1's workers that stopped on worker 2's notice left their notice files as the trainer's user; worker 2's
        # own was left by its shutdown script (root), unless its trainer, stopping at once, wrote it first
        owners = [
            (machines / "compute-it-a1" / f"w-{w}" / "run" / "respawn" / "notice").stat().st_uid for w in range(4)
        ]
        assert owners[:2] + owners[3:] == [10001, 10001, 10001] and owners[2] in (0, 10001), why


SINGLE_STEPS = 60
SINGLE_ARGS = ["--model=tiny", f"--steps={SINGLE_STEPS}", "--checkpoint-every=10", "--log-every=1"]


def test_a_v6e_8_instance_walks_past_a_stockout_and_recovers_from_a_preemption(workdir: Path) -> None:
    """The first zone has no capacity for the insert (ZONE_RESOURCE_POOL_EXHAUSTED): the next zone's instance is
    preempted and recreated there: ranked placement holds a zone that just had no capacity for the job against it
    more than one that just preempted it."""
    need(FakeGcs.missing())
    path = job_file(workdir, "single-it", SINGLE_ARGS, machine={"accelerator_type": "v6e-8"}, head_start=False)
    chaos = ["--stockout", f"{ZONES[0]}:1", "--preempt-at-step", "20", *FAST]
    report, stderr = run_local(path, workdir, env=IN_PROCESS, chaos=chaos, timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["exact"] is True, why
    assert report["hosts"] == 1 and report["final_step"] == SINGLE_STEPS, why
    assert report["capacity_errors"] == 1 and report["preemptions"] == 1, why
    zones = report["zones"]
    assert [(z["zone"], z["end"], z["api"]) for z in zones] == [
        (ZONES[0], "capacity", "compute"),
        (ZONES[1], "preempted", "compute"),
        (ZONES[1], "completed", "compute"),
    ], why
    events = timeline(report)
    (preempted,) = [e for e in events if e["kind"] == "preempted"]
    assert preempted["instances"] == ["single-it-a2"], why  # the instance itself: no MIG for one host
    assert calls(events, "create", MIG) == [], why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why


NOTICE = 6  # the job's preemption_notice, seconds: long enough to see the noticed machine train through it


def test_with_a_longer_notice_the_noticed_machine_trains_on_while_the_next_one_boots(workdir: Path) -> None:
    """preemption_notice: the metadata flag comes NOTICE s before the soft off. Its startup script's `notice` entry
    starts the head start at once; the noticed trainer trains until the soft off's SIGTERM, then saves; the next
    machine's trainer starts from that save. The recovery leaves less time without training than the notice ->
    first step, by most of the notice."""
    need(FakeGcs.missing())
    steps = 200  # at ~20 steps/s, training outlasts the notice
    args = ["--model=tiny", f"--steps={steps}", "--checkpoint-every=50", "--log-every=1"]
    path = job_file(workdir, "notice-it", args, machine={"accelerator_type": "v6e-8"}, preemption_notice=f"{NOTICE}s")
    report, stderr = run_local(path, workdir, env=IN_PROCESS, chaos=["--preempt-at-step", "30", *FAST], timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["exact"] is True and report["final_step"] == steps, why
    assert report["preemptions"] == 1 and report["max_live_machines"] <= 2, why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why
    (row,) = recoveries(timeline(report))
    assert row["after_notice_s"] >= NOTICE - 1.5, why  # trained on through the notice
    assert row["gap_s"] <= row["first_step_s"] - (NOTICE - 1.5), why


def test_a_flex_start_job_waits_in_its_zone_for_capacity_then_runs(workdir: Path) -> None:
    need(FakeGcs.missing())
    path = job_file(
        workdir,
        "flex-it",
        SINGLE_ARGS,
        machine={"accelerator_type": "v6e-8", "queue_timeout": "2m"},
        provisioning="flex-start",
    )
    report, stderr = run_local(path, workdir, env=IN_PROCESS, chaos=["--stockout", f"{ZONES[0]}:4", *FAST])
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["exact"] is True, why
    assert [(z["zone"], z["end"], z["api"]) for z in report["zones"]] == [(ZONES[0], "completed", "compute")], why
    assert report["capacity_errors"] == 0, why
    waited = [e for e in timeline(report) if e["kind"] == "queued"]
    assert waited and report["zones"][0]["queue_s"] >= 4.0, why  # waited for capacity in its zone, then ran
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why
