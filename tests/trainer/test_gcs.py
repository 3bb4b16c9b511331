"""Checkpoints on gs:// (fake-gcs-server through tensorstore and gcsfs): preempted, resumed, exact."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from trainer_harness import ARGS, Reference, last, run_to_end, start, trainer_env

from respawn.local.emulators import FakeGcs


@pytest.mark.emulator
@pytest.mark.slow
def test_gcs_checkpoints_survive_a_preemption_and_resume_exactly(
    fake_gcs: FakeGcs, bucket: str, tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    sink = tmp_path / "entries.jsonl"
    env = trainer_env(f"gs://{bucket}/runs/job-test", sink, compile_cache)
    args = [a for a in ARGS if not a.startswith("--checkpoint-every")] + ["--checkpoint-every=40"]
    run = start(env, args)
    run.wait_step(25)
    run.signal(signal.SIGTERM)
    assert run.finish() == 0, run.tail()
    stopped = last(sink, "stopped")

    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    names = {blob.name for blob in client.list_blobs(bucket, prefix="runs/job-test/")}
    assert f"runs/job-test/{stopped['step']}/commit_success.txt" in names

    code, run = run_to_end(env, args)
    assert code == 0, run.tail()
    assert last(sink, "started")["restored_step"] == stopped["step"]
    assert last(sink, "completed")["params_sha256"] == reference.params_sha256
