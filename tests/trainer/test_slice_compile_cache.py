"""A slice restarted after a preemption: every process reads its train step's program from the persistent
compilation cache and compiles nothing (its first step comes from the cache), as a restart on a new machine would
with the cache next to the checkpoints."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from trainer_harness import last, run_slice_to_end, start_slice, trainer_env

from localcloud.readout.recovery_split import programs_written

HOSTS, DEVICES = 4, 2
ARGS = ["--model=nano", "--steps=12", "--seed=7", "--checkpoint-every=4", "--log-every=1"]


@pytest.mark.slow
def test_every_process_of_a_restarted_slice_reads_its_program_from_the_compilation_cache(tmp_path: Path) -> None:
    cache = tmp_path / "compile-cache"  # empty: the first start compiles, and each process stores its program
    sink = tmp_path / "entries.jsonl"
    env = trainer_env(str(tmp_path / "ckpt"), sink, cache, RESPAWN_GRACE_S="20")
    run = start_slice(env, HOSTS, DEVICES, ARGS)
    reached = run.wait_step(5)
    assert reached >= 5, run.tail()
    run.signal(signal.SIGTERM, None)  # the slice is preempted
    assert run.finish() == [0] * HOSTS, run.tail()
    compiled = programs_written(cache, 0.0, HOSTS)
    assert all(n >= 1 for n in compiled.values()), compiled  # every process compiled and stored its own programs
    stopped = last(sink, "stopped")["step"]

    restarted = time.time()
    codes, run = run_slice_to_end({**env, "RESPAWN_ATTEMPT": "2"}, HOSTS, DEVICES, ARGS)
    assert codes == [0] * HOSTS, run.tail()
    assert last(sink, "started")["restored_step"] == stopped
    assert programs_written(cache, restarted, HOSTS) == {f"p{i}": 0 for i in range(HOSTS)}  # read, not compiled
