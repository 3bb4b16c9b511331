"""The two entry points as deployed: functions-framework apps receiving real CloudEvents (binary and structured).

The service behind them is the real one from service_from_env(): GcsJobStore on
fake-gcs-server, GcpTpuProvider / GcpComputeProvider on the local TPU/Compute REST server.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from conftest import pull, topic_with_subscription
from functions_framework import create_app

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.services.emulators import PubSubEmulator
from respawn.adapters.gcs_store import GcsJobStore
from respawn.jobs import Status

pytestmark = pytest.mark.emulator

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "functions" / "main.py")
DATA = ROOT / "tests" / "data"
PROJECT = "ml-research-4821"  # the project of the captured payloads in tests/data
ZONE = "us-central1-a"

GPU_JOB = {
    "action": "submit",
    "job_id": "llm-small-001",
    "machine": {
        "kind": "gpu",
        "machine_type": "g2-standard-8",
        "accelerator_type": "nvidia-l4",
        "accelerator_count": 1,
    },
    "zones": [ZONE, "us-west4-a"],
    "image": "us-docker.pkg.dev/ml-research-4821/respawn/trainer:1",
    "checkpoint_uri": "gs://ml-research-4821-ckpt/runs/llm-small-001",
    "placement": "ordered",  # the first zone first, as the captured entries name it (ranked: the test below)
}


@pytest.fixture
def cloud(bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudApiServer]:
    with CloudApiServer() as server:
        for name, value in {
            "RESPAWN_PROJECT": PROJECT,
            "RESPAWN_STATE_BUCKET": bucket,
            "RESPAWN_TPU_ENDPOINT": server.url,
            "RESPAWN_COMPUTE_ENDPOINT": server.url,
        }.items():
            monkeypatch.setenv(name, value)
        yield server


@pytest.fixture
def status_subscription(pubsub_emulator: PubSubEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """The functions publish status messages to a fresh topic on the emulator; returns a pull subscription on it."""
    topic, subscription = topic_with_subscription(PROJECT, "respawn-status")
    monkeypatch.setenv("RESPAWN_STATUS_TOPIC", topic)
    return subscription


def pubsub_event(data: bytes, message_id: str, topic: str = "respawn-jobs") -> CloudEvent:
    """A Pub/Sub message as a google.cloud.pubsub.topic.v1.messagePublished CloudEvent (Eventarc's shape; a push
    body converted by functions-framework has the same type and data.message)."""
    attributes = {
        "id": message_id,
        "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "time": "2025-03-14T09:20:04.517Z",
    }
    message = {
        "data": base64.b64encode(data).decode(),
        "messageId": message_id,
        "publishTime": "2025-03-14T09:20:04.517Z",
    }
    return CloudEvent(attributes, {"message": message, "subscription": f"projects/{PROJECT}/subscriptions/s"})


def post(target: str, event: CloudEvent, mode: str = "binary") -> Any:
    client = create_app(target, MAIN, "cloudevent").test_client()
    headers, body = to_binary(event) if mode == "binary" else to_structured(event)
    return client.post("/", headers=headers, data=body)


def error_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The ERROR lines logged (respawn logs through one logger, a JSON object per line)."""
    return [json.loads(r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_a_valid_submit_creates_the_machine_and_a_provisioning_record(
    cloud: CloudApiServer, bucket: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    response = post("on_job_message", pubsub_event(json.dumps(GPU_JOB).encode(), "1001"), mode)
    assert response.status_code == 200
    creates = [c for c in cloud.calls if c.verb == "create"]
    assert [(c.kind, c.name, c.zone) for c in creates] == [("gpu", "llm-small-001-a1", ZONE)]
    machine = cloud.machine("llm-small-001-a1")
    assert machine is not None
    assert machine.labels["respawn-job"] == "llm-small-001"
    job, _ = GcsJobStore(bucket).load("llm-small-001")
    assert job is not None
    assert job.status == Status.PROVISIONING
    assert not job.pending
    assert error_lines(caplog) == []


def test_a_ranked_gpu_job_is_placed_by_the_advice_api(cloud: CloudApiServer, bucket: str) -> None:
    """Without `placement: ordered` the function asks the (local) Advice API about the GPU's zones and places the
    machine where the figures say, citing them in the record."""
    job_message = {key: value for key, value in GPU_JOB.items() if key != "placement"}
    assert post("on_job_message", pubsub_event(json.dumps(job_message).encode(), "1010")).status_code == 200
    job, _ = GcsJobStore(bucket).load("llm-small-001")
    assert job is not None and job.current is not None
    creates = [(c.name, c.zone) for c in cloud.calls if c.verb == "create"]
    assert creates == [("llm-small-001-a1", job.current.zone)]
    assert job.current.zone in job_message["zones"]
    assert "(advice)" in job.current.zone_reason and "runner-up" in job.current.zone_reason


def test_the_captured_structured_cloudevent_is_accepted(cloud: CloudApiServer, bucket: str) -> None:
    """tests/data/cloudevent_job.json, a TPU job in Eventarc's structured CloudEvent form, is accepted too."""
    client = create_app("on_job_message", MAIN, "cloudevent").test_client()
    body = (DATA / "cloudevent_job.json").read_bytes()
    response = client.post("/", data=body, headers={"Content-Type": "application/cloudevents+json"})
    assert response.status_code == 200
    assert [(c.verb, c.kind, c.name) for c in cloud.calls if c.verb == "create"] == [
        ("create", "tpu", "llm-small-001-a1")
    ]
    job, _ = GcsJobStore(bucket).load("llm-small-001")
    assert job is not None
    assert job.status == Status.PROVISIONING


def test_a_malformed_job_message_is_acknowledged_with_one_error_line_and_a_rejected_record(
    cloud: CloudApiServer, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad = {**GPU_JOB, "zones": ["us-central1-a; rm -rf /"]}
    response = post("on_job_message", pubsub_event(json.dumps(bad).encode(), "1002"))
    assert 200 <= response.status_code < 300  # acknowledged: Pub/Sub does not redeliver
    errors = error_lines(caplog)
    assert len(errors) == 1  # nothing else reports it as an error
    assert "zones" in errors[0]["message"]
    assert errors[0]["job_id"] == "llm-small-001"
    assert "\n" not in errors[0]["message"]
    assert cloud.calls == []
    job, _ = GcsJobStore(bucket).load("llm-small-001")
    assert job is not None
    assert job.status == Status.REJECTED
    assert "zones" in job.reason


def test_a_message_without_a_usable_job_id_is_acknowledged_and_records_nothing(
    cloud: CloudApiServer, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    response = post("on_job_message", pubsub_event(b"\x00not json at all", "1003"))
    assert response.status_code == 200
    assert len(error_lines(caplog)) == 1
    assert GcsJobStore(bucket).list_ids() == []
    assert cloud.calls == []


def test_a_preemption_log_entry_deletes_the_machine_and_creates_the_next_attempt(
    cloud: CloudApiServer, bucket: str, status_subscription: str
) -> None:
    assert post("on_job_message", pubsub_event(json.dumps(GPU_JOB).encode(), "1004")).status_code == 200
    cloud.preempt("llm-small-001-a1")
    before = len(cloud.calls)

    # The captured sink delivery names attempt 2; this job is at attempt 1.
    envelope = json.loads((DATA / "cloudevent_logentry_preempted.json").read_text())
    entry = json.loads(base64.b64decode(envelope["data"]["message"]["data"]))
    entry["protoPayload"]["resourceName"] = entry["protoPayload"]["resourceName"].replace("-a2", "-a1")
    event = pubsub_event(json.dumps(entry).encode(), "2001", topic="respawn-events")
    for mode in ("structured", "binary"):  # the second delivery is a duplicate
        assert post("on_event", event, mode).status_code == 200

    acted = [(c.verb, c.name, c.zone) for c in cloud.calls[before:] if c.verb in ("create", "delete")]
    assert acted == [("delete", "llm-small-001-a1", ZONE), ("create", "llm-small-001-a2", ZONE)]
    job, _ = GcsJobStore(bucket).load("llm-small-001")
    assert job is not None
    assert job.status == Status.RECOVERING
    assert job.counters.preemptions == 1
    assert [a.end_reason for a in job.attempts] == ["preempted", None]
    notices = [json.loads(m.data) for m in pull(status_subscription)]  # one per change, the duplicate none
    assert [(n["old_status"], n["new_status"]) for n in notices] == [
        (None, "PROVISIONING"),
        ("PROVISIONING", "RECOVERING"),
    ]


def test_an_unrelated_log_entry_is_acknowledged_and_changes_nothing(cloud: CloudApiServer, bucket: str) -> None:
    entry = (DATA / "logentry_unrelated_vm.json").read_bytes()
    assert post("on_event", pubsub_event(entry, "3001", topic="respawn-events")).status_code == 200
    assert cloud.calls == []
    assert GcsJobStore(bucket).list_ids() == []


def test_a_missing_setting_fails_the_delivery_so_it_is_redelivered(
    cloud: CloudApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RESPAWN_STATE_BUCKET")
    response = post("on_job_message", pubsub_event(json.dumps(GPU_JOB).encode(), "1005"))
    assert response.status_code == 500
    assert cloud.calls == []


def test_the_uploaded_source_imports_without_what_gcloudignore_leaves_behind(tmp_path: Path) -> None:
    """`gcloud functions deploy --source=functions` uploads functions/ minus .gcloudignore: main.py must import."""
    functions = ROOT / "functions"
    patterns = [p.strip().rstrip("/") for p in (functions / ".gcloudignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]

    def ignored(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).relative_to(functions)
        return {n for n in names if any(fnmatch.fnmatch(str(rel / n), p) or fnmatch.fnmatch(n, p) for p in patterns)}

    source = tmp_path / "source"
    shutil.copytree(functions, source, ignore=ignored)
    assert not (source / "respawn" / "local").exists()
    assert (source / "requirements.txt").exists()
    # -S and an explicit path: only the uploaded tree and the installed libraries, not the editable install.
    env = {**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{sysconfig.get_paths()['purelib']}"}
    probe = "import main, respawn; print(respawn.__file__)"
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=source, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(source))
