"""The trainer's pure pieces: data, schedule, goodput, lifecycle sinks, fingerprint, the preemption watch."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import MetadataServer

from respawn_trainer.goodput import Goodput
from respawn_trainer.lifecycle import CloudLoggingSink, FileSink, Lifecycle
from respawn_trainer.notice import PreemptionWatch
from respawn_trainer.schedule import SaveSchedule, interval_steps, save_policy, young_daly_s
from trainer import data

# Pinned: a changed corpus or batch function would silently break resumption of runs already under way.
CORPUS_SHA256 = "831d34845d96eafd59b1e7af0d799b2281a6c021d23fd6ef3c65b62be40da98f"
PINNED_BATCH = b"2 is 76. my sister sees t"


def test_batches_are_a_pure_function_of_seed_and_step() -> None:
    a = data.batch(seed=3, step=17, batch_size=4, seq_len=16)
    assert a.shape == (4, 17) and a.dtype == np.int32
    assert np.array_equal(a, data.batch(3, 17, 4, 16))
    assert not np.array_equal(a, data.batch(3, 18, 4, 16))
    assert not np.array_equal(a, data.batch(4, 17, 4, 16))
    assert a.min() >= 0 and a.max() < data.VOCAB


def test_corpus_and_batches_are_pinned() -> None:
    corpus = data.corpus()
    assert len(corpus) == data.CORPUS_BYTES
    assert hashlib.sha256(corpus.tobytes()).hexdigest() == CORPUS_SHA256
    first = bytes(data.batch(0, 1, 1, 24)[0].astype(np.uint8))
    assert first == PINNED_BATCH


def test_young_daly_interval() -> None:
    assert young_daly_s(save_cost_s=2.0, mtbi_s=3600.0) == pytest.approx(120.0)
    assert interval_steps(tau_s=120.0, step_s=0.5) == 240
    assert interval_steps(tau_s=0.01, step_s=1.0) == 1


def test_fixed_schedule_saves_on_multiples() -> None:
    schedule = SaveSchedule(save_policy(10, mtbi_s=3600.0), final_step=1000, restored_step=23)
    assert [s for s in range(24, 52) if schedule.should_save(s)] == [30, 40, 50]
    assert not any(schedule.wants_step_time(s) for s in range(24, 52)) and schedule.interval() is None


def test_auto_schedule_measures_then_saves_every_tau() -> None:
    schedule = SaveSchedule(save_policy(None, mtbi_s=100.0), final_step=1000, restored_step=40)
    assert schedule.should_save(41)  # the attempt's first step measures the save cost
    schedule = schedule.saved(41, blocking_s=0.5)
    assert not schedule.should_save(42) and not schedule.wants_step_time(42)
    assert schedule.wants_step_time(46)
    schedule = schedule.measured(step_s=0.1)
    young_daly = schedule.young_daly
    assert young_daly is not None and young_daly.tau_s(schedule.context()) == pytest.approx(10.0)
    assert schedule.interval() == 100
    assert not schedule.should_save(140) and schedule.should_save(141)
    schedule = schedule.saved(141, blocking_s=1.5)  # a costlier save: mean cost 1.0 s, tau sqrt(200) s
    assert schedule.interval() == round(200**0.5 / 0.1)


def test_the_final_step_is_saved_once_when_the_loop_ends_never_on_schedule() -> None:
    for every in (10, None):
        schedule = SaveSchedule(save_policy(every, mtbi_s=100.0), final_step=30, restored_step=20)
        assert not schedule.should_save(30)  # step_done of the last step: finish() saves it
        assert schedule.should_save(30, loop_ended=True)
        assert schedule.should_save(25, loop_ended=True)  # the notice, between two saves
        assert not schedule.should_save(20, loop_ended=True)  # the restored step is durable already
        assert not schedule.saved(25, 0.1).should_save(25, loop_ended=True)  # saved by step_done already


def test_goodput_moves_unsaved_steps_to_wasted_only_when_lost() -> None:
    goodput = Goodput(started=0.0, startup_s=3.0, restore_s=1.0)
    goodput.steps(5.0)
    goodput.saved(blocking_s=0.5)
    goodput.steps(2.0)
    assert goodput.summary(now=12.0) == {
        "startup_s": 3.0,
        "restore_s": 1.0,
        "productive_s": 7.0,
        "checkpoint_s": 0.5,
        "input_s": 0.0,
        "wasted_s": 0.0,
        "total_s": 12.0,
    }
    lost = goodput.summary(lost=True, now=12.0)
    assert (lost["productive_s"], lost["wasted_s"]) == (5.0, 2.0)


def test_the_wait_for_input_is_input_not_training() -> None:
    goodput = Goodput(started=0.0)
    goodput.waited_for_input(0.25)
    goodput.steps(1.0)  # the step's wall time, its wait for the batch included
    goodput.steps(1.0)
    split = goodput.summary(now=3.0)
    assert (split["input_s"], split["productive_s"]) == (0.25, 1.75)


class CountingIterator:
    """Any iterator with get_state/set_state: a counter whose state is `state_type` (Grain's DataLoader gives
    bytes, its DatasetIterator a dict)."""

    def __init__(self, state_type: type) -> None:
        self.n, self.state_type = 0, state_type

    def __next__(self) -> int:
        self.n += 1
        return self.n

    def get_state(self) -> object:
        return json.dumps({"n": self.n}).encode() if self.state_type is bytes else {"n": self.n}

    def set_state(self, state: object) -> None:
        assert isinstance(state, self.state_type)
        self.n = json.loads(state)["n"] if isinstance(state, bytes) else state["n"]  # type: ignore[index]


@pytest.mark.parametrize("state_type", [dict, bytes])
def test_a_data_iterators_state_is_saved_in_the_step_and_restored_with_it(tmp_path: Path, state_type: type) -> None:
    import jax.numpy as jnp

    from respawn_trainer.checkpoint import Checkpoints, abstract

    state = {"w": jnp.arange(6, dtype=jnp.float32)}
    saving, data = Checkpoints(str(tmp_path), 3), CountingIterator(state_type)
    saving.follow(data)
    for step in (1, 2):
        next(data), next(data)
        saving.save(step, state)
        saving.wait()
    next(data)  # read after the last save: not in it
    assert json.loads((tmp_path / "2" / "data" / "process_0-of-1.json").read_text()) == {"n": 4}
    saving.close()

    restoring, fresh = Checkpoints(str(tmp_path), 3), CountingIterator(state_type)
    restoring.follow(fresh)
    restored = restoring.restore_newest(abstract(state))
    assert restored is not None and restored[1] == 2 and fresh.n == 4
    assert (np.asarray(restored[0]["w"]) == np.arange(6)).all()
    with pytest.raises(TypeError, match="data: list has no get_state"):
        restoring.follow([])


class StreamPosition(CountingIterator):
    """A counter whose state is one position, the same on every process."""

    state_is_global = True


@pytest.mark.parametrize("iterator", [CountingIterator, StreamPosition])
def test_a_data_state_saved_by_2_processes_restores_on_1_only_when_it_is_global(
    tmp_path: Path, iterator: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fallback tier of another host count: a step whose data state was saved by process 0 of 2. A per-process
    state has no file for process 0 of 1, so no step is readable (and the error says why); a global one, saved once,
    restores on 1 process."""
    import jax.numpy as jnp

    from respawn_trainer import checkpoint
    from respawn_trainer.checkpoint import Checkpoints, abstract

    state = {"w": jnp.arange(6, dtype=jnp.float32)}
    saving, data = Checkpoints(str(tmp_path), 3), iterator(dict)
    saving.follow(data)
    with monkeypatch.context() as saved_by_2:
        saved_by_2.setattr(checkpoint, "_process_file", lambda: "process_0-of-2.json")
        next(data), next(data), next(data)
        saving.save(1, state)
        saving.wait()
    saving.close()
    files = sorted(p.name for p in (tmp_path / "1" / "data").glob("*.json"))
    assert files == (["global.json"] if iterator is StreamPosition else ["process_0-of-2.json"])

    restoring, fresh = Checkpoints(str(tmp_path), 3), iterator(dict)
    restoring.follow(fresh)
    if iterator is StreamPosition:
        restored = restoring.restore_newest(abstract(state))
        assert restored is not None and restored[1] == 1 and fresh.n == 3
    else:
        with pytest.raises(RuntimeError, match=r"no checkpoint can be read \(steps \[1\]\)"):
            restoring.restore_newest(abstract(state))


def test_file_sink_appends_one_json_line_per_entry(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "entries.jsonl"
    lifecycle = Lifecycle(FileSink(str(path)), "job-a", 3)
    lifecycle.emit("started", 0, restored_step=0, startup_s=1.5)
    lifecycle.emit("checkpoint", 10, blocking_s=0.01, total_s=0.2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {
        "event": "started",
        "job_id": "job-a",
        "attempt": 3,
        "step": 0,
        "restored_step": 0,
        "startup_s": 1.5,
    }
    assert lines[1]["event"] == "checkpoint" and lines[1]["step"] == 10


def test_cloud_sink_writes_structured_entries_with_job_and_attempt_labels() -> None:
    """Cloud Logging's REST entries:write, authorized by the metadata server's token (both served locally)."""
    api = MetadataServer(
        {
            "instance/service-accounts/default/token": '{"access_token": "tok-1", "expires_in": 3599}',
            "project/project-id": "proj-1",
            "instance/id": "4242",
            "instance/zone": "projects/123/zones/us-central2-b",
        }
    )
    try:
        lifecycle = Lifecycle(
            CloudLoggingSink("job-a", 2, metadata_url=api.url, endpoint=api.root + "/write"), "job-a", 2
        )
        lifecycle.emit("started", 0, restored_step=0, startup_s=1.0)
        lifecycle.emit("failed", 7, error="boom", goodput={})
    finally:
        api.server.shutdown()
    (first,), (second,) = (body["entries"] for _, _, body in api.posts)
    assert second["jsonPayload"] == {
        "event": "failed",
        "job_id": "job-a",
        "attempt": 2,
        "step": 7,
        "error": "boom",
        "goodput": {},
    }
    assert first["jsonPayload"]["event"] == "started" and first["logName"] == "projects/proj-1/logs/respawn-trainer"
    assert first["resource"] == {
        "type": "gce_instance",
        "labels": {"project_id": "proj-1", "instance_id": "4242", "zone": "us-central2-b"},
    }
    assert first["labels"] == {"respawn-job": "job-a", "respawn-attempt": "2"}
    assert (first["severity"], second["severity"]) == ("INFO", "ERROR")
    assert [(path, auth) for path, auth, _ in api.posts] == [("/write", "Bearer tok-1")] * 2  # one token, reused
    tokens = [r for r in api.requests if r["path"].endswith("/token")]
    assert len(tokens) == 1


def test_a_failing_sink_does_not_stop_training() -> None:
    class BrokenSink:
        def write(self, payload: dict) -> None:
            raise OSError("disk full")

    assert Lifecycle(BrokenSink(), "job-a", 1).emit("started", 0)["event"] == "started"


def test_params_fingerprint_is_bitwise() -> None:
    import jax  # noqa: F401  (state_sha256 hashes arrays when JAX is in use)

    from respawn_trainer import state_sha256 as params_sha256

    params = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": {"w": np.ones(4, np.float32)}}
    same = {"a": {"w": np.ones(4, np.float32)}, "b": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert params_sha256(params) == params_sha256(same)
    flipped = {"a": {"w": np.ones(4, np.float32)}, "b": params["b"].copy()}
    flipped["b"].view(np.uint32)[0, 0] ^= 1
    assert params_sha256(params) != params_sha256(flipped)


def test_fsdp_splits_each_large_leaf_on_its_first_axis_the_device_count_divides() -> None:
    from jax.sharding import PartitionSpec as P

    from trainer.sharding import fsdp_spec

    assert fsdp_spec((256, 32), 8) == P("data")
    assert fsdp_spec((1, 64, 128), 8) == P(None, "data")
    assert fsdp_spec((3, 5, 4096), 8) == P(None, None, "data")
    assert fsdp_spec((257, 257), 8) == P()  # no axis splits evenly
    assert fsdp_spec((32, 96), 8) == P()  # small: a collective per step costs more than its memory
    assert fsdp_spec((1, 32, 128), 8) == P()  # 4096 elements, 16 KiB: still small
    assert fsdp_spec((), 8) == P()
    assert fsdp_spec((256, 32), 1) == P()  # one device: nothing to split


def test_watch_notices_the_metadata_server_and_sigterm() -> None:
    server = MetadataServer()
    previous = signal.getsignal(signal.SIGTERM)
    watch = PreemptionWatch(server.url, poll_s=0.05).start()
    try:
        time.sleep(0.2)
        assert not watch.noticed and server.requests
        server.preempted = True
        deadline = time.monotonic() + 5
        while not watch.noticed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.source == "metadata instance/preempted"
        signal.raise_signal(signal.SIGTERM)  # a second notice changes nothing
        assert watch.source == "metadata instance/preempted"
    finally:
        watch.stop()
        signal.signal(signal.SIGTERM, previous)
        server.server.shutdown()
    sigterm = PreemptionWatch(None).start()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert sigterm.source == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_handover_trains_on_whichever_notice_comes_first_and_a_second_sigterm_does_not_cut_it_short() -> None:
    """A VM's docker daemon and its shutdown script each stop the container, in parallel: two SIGTERMs, and the
    metadata flag comes with the soft off. The handover's train-on holds through all of them; the successor's
    readiness (a later notice()) still ends it."""
    server = MetadataServer()
    previous = signal.getsignal(signal.SIGTERM)
    for first in ("SIGTERM", "metadata instance/preempted"):
        server.preempted = False
        watch = PreemptionWatch(server.url, poll_s=0.05, train_on=lambda w: 30.0).start()
        try:
            if first == "SIGTERM":
                signal.raise_signal(signal.SIGTERM)
            else:
                server.preempted = True
                deadline = time.monotonic() + 5
                while watch.noticed_at is None and time.monotonic() < deadline:
                    time.sleep(0.02)
            assert watch.source == first and watch.training_on and not watch.noticed
            server.preempted = True
            signal.raise_signal(signal.SIGTERM)  # the other stop
            time.sleep(0.2)
            assert watch.source == first and not watch.noticed  # still training on
            watch.notice("the next machine is ready")
            assert watch.noticed
        finally:
            watch.stop()
            signal.signal(signal.SIGTERM, previous)
    server.server.shutdown()


def test_with_a_longer_notice_the_metadata_flag_counts_that_much_later_and_sigterm_at_once() -> None:
    """RESPAWN_NOTICE_LEAD_S: the flag comes that long before the soft off, so the trainer trains on until then;
    the soft off's SIGTERM (the shutdown script's docker stop) is the notice whenever it comes."""
    server = MetadataServer()
    previous = signal.getsignal(signal.SIGTERM)
    for lead, sigterm in ((0.6, False), (30.0, True)):
        server.preempted = False
        watch = PreemptionWatch(server.url, poll_s=0.05, lead_s=lead).start()
        try:
            server.preempted = True
            deadline = time.monotonic() + 5
            while watch.noticed_at is None and time.monotonic() < deadline:
                time.sleep(0.02)
            flagged = time.monotonic()
            assert watch.noticed_at is not None and not watch.noticed  # due, not yet come
            if sigterm:
                signal.raise_signal(signal.SIGTERM)
                assert watch.noticed and watch.source == "SIGTERM"
            else:
                while not watch.noticed and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert watch.noticed and time.monotonic() - flagged >= lead - 0.1
                assert watch.source == "metadata instance/preempted"
        finally:
            watch.stop()
            signal.signal(signal.SIGTERM, previous)
    server.server.shutdown()


def test_a_stopped_run_leaves_old_step_deletions_to_the_next_attempt_a_completed_one_waits(tmp_path: Path) -> None:
    """And a run that stops short of its steps (the notice, its own host's or a slice peer's) leaves the startup
    script's notice file, so that its exit 0 is read as `stopped`; a completed one leaves none."""
    from respawn_trainer import Run
    from respawn_trainer.schedule import SaveDone

    class Recorded:
        """An in-memory checkpointer that records whether the run closed it (closing waits for deletions)."""

        def __init__(self) -> None:
            self.saved: list[int] = []
            self.closed = False

        def restore_newest(self, template: object, agree_any: object) -> None:
            return None

        def save(self, step: int, state: object) -> float:
            self.saved.append(step)
            return 0.0

        def poll(self) -> list[SaveDone]:
            return []

        def wait(self) -> list[SaveDone]:
            return [SaveDone(self.saved[-1], 0.0, 0.0)] if self.saved else []

        def close(self) -> None:
            self.closed = True

    env = {"RESPAWN_JOB_ID": "j", "RESPAWN_CHECKPOINT_URI": str(tmp_path), "RESPAWN_LOG_SINK": str(tmp_path / "e")}
    for steps, event in ((5, "stopped"), (3, "completed")):
        notice = tmp_path / event / "notice"  # its directory made by whoever leaves it
        env["RESPAWN_NOTICE_FILE"] = str(notice)
        checkpoints = Recorded()
        run = Run(steps, checkpoint_every=100, checkpointer=checkpoints, env=env, use_jax=False)
        state, step = run.restore({"step": 0})
        for step in range(1, 4):
            state = {"step": step}
            run.step_done(step, state)
        assert run.finish(step, state) == event
        assert checkpoints.saved == [3]  # the last save, either way
        assert checkpoints.closed == (event == "completed"), event
        assert notice.exists() == (event == "stopped"), event


STORED_AFTER_JAX_CACHE = """
import sys, jax, jax.numpy as jnp
from respawn_trainer import runtime
runtime.use_compile_cache(sys.argv[1])
f = jax.jit(lambda x, w: (jnp.tanh(x @ w) * 2 + jnp.where(x > 0, x, -x)).sum())
args = (jax.ShapeDtypeStruct((8, 8), jnp.float32),) * 2
x, w = jnp.ones((8, 8)), jnp.full((8, 8), 0.5)
expected = float(f.lower(*args).compile()(x, w))  # JAX's cache now holds the program
jax.clear_caches()
runtime.compiled(f, *args, key="edited")  # a new key for the same program: not stored yet, so built and stored
stored = runtime.compiled(f, *args, key="edited")  # read back from the stored copy, as a restart would
print(float(stored(x, w)) == expected)
"""


def test_a_program_stored_under_a_new_key_runs_when_jax_cache_already_held_it(tmp_path: Path) -> None:
    """An edit that changes compiled()'s key but not the program: JAX's cache has it, the stored copy must run
    (an executable read from JAX's cache, serialized again, has lost its code on CPU)."""
    proc = subprocess.run(
        [sys.executable, "-c", STORED_AFTER_JAX_CACHE, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True"]
    assert list((tmp_path / "cache").glob("*/respawn-programs/p0/*")), "nothing was stored"


STORED_LOADS_IN_BACKGROUND = """
import importlib.abc, sys, threading, jax, jax.numpy as jnp
from respawn_trainer import runtime
runtime.use_compile_cache(sys.argv[1])
f = jax.jit(lambda x: jnp.sin(x) * 2)
args = (jax.ShapeDtypeStruct((4,), jnp.float32),)
x = jnp.arange(4.0)
readers, imported = [], []
read = runtime._ProgramStore.read
runtime._ProgramStore.read = lambda store: readers.append(threading.current_thread().name) or read(store)

class Imports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if threading.current_thread() is not threading.main_thread():
            imported.append(name)

sys.meta_path.insert(0, Imports())
built = runtime.compiled(f, *args, key="k")  # nothing stored yet: built on first need, on this thread
runtime.programs_ready()
stored = runtime.compiled(f, *args, key="k")
runtime.programs_ready()
print(readers == ["program-load", "program-load"], imported == [], float(stored(x).sum()) == float(f(x).sum()))
"""


def test_a_stored_program_loads_on_a_background_thread_that_imports_nothing(tmp_path: Path) -> None:
    """The load overlaps the caller's imports (orbax); a thread importing beside them could deadlock on the
    import locks, so everything it needs is imported before it starts."""
    proc = subprocess.run(
        [sys.executable, "-c", STORED_LOADS_IN_BACKGROUND, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "True"]


def test_checkpoints_import_orbax_only_when_first_used(tmp_path: Path) -> None:
    """A restart's compiled program loads while orbax imports: Run() must not import it."""
    code = (
        "import sys; from respawn_trainer.checkpoint import Checkpoints; "
        f"c = Checkpoints({str(tmp_path)!r}, 3); print('orbax' in sys.modules); "
        "c.restore_newest(None); print('orbax' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]


def test_the_garbage_collector_is_paused_from_run_to_the_end_of_restore(tmp_path: Path) -> None:
    """The start's imports allocate objects that live as long as the process: collecting them again and again
    is wasted start time; after the start they are frozen, so later collections skip them."""
    import gc

    from respawn_trainer import Run

    class Empty:
        def restore_newest(self, template: object, agree_any: object) -> None:
            return None

    env = {"RESPAWN_JOB_ID": "j", "RESPAWN_CHECKPOINT_URI": str(tmp_path), "RESPAWN_LOG_SINK": str(tmp_path / "e")}
    assert gc.isenabled()
    run = Run(3, checkpointer=Empty(), env=env, use_jax=False)
    try:
        assert not gc.isenabled()
        run.restore({"step": 0})
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
        run.watch.stop()


def test_a_machine_whose_accelerator_jax_cannot_see_fails_at_once_unless_cpus_stand_in_for_it() -> None:
    from respawn import machine
    from respawn_trainer import PERMANENT_RC, ConfigError
    from respawn_trainer.env import load_env
    from respawn_trainer.runtime import WrongDevices, check_devices
    from trainer.main import exit_code

    check_devices(load_env({}))  # no accelerator asked for: whatever JAX finds
    check_devices(load_env({"RESPAWN_ACCELERATOR": "tpu", "RESPAWN_DEVICES_STAND_IN": "cpu"}))  # the local cloud
    for kind, fix in (("tpu", "VARIANT=tpu"), ("gpu", "--gpus all")):
        with pytest.raises(WrongDevices, match=f"has a {kind.upper()} but JAX found only .* CPU device") as e:
            check_devices(load_env({"RESPAWN_ACCELERATOR": kind}))
        assert fix in str(e.value)
        assert exit_code(e.value) == PERMANENT_RC == machine.PERMANENT_RC  # the startup script's entry: permanent too
    assert (exit_code(ConfigError("--steps", "-1", "a positive integer")), exit_code(RuntimeError("x"))) == (2, 1)


CONFIGURED_FLAGS = """
import os, jax, jax.numpy as jnp
from respawn_trainer import runtime
from respawn_trainer.env import load_env
runtime.configure(load_env(dict(os.environ)))
print(float(jax.jit(lambda x: (x * 2).sum())(jnp.ones(4))))  # XLA accepted the flags
print(os.environ["XLA_FLAGS"])
"""


def configured_flags(accelerator: str, xla_flags: str) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags,
           "RESPAWN_ACCELERATOR": accelerator, "RESPAWN_DEVICES_STAND_IN": "cpu"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", CONFIGURED_FLAGS], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result, flags = proc.stdout.splitlines()
    assert result == "8.0"
    return flags.split()


@pytest.mark.parametrize("accelerator", ["gpu", "tpu"])
def test_a_gpu_machines_trainer_runs_xla_deterministically(accelerator: str) -> None:
    """On a GPU machine the trainer adds XLA's deterministic GPU ops (no autotuning either), so a restored run
    computes bit for bit what the lost one would have; a TPU's does not. Here a CPU stands in for the GPU, as in the
    local cloud: XLA knows the flag on every backend."""
    from respawn_trainer.runtime import CPU_DETERMINISM_FLAGS, GPU_DETERMINISM_FLAGS

    flags = configured_flags(accelerator, "--xla_force_host_platform_device_count=2")
    assert flags[:2] == ["--xla_force_host_platform_device_count=2", CPU_DETERMINISM_FLAGS]
    assert (GPU_DETERMINISM_FLAGS in flags) == (accelerator == "gpu")


def test_a_jobs_own_setting_of_the_gpu_flag_stands() -> None:
    """A model XLA has no deterministic implementation for (max pooling's gradient) turns it off in its `env`."""
    assert configured_flags("gpu", "--xla_gpu_deterministic_ops=false") == [
        "--xla_gpu_deterministic_ops=false",
        "--xla_cpu_multi_thread_eigen=false",
    ]
