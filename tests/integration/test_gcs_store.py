"""GcsJobStore with the real google-cloud-storage client against fake-gcs-server."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from respawn.adapters.gcs_store import GcsJobStore
from respawn.model import Attempt, Job, JobSpec, Status, TpuMachine
from respawn.ports import ConflictError

pytestmark = pytest.mark.emulator


def make_job(job_id: str = "llm-1") -> Job:
    spec = JobSpec(
        job_id=job_id,
        machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
        zones=("us-central1-a", "us-west4-a"),
        image="us-docker.pkg.dev/p/r/trainer:1",
        checkpoint_uri=f"gs://ckpt/runs/{job_id}",
        args=("--steps=100", "--lr='1e-3; rm -rf /'"),
        env=(("KEY", "va lue"),),
        labels=(("team", "nlp"),),
    )
    attempt = Attempt(n=1, zone="us-central1-a", machine=f"{job_id}-a1", requested_at=100.0)
    return Job(
        job_id=job_id,
        spec=spec,
        status=Status.PROVISIONING,
        submitted_at=100.0,
        updated_at=100.0,
        attempts=(attempt,),
        pending=({"kind": "create", "job_id": job_id, "attempt": 1, "machine": f"{job_id}-a1", "zone": "z"},),
        pending_lease_until=160.0,
        seen_events=("m1",),
    )


def test_round_trip(bucket: str) -> None:
    store = GcsJobStore(bucket)
    assert store.load("llm-1") == (None, 0)
    job = make_job()
    gen = store.save(job, 0)
    assert gen > 0
    loaded, loaded_gen = store.load("llm-1")
    assert loaded == job
    assert loaded_gen == gen
    gen2 = store.save(replace(job, status=Status.RUNNING), gen)
    assert gen2 != gen
    assert store.load("llm-1") == (replace(job, status=Status.RUNNING), gen2)
    store.save(make_job("other-2"), 0)
    assert store.list_ids() == ["llm-1", "other-2"]


def test_record_is_readable_json_at_the_documented_path(bucket: str) -> None:
    from google.cloud import storage

    GcsJobStore(bucket).save(make_job(), 0)
    blob = storage.Client().bucket(bucket).get_blob("respawn/jobs/llm-1.json")
    assert blob is not None
    assert blob.content_type == "application/json"
    text = blob.download_as_text()
    assert '"status": "PROVISIONING"' in text
    assert text.count("\n") > 10


def test_create_only_conflicts_when_the_record_exists(bucket: str) -> None:
    store = GcsJobStore(bucket)
    store.save(make_job(), 0)
    with pytest.raises(ConflictError):
        store.save(replace(make_job(), status=Status.REJECTED), 0)
    assert store.load("llm-1")[0] == make_job()


def test_stale_generation_conflicts(bucket: str) -> None:
    store = GcsJobStore(bucket)
    gen = store.save(make_job(), 0)
    store.save(replace(make_job(), status=Status.RUNNING), gen)
    with pytest.raises(ConflictError):
        store.save(replace(make_job(), status=Status.CANCELLED), gen)
    assert store.load("llm-1")[0].status == Status.RUNNING  # type: ignore[union-attr]


def test_list_ids_is_empty_for_an_empty_bucket(bucket: str) -> None:
    assert GcsJobStore(bucket).list_ids() == []


def test_concurrent_writers_lose_no_update(bucket: str) -> None:
    """N threads do load-modify-CAS increments on one record: every successful write is counted once."""
    store = GcsJobStore(bucket)
    store.save(replace(make_job(), result={"count": 0}), 0)
    threads, increments = 6, 8
    successes: list[int] = []
    conflicts: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        done = 0
        while done < increments:
            job, gen = store.load("llm-1")
            assert job is not None
            try:
                store.save(replace(job, result={"count": job.result["count"] + 1}), gen)
            except ConflictError:
                with lock:
                    conflicts.append(1)
                continue
            done += 1
        with lock:
            successes.append(done)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    final, _ = store.load("llm-1")
    assert final is not None
    assert sum(successes) == threads * increments
    assert final.result["count"] == threads * increments
    assert conflicts, "the writers never raced; the test did not exercise compare-and-set"
