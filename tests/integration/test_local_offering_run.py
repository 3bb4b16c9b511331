"""`respawn local run` of jobs whose first zone does not offer their machine.

The real command in a subprocess, as in test_local_compute_run.py. A v6e-16 job (a Compute Engine MIG slice of 4
ct6e-standard-4t VMs) whose first zone does not offer ct6e-standard-4t (`--unoffered`): the MIG is created there,
makes no VM and says why (the words of a refused instance create, as a real MIG reports a VM it cannot make); the
zone is skipped like a stockout that never ends, and the slice comes up in the second zone. On a reservation-bound
tier it is a BULK MIG of RESERVATION_BOUND VMs, ending SUCCEEDED with the parameters of an uninterrupted 4-process
run; on Spot a MIG in the default mode. The record says why the first zone was skipped, in the API's words (what
`respawn status` prints under "skipped zones").

Without any flag: the quickstart's v5e in a zone that Google's table gives no v5e (localcloud/apis/offerings.py) is
warned about before the run, as `respawn submit` warns, refused at its first create there and skipped; the job runs
in its second zone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import need
from test_local_compute_run import FAST, IN_PROCESS, MIG, calls, detail, timeline
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "compute-slice.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
STEPS = 10


def test_a_reservation_bound_slice_skips_a_zone_without_its_machine_and_runs_in_the_next(tmp_path: Path) -> None:
    need(FakeGcs.missing())
    job = yaml.safe_load(EXAMPLE.read_text())
    first, second = zones = job.pop("zones")
    del job["provisioning"]
    job.update(
        job_id="bound-it",
        args=["--model=nano", f"--steps={STEPS}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"],
        tiers=[{"provisioning": "reservation-bound", "zones": zones, "reservation": "v6e-calendar-1"}],
    )
    path = tmp_path / "bound-it.yaml"
    path.write_text(yaml.safe_dump(job))
    chaos = ["--unoffered", f"{first}:ct6e-standard-4t", *FAST]
    report, stderr = run_local(path, tmp_path, env=IN_PROCESS, chaos=chaos, timeout=900)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["exact"] is True, why
    assert report["hosts"] == 4 and report["final_step"] == STEPS, why
    rows = [(z["zone"], z["end"], z["api"]) for z in report["zones"]]
    assert rows == [(first, "unoffered", "compute"), (second, "completed", "compute")], why
    refused = f"Machine type with name 'ct6e-standard-4t' does not exist in zone '{first}'"
    assert refused in report["zones"][0]["error"], why
    assert calls(timeline(report), "create", MIG) == ["bound-it-a1", "bound-it-a2"], why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why


def test_a_spot_slice_refused_for_its_machine_type_inside_its_mig_skips_the_zone(tmp_path: Path) -> None:
    """The refusal comes from inside the MIG (its VMs' machine type, not the insert): read as unoffered, not as a
    stockout to retry, and nothing is left in the zone."""
    need(FakeGcs.missing())
    job = yaml.safe_load(EXAMPLE.read_text())
    first, second = job["zones"]
    job.update(job_id="spot-unoffered", args=["--model=nano", "--steps=4", "--batch-size=16", "--log-every=1"])
    path = tmp_path / "spot-unoffered.yaml"
    path.write_text(yaml.safe_dump(job))
    chaos = ["--unoffered", f"{first}:ct6e-standard-4t", "--no-reference", *FAST]
    report, stderr = run_local(path, tmp_path, env=IN_PROCESS, chaos=chaos, timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["attempts"] == 2, why
    rows = [(z["zone"], z["end"]) for z in report["zones"]]
    assert rows == [(first, "unoffered"), (second, "completed")], why
    refused = f"'resource.machineType': 'zones/{first}/machineTypes/ct6e-standard-4t'. Machine type with name"
    assert refused in report["zones"][0]["error"], why  # the MIG's own report of the VMs it could not make
    assert calls(timeline(report), "create", MIG) == ["spot-unoffered-a1", "spot-unoffered-a2"], why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why


def test_a_tpu_job_whose_first_zone_offers_no_tpu_runs_in_its_second_with_no_flag(tmp_path: Path) -> None:
    """us-central1-b offers v6e but no v5e (Cloud TPU regions and zones): the v5e job's first create there is
    refused for its type, with no `--unoffered`, and the job ends SUCCEEDED in us-central1-a, exactly as an
    uninterrupted run."""
    need(FakeGcs.missing())
    job = yaml.safe_load(QUICKSTART.read_text())
    first, second = "us-central1-b", "us-central1-a"
    job.update(
        job_id="no-v5e-here",
        zones=[first, second],
        args=["--model=nano", f"--steps={STEPS}", "--batch-size=16", "--checkpoint-every=5", "--log-every=1"],
    )
    path = tmp_path / "no-v5e-here.yaml"
    path.write_text(yaml.safe_dump(job))
    report, stderr = run_local(path, tmp_path, env=IN_PROCESS, chaos=FAST, timeout=600)
    why = detail(report, stderr)
    assert f"warning: zones: {first} does not offer TPU type v5litepod-8; respawn skips it" in stderr, why
    assert report["status"] == "SUCCEEDED" and report["exact"] is True and report["final_step"] == STEPS, why
    rows = [(z["zone"], z["end"], z["api"]) for z in report["zones"]]
    assert rows == [(first, "unoffered", "tpu"), (second, "completed", "tpu")], why
    refused = f"Accelerator type with name 'v5litepod-8' does not exist in zone '{first}'"
    assert refused in report["zones"][0]["error"], why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why
