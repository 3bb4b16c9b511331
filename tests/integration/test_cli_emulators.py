"""The respawn CLI against the Pub/Sub emulator and fake-gcs-server, with the real client libraries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import pull, topic_with_subscription
from google.cloud import pubsub_v1

from localcloud.apis.cloudapi import CloudApiServer
from localcloud.services.emulators import PubSubEmulator
from respawn.adapters.gcs_store import GcsJobStore
from respawn.jobs import Attempt, Counters, Job, JobSpec, Status, TpuMachine
from respawn_cli.main import main

pytestmark = pytest.mark.emulator

JOB = {
    "action": "submit",
    "job_id": "llm-small-001",
    "machine": {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
    "zones": ["us-central1-a", "us-west4-a"],
    "image": "us-docker.pkg.dev/proj/repo/trainer:1",
    "args": ["--steps=20000", '--note=a "quoted" $(value)'],
    "checkpoint_uri": "gs://bucket/runs/llm-small-001",
    "ttl": "48h",
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def local_apis(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The TPU and Compute APIs `respawn submit` asks which zones offer the machine: the local ones."""
    with CloudApiServer() as server:
        monkeypatch.setenv("RESPAWN_TPU_ENDPOINT", server.url)
        monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", server.url)
        yield


@pytest.fixture
def jobs_topic(pubsub_emulator: PubSubEmulator, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A fresh topic with a pull subscription; the CLI finds both through the environment."""
    topic, subscription = topic_with_subscription(pubsub_emulator.project, "respawn-jobs")
    monkeypatch.setenv("RESPAWN_PROJECT", pubsub_emulator.project)
    monkeypatch.setenv("RESPAWN_JOBS_TOPIC", topic)
    return topic, subscription


def pull_one(subscription: str) -> pubsub_v1.types.PubsubMessage:
    messages = pull(subscription)
    assert len(messages) == 1
    return messages[0]


def test_submit_publishes_the_job_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs_topic: tuple[str, str]
) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(JOB))
    code, out, err = run(capsys, "submit", str(job_file), "--json")
    assert (code, err) == (0, "")
    published = json.loads(out)
    message = pull_one(jobs_topic[1])
    assert message.message_id == published["message_id"]
    assert json.loads(message.data) == JOB
    assert message.attributes["job_id"] == "llm-small-001"


def test_cancel_publishes_a_cancel_message(capsys: pytest.CaptureFixture[str], jobs_topic: tuple[str, str]) -> None:
    code, out, _ = run(capsys, "cancel", "llm-small-001")
    assert code == 0
    assert "llm-small-001" in out
    assert json.loads(pull_one(jobs_topic[1]).data) == {"action": "cancel", "job_id": "llm-small-001"}


def test_submit_to_a_missing_topic_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pubsub_emulator: PubSubEmulator
) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(JOB))
    code, _, err = run(
        capsys, "submit", str(job_file), "--project", pubsub_emulator.project, "--topic", "no-such-topic"
    )
    assert code == 1
    assert err.count("\n") == 1
    assert "Traceback" not in err


def a_job(job_id: str, status: Status, attempts: int, updated: float) -> Job:
    spec = JobSpec(
        job_id=job_id,
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=("us-central1-a", "us-west4-a"),
        image="us-docker.pkg.dev/proj/repo/trainer:1",
        checkpoint_uri=f"gs://bucket/runs/{job_id}",
    )
    tries = tuple(
        Attempt(n=n, zone=spec.zones[(n - 1) % 2], machine=f"{job_id}-a{n}", requested_at=1000.0 + n,
                started_at=1010.0 + n, ended_at=None if n == attempts else 1100.0 + n,
                end_reason=None if n == attempts else "preempted", last_step=100 * n)
        for n in range(1, attempts + 1)
    )  # fmt: skip
    return Job(
        job_id=job_id,
        spec=spec,
        status=status,
        submitted_at=1000.0,
        updated_at=updated,
        attempts=tries,
        counters=Counters(preemptions=attempts - 1),
    )


def test_status_and_list_read_records(bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = GcsJobStore(bucket)
    done = replace(
        a_job("llm-done", Status.SUCCEEDED, 3, updated=2000.0),
        result={"final_step": 300, "final_loss": 0.125, "params_sha256": "ab" * 32},
    )
    store.save(done, 0)
    store.save(a_job("llm-live", Status.RUNNING, 1, updated=3000.0), 0)

    code, out, _ = run(capsys, "list", "--bucket", bucket)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["job", "status", "attempts", "preemptions", "zone", "updated"]
    assert lines[1].split()[:5] == ["llm-live", "RUNNING", "1", "0", "us-central1-a"]
    assert lines[2].split()[:5] == ["llm-done", "SUCCEEDED", "3", "2", "us-central1-a"]

    code, out, _ = run(capsys, "status", "--bucket", bucket, "--json")
    assert [row["job_id"] for row in json.loads(out)] == ["llm-live", "llm-done"]

    code, out, _ = run(capsys, "status", "llm-done", "--bucket", bucket)
    assert code == 0
    assert "SUCCEEDED" in out
    assert "llm-done-a3" in out
    assert "preemptions 2" in out
    assert "0.125" in out

    code, out, _ = run(capsys, "status", "llm-done", "--bucket", bucket, "--json")
    assert Job.from_dict(json.loads(out)) == done


def test_status_of_an_unknown_job(bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "status", "nobody", "--bucket", bucket)
    assert (code, out) == (2, "")
    assert "nobody" in err
    code, out, _ = run(capsys, "list", "--bucket", bucket)
    assert (code, out.strip()) == (0, "no jobs")
