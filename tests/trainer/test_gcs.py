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


@pytest.mark.emulator
@pytest.mark.slow
def test_the_compilation_cache_next_to_gcs_checkpoints_serves_a_fresh_machine(
    fake_gcs: FakeGcs, bucket: str, tmp_path: Path
) -> None:
    """A replacement VM has an empty disk: the programs the first machine compiled are read back from gs://."""
    checkpoints = f"gs://{bucket}/runs/job-cache"
    logs = []
    for machine in ("first", "second"):
        home = tmp_path / machine  # the machine's own (empty) disk: no local cache to fall back on
        env = trainer_env(checkpoints, tmp_path / "entries.jsonl", home / "unused", HOME=str(home))
        del env["RESPAWN_COMPILE_CACHE"]  # the default: next to the checkpoints
        env["JAX_LOG_COMPILES"] = "1"
        code, run = run_to_end(env, ["--model=nano", "--steps=3", "--log-every=1"])
        assert code == 0, run.tail()
        assert not (home / ".cache").exists()
        logs.append("".join(run.stderr))

    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    cached = [b.name for b in client.list_blobs(bucket, prefix="runs/job-cache-compile-cache/")]
    assert any("/jit_train_step-" in name for name in cached), cached
    first, second = logs
    assert "Persistent compilation cache hit for 'jit_train_step'" not in first
    assert "Persistent compilation cache hit for 'jit_train_step'" in second
