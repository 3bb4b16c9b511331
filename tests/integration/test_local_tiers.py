"""Ordered fallback tiers on the local cloud: Spot, then standard once Spot stocks out or is preempted twice; a GPU
job's H100 Spot tier, then its A100 Spot tier once H100 stocks out everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from test_local_compute_run import IN_PROCESS, detail
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow, pytest.mark.waits]
FAST = ["--creation-delay", "0.5s", "--sweep-every", "2s"]


@pytest.fixture(scope="module")
def job_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "tiers.yaml").read_text())
    job["args"] = ["--model=nano", "--steps=60", "--checkpoint-every=10", "--log-every=1"]
    # Without the head start: the nano model trains 60 steps in about a second, so a noticed trainer handing over
    # (training on until its successor is ready) would end the job before the second preemption
    job["head_start"] = False
    path = tmp_path_factory.mktemp("tiers") / "tiers.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def tiers_of(report: dict[str, Any]) -> list[int]:
    return [z["tier"] for z in report["zones"]]


def test_a_permanent_spot_stockout_ends_on_the_standard_tier(job_file: Path, tmp_path: Path) -> None:
    need(FakeGcs.missing())
    stockout = ["--spot-stockout", "us-central1-a", "--spot-stockout", "us-west4-a"]
    report, stderr = run_local(job_file, tmp_path, *stockout, "--no-reference", chaos=FAST)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["final_step"] == 60, why
    assert tiers_of(report)[-1] == 1 and report["zones"][0]["end"] == "queued", why  # spot waited, then standard
    standard = report["tiers"][1]
    assert standard["provisioning"] == "standard" and standard["machine_hours"] > 0, why
    assert report["tiers"][0]["machine_hours"] == 0 and report["machines_left"] == 0, why


def test_after_two_spot_preemptions_the_third_attempt_is_standard(job_file: Path, tmp_path: Path) -> None:
    need(FakeGcs.missing())
    report, stderr = run_local(job_file, tmp_path, "--no-reference", chaos=[*FAST, "--preempt-at-step", "20,40"])
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["preemptions"] == 2, why
    assert tiers_of(report) == [0, 0, 1], why
    spot, standard = report["tiers"]
    assert spot["attempts"] == 2 and standard["attempts"] == 1, why
    assert spot["cost_usd"] > 0 and standard["cost_usd"] > 0, why


TIERS = ROOT / "examples" / "gpu-tiers.yaml"
TIER_STEPS = 20


def test_a_job_whose_h100_spot_tier_is_stocked_out_everywhere_runs_on_its_a100_tier(tmp_path: Path) -> None:
    """H100 Spot has no capacity in either zone (a stockout of that machine type only): the job moves on to its A100
    Spot tier, whose machine is its own, and finishes there with the job's global batch and final step, exactly as an
    uninterrupted run; the report names the machine each attempt ran on."""
    need(FakeGcs.missing())
    job = yaml.safe_load(TIERS.read_text())
    h100, a100 = job["machine"]["machine_type"], job["tiers"][1]["machine"]["machine_type"]
    assert (h100, a100) == ("a3-highgpu-8g", "a2-highgpu-4g") and "machine" not in job["tiers"][0]
    job["job_id"] = "gpu-tiers-it"
    job["tiers"][0]["move_on"] = {"after_stockout": "1m"}  # the least a tier may wait
    job["args"] = ["--model=nano", f"--steps={TIER_STEPS}", "--batch-size=16", "--max-device-batch=4"]
    job["args"] += ["--checkpoint-every=5", "--log-every=1"]
    path = tmp_path / "gpu-tiers-it.yaml"
    path.write_text(yaml.safe_dump(job))
    zones = job["tiers"][0]["zones"]
    chaos = [arg for zone in zones for arg in ("--spot-stockout", f"{zone}@{h100}")]
    report, stderr = run_local(path, tmp_path, env=IN_PROCESS, chaos=[*chaos, *FAST], timeout=600)
    why = detail(report, stderr)
    assert report["status"] == "SUCCEEDED" and report["exact"] is True, why
    assert report["final_step"] == TIER_STEPS, why
    rows = report["zones"]
    *stocked, last = rows
    assert len(stocked) >= len(zones) and report["capacity_errors"] == len(stocked), why
    assert all(r["tier"] == 0 and r["end"] == "capacity" and r["machine"].startswith(h100) for r in stocked), why
    assert (last["tier"], last["end"]) == (1, "completed") and last["machine"].startswith(a100), why
    assert report["machines_left"] == 0 and report["processes_left"] == 0, why
    log = (Path(report["run_dir"]) / "machines" / f"gpu-tiers-it-a{last['attempt']}.log").read_text(errors="replace")
    assert "global batch 16: 16 rows on each of 1 devices, in 4 micro-batch(es)" in log, why
