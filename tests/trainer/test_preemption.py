"""The metadata server's preemption notice, and the light `--model=none` mode, through real processes."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import MetadataServer, Reference, entries, last, run_to_end, start, trainer_env


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.server.shutdown()


@pytest.mark.slow
def test_metadata_notice_saves_exits_zero_and_resumes_without_redoing_a_step(
    tmp_path: Path, compile_cache: Path, reference: Reference, metadata: MetadataServer
) -> None:
    sink, ckpt = tmp_path / "entries.jsonl", tmp_path / "ckpt"
    env = trainer_env(str(ckpt), sink, compile_cache, RESPAWN_METADATA_URL=metadata.url)
    run = start(env)
    reached = run.wait_step(15)
    metadata.preempted = True
    noticed = time.monotonic()
    code = run.finish()
    assert code == 0, run.tail()
    assert time.monotonic() - noticed < 10.0
    stopped = last(sink, "stopped")
    assert stopped["reason"] == "preempted" and stopped["step"] >= reached
    assert "metadata instance/preempted" in run.tail(200)
    assert metadata.requests and all(r["flavor"] == "Google" for r in metadata.requests)

    metadata.preempted = False
    code, run = run_to_end(env)
    assert code == 0, run.tail()
    assert last(sink, "started")["restored_step"] == stopped["step"]
    assert last(sink, "completed")["params_sha256"] == reference.params_sha256


def test_none_model_sleeps_steps_and_resumes_after_sigterm(tmp_path: Path, compile_cache: Path) -> None:
    sink, ckpt = tmp_path / "entries.jsonl", tmp_path / "ckpt"
    env = trainer_env(str(ckpt), sink, compile_cache)
    args = ["--model=none", "--steps=40", "--step-time=0.02", "--checkpoint-every=5", "--log-every=1"]
    run = start(env, args)
    run.wait_step(12)
    run.signal(signal.SIGTERM)
    assert run.finish() == 0, run.tail()
    stopped = last(sink, "stopped")
    code, run = run_to_end(env, args)
    assert code == 0, run.tail()
    assert last(sink, "started")["restored_step"] == stopped["step"] >= 12
    completed = last(sink, "completed")
    assert completed["step"] == 40 and set(completed["goodput"]) == {
        "startup_s",
        "restore_s",
        "productive_s",
        "checkpoint_s",
        "input_s",
        "wasted_s",
        "total_s",
    }
    assert [e["event"] for e in entries(sink)].count("started") == 2
