"""Exact resumption: however a run is interrupted and restarted, its final parameters equal an uninterrupted run's.

Every test drives real `python -m trainer` processes with real signals.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from trainer_harness import (
    ARGS,
    Reference,
    assert_no_step_redone_after_stops,
    committed_steps,
    entries,
    kill_hard,
    last,
    run_to_end,
    saving,
    start,
    trainer_env,
)

GRACE_S = 10.0


def finish_and_check(env: dict[str, str], sink: Path, reference: Reference) -> None:
    code, run = run_to_end(env)
    assert code == 0, run.tail()
    assert last(sink, "completed")["params_sha256"] == reference.params_sha256


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_sigterm_at_random_steps_ends_with_the_reference_hash(
    seed: int, tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    rng = random.Random(seed)
    during_save = seed % 2 == 1  # odd seeds: saves are stretched so every notice lands in an async save
    extra = {"RESPAWN_TEST_SAVE_DELAY_S": "0.3"} if during_save else {}
    sink = tmp_path / "entries.jsonl"
    ckpt = tmp_path / "ckpt"
    env = trainer_env(str(ckpt), sink, compile_cache, RESPAWN_GRACE_S=str(GRACE_S), **extra)
    first = rng.randrange(3, 40)
    targets = [first, rng.randrange(first + 25, 95)] if rng.random() < 0.6 else [first]
    if during_save:
        targets = [10 * (t // 10) + rng.randint(1, 3) for t in targets]
    for target in targets:
        run = start(env)
        reached = run.wait_step(target)
        in_save = bool(saving(ckpt))
        sent = run.signal(signal.SIGTERM)
        code = run.finish()
        took = time.monotonic() - sent
        assert code == 0, run.tail()
        assert took < GRACE_S, f"exit {took:.1f}s after SIGTERM"
        stopped = last(sink, "stopped")
        assert stopped["reason"] == "preempted" and stopped["step"] >= reached
        assert stopped["step"] in committed_steps(ckpt)
        if during_save:
            assert in_save, "the notice was meant to land during an async save"
    finish_and_check(env, sink, reference)
    assert_no_step_redone_after_stops(sink)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_sigkill_without_notice_ends_with_the_reference_hash(
    seed: int, tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    rng = random.Random(seed)
    sink, ckpt = tmp_path / "entries.jsonl", tmp_path / "ckpt"
    env = trainer_env(str(ckpt), sink, compile_cache)
    durable: list[int] | None = None  # committed steps when the previous attempt was killed
    for target in sorted(rng.sample(range(5, 95), 2)):
        run = start(env)
        reached = run.wait_step(target)
        if durable is not None:  # the restart restored the newest complete checkpoint
            assert last(sink, "started")["restored_step"] == max(durable, default=0)
        kill_hard(run)
        durable = committed_steps(ckpt)
        assert max(durable, default=0) <= reached
    finish_and_check(env, sink, reference)
    assert last(sink, "started")["restored_step"] == max(durable or [0])


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_save_twenty_times(
    tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    """Each attempt commits one save and is killed inside the next; the restart restores the newest complete one."""
    rng = random.Random(20)
    sink, ckpt = tmp_path / "entries.jsonl", tmp_path / "ckpt"
    env = trainer_env(str(ckpt), sink, compile_cache, RESPAWN_TEST_SAVE_DELAY_S="0.5")
    args = [a for a in ARGS if not a.startswith("--checkpoint-every")] + ["--checkpoint-every=5"]
    restored = 0
    for _ in range(20):
        run = start(env, args)
        in_flight = _wait_for_save_of(ckpt, restored + 10, run)
        time.sleep(rng.uniform(0.0, 0.4))
        kill_hard(run)
        started = [e for e in entries(sink) if e["event"] == "started"][-1]
        assert started["restored_step"] == restored
        assert in_flight not in committed_steps(ckpt), "the kill was meant to land inside the save"
        restored = max(committed_steps(ckpt))
        assert restored == in_flight - 5
    code, run = run_to_end(env, args)
    assert code == 0, run.tail()
    assert [e for e in entries(sink) if e["event"] == "started"][-1]["restored_step"] == restored
    assert last(sink, "completed")["params_sha256"] == reference.params_sha256


def _wait_for_save_of(ckpt: Path, step: int, run, timeout: float = 120.0) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(name.split(".")[0]) for name in saving(ckpt)]
        if any(s >= step for s in steps):
            return max(steps)
        assert run.proc.poll() is None, run.tail()
        time.sleep(0.005)
    raise TimeoutError(f"no save of step {step} started:\n{run.tail()}")


@pytest.mark.slow
def test_unreadable_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference.checkpoints, ckpt)
    newest = max(committed_steps(ckpt))
    for path in (ckpt / str(newest)).rglob("*"):
        if path.is_file():
            path.write_bytes(b"\x00garbage" * 7)
    sink = tmp_path / "entries.jsonl"
    code, run = run_to_end(trainer_env(str(ckpt), sink, compile_cache))
    assert code == 0, run.tail()
    assert f"checkpoint step {newest} cannot be read" in run.tail(200)
    previous = max(s for s in committed_steps(reference.checkpoints) if s < newest)
    assert last(sink, "started")["restored_step"] == previous
    assert last(sink, "completed")["params_sha256"] == reference.params_sha256


@pytest.mark.slow
def test_no_readable_checkpoint_fails_instead_of_starting_over(
    tmp_path: Path, compile_cache: Path, reference: Reference
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference.checkpoints, ckpt)
    steps = committed_steps(ckpt)
    for path in ckpt.rglob("*"):
        if path.is_file() and path.parent != ckpt:
            path.write_bytes(b"\x00garbage")
    sink = tmp_path / "entries.jsonl"
    code, run = run_to_end(trainer_env(str(ckpt), sink, compile_cache))
    assert code == 1, run.tail()
    assert "no checkpoint can be read" in last(sink, "failed")["error"]
    assert committed_steps(ckpt) == steps  # nothing was deleted
