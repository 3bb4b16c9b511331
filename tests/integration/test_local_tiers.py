"""Ordered fallback tiers on the local cloud: Spot, then standard once Spot stocks out or is preempted twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from test_local_run import ROOT, run_local

from localcloud.services.emulators import FakeGcs

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
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
    detail = f"{report}\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["final_step"] == 60, detail
    assert tiers_of(report)[-1] == 1 and report["zones"][0]["end"] == "queued", detail  # spot waited, then standard
    standard = report["tiers"][1]
    assert standard["provisioning"] == "standard" and standard["machine_hours"] > 0, detail
    assert report["tiers"][0]["machine_hours"] == 0 and report["machines_left"] == 0, detail


def test_after_two_spot_preemptions_the_third_attempt_is_standard(job_file: Path, tmp_path: Path) -> None:
    need(FakeGcs.missing())
    report, stderr = run_local(job_file, tmp_path, "--no-reference", chaos=[*FAST, "--preempt-at-step", "20,40"])
    detail = f"{report}\n{stderr[-3000:]}"
    assert report["status"] == "SUCCEEDED" and report["preemptions"] == 2, detail
    assert tiers_of(report) == [0, 0, 1], detail
    spot, standard = report["tiers"]
    assert spot["attempts"] == 2 and standard["attempts"] == 1, detail
    assert spot["cost_usd"] > 0 and standard["cost_usd"] > 0, detail
