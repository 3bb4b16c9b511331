"""Checkpoints on gs:// (fake-gcs-server through tensorstore and gcsfs): preempted, resumed, exact."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from trainer_harness import ARGS, REPO, Reference, last, run_to_end, start, trainer_env

from localcloud.services.emulators import FakeGcs


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
@pytest.mark.parametrize(
    ("program", "steps", "reused"),
    [
        # A user's loop, plain jax.jit: JAX's persistent cache, read back from gs://. A restored state carries its
        # shardings, a fresh one none (another program), so the second machine, the first to restore, compiles
        # and writes, and the third, restoring too, reads it.
        (
            ["examples/byo/train.py", "--steps"],
            ("3", "6", "9"),
            "Persistent compilation cache hit for 'jit_train_step'",
        ),
        # respawn's trainer: respawn_trainer.compiled(key=...) finds the stored program without even tracing it.
        (["-m", "trainer", "--model=nano", "--steps"], ("3", "3"), None),
    ],
    ids=["users-loop", "respawn-trainer"],
)
def test_the_compilation_cache_next_to_gcs_checkpoints_serves_a_fresh_machine(
    fake_gcs: FakeGcs, bucket: str, tmp_path: Path, program: list[str], steps: tuple[str, ...], reused: str | None
) -> None:
    """A replacement VM has an empty disk: the programs an earlier machine compiled are read back from gs://."""
    name = "byo" if reused else "demo"
    checkpoints = f"gs://{bucket}/runs/cache-{name}"
    logs = []
    for machine, until in enumerate(steps):
        home = tmp_path / f"machine-{machine}"  # the machine's own (empty) disk: no local cache to fall back on
        env = trainer_env(checkpoints, tmp_path / "entries.jsonl", home / "unused", HOME=str(home))
        del env["RESPAWN_COMPILE_CACHE"]  # the default: next to the checkpoints
        env["JAX_LOG_COMPILES"] = "1"
        proc = subprocess.run(
            [sys.executable, *program, until], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not (home / ".cache").exists()
        logs.append(proc.stderr)

    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    cached = [b.name for b in client.list_blobs(bucket, prefix=f"runs/cache-{name}-compile-cache/")]
    first, last = logs[0], logs[-1]
    assert "Compiling jit(train_step)" in first and "Persistent compilation cache hit" not in first
    if reused:
        assert any("/jit_train_step-" in blob for blob in cached), cached  # JAX's own entry, written by process 0
        assert reused in last
    else:  # stored by respawn_trainer, compiled outside JAX's cache
        assert any("/respawn-programs/p0/" in blob for blob in cached), cached
        assert "train_step" not in last.split("started at step")[0]  # neither traced nor compiled


@pytest.mark.emulator
def test_a_process_joining_another_world_lists_the_steps_written_since_by_another(
    fake_gcs: FakeGcs, bucket: str
) -> None:
    """gcsfs keeps a listing until its own write changes it: another process's commit stays unseen in this one, the
    step a process joining a new world in place would miss (run.Run.reform), until forget_listings()."""
    import fsspec

    from respawn_trainer.checkpoint import forget_listings

    fs = fsspec.filesystem("gs", finalize_on_close=True)  # the filesystem Orbax's gs:// paths go through
    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    client.bucket(bucket).blob("runs/listed/28/commit_success.txt").upload_from_string("")
    assert fs.ls(f"{bucket}/runs/listed", detail=False) == [f"{bucket}/runs/listed/28"]
    client.bucket(bucket).blob("runs/listed/114/commit_success.txt").upload_from_string("")  # another process's
    assert fs.ls(f"{bucket}/runs/listed", detail=False) == [f"{bucket}/runs/listed/28"]
    forget_listings()
    assert sorted(fs.ls(f"{bucket}/runs/listed", detail=False)) == [
        f"{bucket}/runs/listed/114",
        f"{bucket}/runs/listed/28",
    ]
