"""A 4-host slice on loopback: 4 trainer processes x 2 CPU devices under jax.distributed (gloo collectives),
parameters and optimizer state sharded over the 8 devices, checkpoints on fake-gcs-server.

Each worker gets the environment of a TPU VM worker (respawn_trainer.slice_env); worker 0 hosts JAX's coordinator and
alone writes lifecycle entries (the others get a sink file of their own, which must stay empty). The final hash
of a 4-host run is compared with that of an uninterrupted 4-host run of the same arguments, H4.
"""

from __future__ import annotations

import itertools
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from trainer_harness import (
    EntryClock,
    Slice,
    assert_no_step_redone_after_stops,
    entries,
    last,
    run_slice_to_end,
    start_slice,
    trainer_env,
    worker_sink,
)

from localcloud.services.emulators import FakeGcs

HOSTS, DEVICES = 4, 2
STEPS = 30
SLICE_ARGS = ["--model=nano", f"--steps={STEPS}", "--seed=7", "--checkpoint-every=10", "--log-every=1"]
GRACE_S = 20.0
HEARTBEAT_S = 6  # RESPAWN_HEARTBEAT_TIMEOUT_S of the tests that take a worker away
STOPPED = re.compile(r"stopped at step (\d+), saved")


@dataclass(frozen=True)
class SliceReference:
    params_sha256: str  # H4
    hashes: list[str | None]  # as each process logged it
    sink: Path
    clock: list[tuple[float, dict]]  # worker 0's entries with the moment each appeared


def committed_on_gcs(bucket: str, prefix: str) -> list[int]:
    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    names = [b.name[len(prefix) :] for b in client.list_blobs(bucket, prefix=prefix)]
    return sorted(int(n.split("/")[0]) for n in names if re.fullmatch(r"\d+/commit_success\.txt", n))


def assert_only_worker_0_wrote_entries(sink: Path) -> None:
    for worker in range(1, HOSTS):
        assert entries(worker_sink(sink, worker)) == [], f"worker {worker} wrote lifecycle entries"


def stopped_steps(run: Slice) -> list[int]:
    """The step at which each process says it stopped."""
    found = [STOPPED.findall("".join(r.stderr)) for r in run.runs]
    return [int(f[-1]) if f else -1 for f in found]


@pytest.fixture(scope="module")
def slice_bucket(fake_gcs: FakeGcs) -> str:
    name = f"slice-{uuid.uuid4().hex[:12]}"
    fake_gcs.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def slice_reference(
    slice_bucket: str, tmp_path_factory: pytest.TempPathFactory, compile_cache: Path
) -> Iterator[SliceReference]:
    """The uninterrupted 4-host run (progress entries every second, to check their rate)."""
    root = tmp_path_factory.mktemp("slice-reference")
    sink = root / "entries.jsonl"
    env = trainer_env(f"gs://{slice_bucket}/reference", sink, compile_cache, RESPAWN_PROGRESS_S="1")
    clock = EntryClock(sink)
    codes, run = run_slice_to_end(env, HOSTS, DEVICES, SLICE_ARGS)
    seen = clock.stop()
    assert codes == [0] * HOSTS, run.tail()
    yield SliceReference(last(sink, "completed")["params_sha256"], run.hashes(), sink, seen)


@pytest.mark.emulator
@pytest.mark.slow
def test_every_process_computes_the_same_hash_of_the_global_parameters(slice_reference: SliceReference) -> None:
    assert slice_reference.hashes == [slice_reference.params_sha256] * HOSTS
    completed = last(slice_reference.sink, "completed")
    assert completed["step"] == STEPS
    assert_only_worker_0_wrote_entries(slice_reference.sink)


@pytest.mark.emulator
@pytest.mark.slow
def test_progress_entries_come_from_process_0_at_the_configured_rate(slice_reference: SliceReference) -> None:
    seen = slice_reference.clock
    started = next(t for t, e in seen if e["event"] == "started")
    completed = next(t for t, e in seen if e["event"] == "completed")
    progress = [(t, e) for t, e in seen if e["event"] == "progress"]
    assert all(set(e) == {"event", "job_id", "attempt", "step", "loss", "worker"} for _, e in progress)
    assert all(e["worker"] == 0 and e["job_id"] == "job-test" and e["loss"] > 0 for _, e in progress)
    steps = [e["step"] for _, e in progress]
    assert steps == sorted(set(steps)) and steps[0] > 0 and steps[-1] <= STEPS
    # At most one a second (the file is polled every 20 ms), and at the first step boundary after each second:
    # never later than a second plus a step or two (the mean step time stands in for the step in progress) and
    # the save that step may have made (training is blocked meanwhile; the first save blocks longest).
    times = [started] + [t for t, _ in progress]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    training_s = completed - started
    step_s = training_s / STEPS
    save_s = max(e["blocking_s"] for _, e in seen if e["event"] == "checkpoint")
    assert min(gaps) > 0.9, gaps
    assert max(gaps) < 1.0 + 2 * step_s + save_s + 0.5, (gaps, step_s, save_s)
    assert len(progress) >= training_s / (1.0 + 2 * step_s + save_s + 0.5) - 1, (len(progress), training_s, step_s)
    assert_only_worker_0_wrote_entries(slice_reference.sink)


@pytest.mark.emulator
@pytest.mark.slow
def test_sigterm_stops_every_process_at_the_same_step_and_resumes_exactly(
    slice_bucket: str, slice_reference: SliceReference, tmp_path: Path, compile_cache: Path
) -> None:
    """Round 1: SIGTERM to all 4 (a preempted slice). Round 2: SIGTERM to worker 2 only: the notice is agreed."""
    sink = tmp_path / "entries.jsonl"
    prefix = f"sigterm-{uuid.uuid4().hex[:8]}/"
    env = trainer_env(f"gs://{slice_bucket}/{prefix}", sink, compile_cache, RESPAWN_GRACE_S=str(GRACE_S))
    for target, workers in ((6, None), (17, [2])):
        run = start_slice(env, HOSTS, DEVICES, SLICE_ARGS)
        reached = run.wait_step(target)
        assert reached >= target, run.tail()
        sent = run.signal(signal.SIGTERM, workers)
        codes = run.finish()
        took = time.monotonic() - sent
        assert codes == [0] * HOSTS, run.tail()
        assert took < GRACE_S, f"exit {took:.1f}s after SIGTERM"
        stopped = last(sink, "stopped")
        assert stopped["reason"] == "preempted" and stopped["step"] >= reached
        assert stopped_steps(run) == [stopped["step"]] * HOSTS, run.tail()
        assert stopped["step"] in committed_on_gcs(slice_bucket, prefix)
    codes, run = run_slice_to_end(env, HOSTS, DEVICES, SLICE_ARGS)
    assert codes == [0] * HOSTS, run.tail()
    assert run.hashes() == [slice_reference.params_sha256] * HOSTS
    assert last(sink, "completed")["params_sha256"] == slice_reference.params_sha256
    assert_no_step_redone_after_stops(sink)
    assert_only_worker_0_wrote_entries(sink)


@pytest.mark.emulator
@pytest.mark.slow
def test_sigkill_of_one_worker_brings_the_others_down_and_the_restart_resumes_exactly(
    slice_bucket: str, slice_reference: SliceReference, tmp_path: Path, compile_cache: Path
) -> None:
    """SIGKILL worker 2 (a dead host): the others exit on their own, non-zero (gloo's connection reset for its
    neighbours in the collective, JAX's heartbeat timeout for the rest); the launcher kills whatever is left.
    The restarted slice restores the newest committed step and ends with H4."""
    sink = tmp_path / "entries.jsonl"
    prefix = f"sigkill-{uuid.uuid4().hex[:8]}/"
    env = trainer_env(
        f"gs://{slice_bucket}/{prefix}", sink, compile_cache, RESPAWN_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_S)
    )
    run = start_slice(env, HOSTS, DEVICES, SLICE_ARGS)
    reached = run.wait_step(22)  # the save of step 20 waited for step 10's commit: 10 is durable
    assert reached >= 22, run.tail()
    killed = run.signal(signal.SIGKILL, [2])
    codes = run.finish(timeout=HEARTBEAT_S + 30)
    took = time.monotonic() - killed
    assert all(code != 0 for code in codes), run.tail()
    assert took < HEARTBEAT_S + 30
    run.kill_all()  # nothing left: every worker is gone
    durable = committed_on_gcs(slice_bucket, prefix)
    assert 10 in durable and max(durable) <= reached, durable

    codes, run = run_slice_to_end(env, HOSTS, DEVICES, SLICE_ARGS)
    assert codes == [0] * HOSTS, run.tail()
    assert last(sink, "started")["restored_step"] == max(durable)
    assert run.hashes() == [slice_reference.params_sha256] * HOSTS
    assert last(sink, "completed")["params_sha256"] == slice_reference.params_sha256


@pytest.mark.slow
def test_a_hung_worker_makes_the_others_exit_after_the_heartbeat_timeout(tmp_path: Path, compile_cache: Path) -> None:
    """SIGSTOP (hung, not dead): the others block in the step's collective until JAX's coordination service
    misses the worker's heartbeats for RESPAWN_HEARTBEAT_TIMEOUT_S, then abort (SIGABRT) instead of waiting forever."""
    hosts, heartbeat = 2, HEARTBEAT_S
    env = trainer_env(
        str(tmp_path / "ckpt"), tmp_path / "entries.jsonl", compile_cache, RESPAWN_HEARTBEAT_TIMEOUT_S=str(heartbeat)
    )
    args = [a for a in SLICE_ARGS if not a.startswith("--steps")] + ["--steps=100000"]
    run = start_slice(env, hosts, DEVICES, args)
    try:
        assert run.wait_step(5) >= 5, run.tail()
        stopped = run.signal(signal.SIGSTOP, [1])
        code = run.lead.finish(timeout=heartbeat + 30)
        took = time.monotonic() - stopped
        assert code != 0, run.tail()
        assert took < heartbeat + 30, took
        assert "stopped sending heartbeats" in run.lead.tail(200), run.tail()
    finally:
        run.signal(signal.SIGCONT, [1])
        run.kill_all()


@pytest.mark.emulator
@pytest.mark.slow
def test_a_step_no_host_can_read_is_skipped_by_all(
    slice_bucket: str, slice_reference: SliceReference, tmp_path: Path, compile_cache: Path
) -> None:
    """A copy of the reference's checkpoints whose newest step has garbage metadata (read by every host): every
    host falls back to the previous step together, retrains from there and ends with H4. (A step only some
    hosts cannot read fails the attempt instead: the others wait in Orbax's barrier after the read, and the
    failed host gives up on them.)"""
    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    bucket = client.bucket(slice_bucket)
    prefix = f"unreadable-{uuid.uuid4().hex[:8]}/"
    for blob in client.list_blobs(slice_bucket, prefix="reference/"):
        bucket.copy_blob(blob, bucket, prefix + blob.name.removeprefix("reference/"))
    steps = committed_on_gcs(slice_bucket, prefix)
    assert steps[-2:] == [STEPS - 10, STEPS], steps
    bucket.blob(f"{prefix}{STEPS}/default/_METADATA").upload_from_string(b"\x00garbage" * 7)

    sink = tmp_path / "entries.jsonl"
    codes, run = run_slice_to_end(
        trainer_env(f"gs://{slice_bucket}/{prefix}", sink, compile_cache), HOSTS, DEVICES, SLICE_ARGS
    )
    assert codes == [0] * HOSTS, run.tail()
    assert all(f"checkpoint step {STEPS} cannot be read" in r.tail(300) for r in run.runs), run.tail()
    assert last(sink, "started")["restored_step"] == STEPS - 10
    assert run.hashes() == [slice_reference.params_sha256] * HOSTS
