"""`respawn plan` against the local cloud's Advice API, found as every respawn client finds the local cloud: through
RESPAWN_PROJECT and RESPAWN_COMPUTE_ENDPOINT. A GPU job shows the Advice API's figures, each naming its source; a
TPU job the history only, saying so, without a call to the API. With a state bucket (on fake-gcs-server), the
deployment's preemption history from it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcloud.apis.cloudapi import CloudApiServer
from respawn.adapters.gcs_store import GcsHistoryStore
from respawn.gpus import GPU_SKUS_AS_OF
from respawn.outlook import HOUR, History, Key
from respawn.prices import LIST_SOURCE, list_source
from respawn_cli.main import main

A, B, C = "us-central1-a", "us-central1-b", "us-west1-b"
GPU_JOB = {
    "action": "submit",
    "job_id": "gpu-plan",
    "machine": {
        "kind": "gpu",
        "machine_type": "a2-highgpu-1g",
        "accelerator_type": "nvidia-tesla-a100",
        "accelerator_count": 1,
    },
    "tiers": [
        {"provisioning": "spot", "zones": [A, B, C], "move_on": {"after_preemptions": 2}},
        {"provisioning": "standard", "zones": [A]},
    ],
    "image": "us-docker.pkg.dev/proj/repo/trainer:1",
    "checkpoint_uri": "gs://bucket/runs/gpu-plan",
}
TPU_JOB = {
    **GPU_JOB,
    "job_id": "tpu-plan",
    "machine": {"kind": "tpu", "accelerator_type": "v6e-8"},
    "tiers": [{"provisioning": "spot", "zones": [A, B]}],
}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudApiServer]:
    """The local API with per-zone MTBIs (the local cloud's --mtbi ZONE=DURATION), and the CLI pointed at it."""
    with CloudApiServer(advice_seed=5, advice_mtbi_s={A: 3600.0, B: 20 * 3600.0, C: 6 * 3600.0}) as s:
        monkeypatch.setenv("RESPAWN_PROJECT", "local-project")
        monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", s.url)
        monkeypatch.delenv("RESPAWN_STATE_BUCKET", raising=False)
        yield s


def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], job: dict[str, Any], *flags: str) -> tuple[int, str]:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    code = main(["plan", str(path), *flags])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_a_gpu_job_shows_the_advice_figures(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = plan(tmp_path, capsys, GPU_JOB, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["history"].startswith("no history: RESPAWN_STATE_BUCKET is not set")
    spot, standard = shown["tiers"]
    assert spot["note"] is None
    # respawn's order: the lowest cost per productive hour first; in one region (one price) the longer uptime first
    costs = {z["zone"]: z["cost_per_productive_hour"] for z in spot["zones"]}
    assert spot["order"] == sorted(costs, key=costs.__getitem__)
    assert spot["order"].index(B) < spot["order"].index(A)
    for zone in spot["zones"]:
        region = zone["zone"].rpartition("-")[0]
        assert zone["mtbi_source"] == "prior + advice"
        assert zone["obtainability"] == server.advice.obtainability(zone["zone"], "a2-highgpu-1g")
        assert zone["price_per_hour"] == server.advice.price_per_hour(region, "a2-highgpu-1g")
        assert zone["price_source"].startswith("Advice API price history (")
        assert zone["cost_per_productive_hour"] == pytest.approx(zone["price_per_hour"] / zone["goodput"], rel=1e-3)
        assert "(advice)" in zone["reason"]
    assert standard["note"] == "Advice API advises Spot VMs only; standard: history only"
    (zone,) = standard["zones"]
    assert (zone["mtbi_source"], zone["price_source"], zone["obtainability"]) == (
        "prior (no history)",
        list_source(GPU_SKUS_AS_OF),
        None,
    )
    asked = [r for r in server.requests if "/advice/" in r]
    assert sorted(asked) == sorted(
        ["POST /compute/v1/projects/local-project/regions/us-central1/advice/capacity"] * 2
        + ["POST /compute/v1/projects/local-project/regions/us-central1/advice/capacityHistory"]
        + ["POST /compute/v1/projects/local-project/regions/us-west1/advice/capacity"]
        + ["POST /compute/v1/projects/local-project/regions/us-west1/advice/capacityHistory"]
    )


def test_a_gpu_plan_as_text_names_every_source(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = plan(tmp_path, capsys, GPU_JOB)
    assert code == 0
    assert "tier 0: spot, zones ranked by expected useful hours per dollar: " in out
    assert out.count("Advice API price history (") == 3
    assert list_source(GPU_SKUS_AS_OF) in out
    assert "note: Advice API advises Spot VMs only; standard: history only" in out


def test_a_tier_on_its_own_gpu_is_advised_on_that_gpu(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h100 = {
        "kind": "gpu",
        "machine_type": "a3-highgpu-8g",
        "accelerator_type": "nvidia-h100-80gb",
        "accelerator_count": 8,
    }
    job = {
        **GPU_JOB,
        "machine": h100,
        "tiers": [
            {"provisioning": "spot", "zones": [A, B], "move_on": {"after_stockout": "15m"}},
            {"provisioning": "spot", "zones": [A, B], "machine": GPU_JOB["machine"]},
        ],
    }
    code, out = plan(tmp_path, capsys, job, "--json")
    assert code == 0
    first, second = json.loads(out)["tiers"]
    assert first["machine"] is None and second["machine"] == "gpu a2-highgpu-1g (1 x nvidia-tesla-a100)"
    for tier, machine_type in ((first, "a3-highgpu-8g"), (second, "a2-highgpu-1g")):
        for zone in tier["zones"]:
            assert zone["obtainability"] == server.advice.obtainability(zone["zone"], machine_type), tier
            assert zone["price_per_hour"] == server.advice.price_per_hour("us-central1", machine_type), tier


def test_a_tpu_job_is_planned_on_history_only(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = plan(tmp_path, capsys, TPU_JOB, "--json")
    assert code == 0
    (tier,) = json.loads(out)["tiers"]
    assert tier["note"] == "Advice API does not cover TPUs; history only"
    assert tier["order"] == [A, B]  # nothing tells the zones apart: the list's order
    for zone in tier["zones"]:
        assert (zone["mtbi_source"], zone["obtainability"]) == ("prior (no history)", None)
        assert zone["price_source"] == LIST_SOURCE  # the TPU rows name no date of their own
    assert not [r for r in server.requests if "/advice/" in r]
    code, text = plan(tmp_path, capsys, TPU_JOB)
    assert "note: Advice API does not cover TPUs; history only" in text


def test_a_refused_advice_is_a_note_and_the_plan_goes_on(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.fail_next("advice", code=403, status="PERMISSION_DENIED", message="denied", collection="capacity")
    code, out = plan(tmp_path, capsys, {**GPU_JOB, "tiers": [{"provisioning": "spot", "zones": [A, B]}]}, "--json")
    assert code == 0
    (tier,) = json.loads(out)["tiers"]
    assert tier["note"].startswith("Advice API unavailable: permission denied (denied")
    assert {z["mtbi_source"] for z in tier["zones"]} == {"prior (no history)"}
    assert {z["price_source"] for z in tier["zones"]} == {list_source(GPU_SKUS_AS_OF)}


def test_without_a_project_the_advice_api_is_not_asked(
    server: CloudApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RESPAWN_PROJECT")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    code, out = plan(tmp_path, capsys, GPU_JOB, "--json")
    assert code == 0
    notes = {t["note"] for t in json.loads(out)["tiers"]}
    assert notes == {"Advice API not asked: RESPAWN_PROJECT is not set (or pass --project); history only"}
    assert not [r for r in server.requests if "/advice/" in r]


def test_a_bad_job_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**GPU_JOB, "tiers": [{"provisioning": "cheap", "zones": [A]}]}))
    assert main(["plan", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"respawn: error: {path}: ") and err.count("\n") == 1


@pytest.mark.emulator
def test_the_history_in_the_state_bucket_is_read(
    server: CloudApiServer,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On fake-gcs-server (STORAGE_EMULATOR_HOST, as the local cloud's functions see it): the zone with history shows
    it, the others the pooled history; the Advice API's figures still join in."""
    monkeypatch.setenv("RESPAWN_STATE_BUCKET", bucket)
    store = GcsHistoryStore(bucket)
    now = time.time()
    seen = History().observe(Key(A, "a2-highgpu-1g", "spot"), now, seconds=2 * HOUR, interruptions=6)
    generation = store.save(seen, 0)
    code, out = plan(tmp_path, capsys, GPU_JOB, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["history"] == f"gs://{bucket}/placement/history.json (generation {generation}, 1 zone/machine keys)"
    spot = shown["tiers"][0]
    sources = {z["zone"]: z["mtbi_source"] for z in spot["zones"]}
    assert sources == {A: "history + advice", B: "pooled history + advice", C: "pooled history + advice"}
    assert spot["order"][-1] == A  # six interruptions in two hours


@pytest.mark.emulator
def test_a_state_bucket_without_a_history_says_so(
    server: CloudApiServer,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RESPAWN_STATE_BUCKET", bucket)
    code, out = plan(tmp_path, capsys, TPU_JOB, "--json")
    assert code == 0
    shown = json.loads(out)
    assert (
        shown["history"]
        == f"gs://{bucket}/placement/history.json not written yet (no attempt has ended): an empty history"
    )
    assert shown["tiers"][0]["note"] == "Advice API does not cover TPUs; history only"
