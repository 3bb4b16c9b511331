"""A head start's handover between two trainers (respawn_trainer/handover.py): the noticed one trains on until its
successor is set up, then saves once; the successor restores exactly that save."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from trainer_harness import entries, last, start, trainer_env

from localcloud.services.emulators import FakeGcs
from respawn_trainer.env import load_env
from respawn_trainer.handover import EXITED, READY, Handover, Objects, take_over


class Watch:
    def __init__(self) -> None:
        self.noticed_at: float | None = None
        self.sources: list[str] = []

    @property
    def noticed(self) -> bool:
        return self.noticed_at is not None and self.noticed_at <= time.monotonic()

    def notice(self, source: str, after_s: float = 0.0) -> None:
        self.sources.append(source)
        at = time.monotonic() + after_s
        self.noticed_at = at if self.noticed_at is None else min(at, self.noticed_at)


def env_of(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"RESPAWN_CHECKPOINT_URI": str(tmp_path / "ckpt"), "RESPAWN_GRACE_S": "8", **extra}


@pytest.mark.parametrize(
    ("written", "saves", "train_on"),
    [
        (None, [], 0.0),
        ("", [], 0.0),
        ("preempted\n", [], 4.0),
        ("preempted\n", [0.5, 1.5], 1.0),
        ("preempted\n", [3.0], 0.0),
    ],
)
def test_the_noticed_trainer_trains_on_only_on_a_preemption_and_within_half_its_grace_less_two_saves(
    tmp_path: Path, written: str | None, saves: list[float], train_on: float
) -> None:
    """A deletion (a cancel, a hung attempt) has no successor: the notice file the shutdown script left is empty."""
    notice = tmp_path / "notice"
    if written is not None:
        notice.write_text(written)
    env = load_env(env_of(tmp_path, RESPAWN_HANDOVER=str(tmp_path / "h"), RESPAWN_NOTICE_FILE=str(notice)))
    handover = Handover(env, Objects())
    for seconds in saves:
        handover.saved(seconds)
    assert handover.train_on_s() == pytest.approx(train_on)


def test_a_replay_of_real_timings_shrinks_the_bound_alike(tmp_path: Path) -> None:
    """The local cloud's --profile cloud (1 local s per real minute): a TPU's 4 s of training on are 1/15 s."""
    notice = tmp_path / "notice"
    notice.write_text("preempted\n")
    extra = {"RESPAWN_HANDOVER": str(tmp_path / "h"), "RESPAWN_NOTICE_FILE": str(notice)}
    env = load_env(env_of(tmp_path, RESPAWN_TEST_TIME_SCALE=str(1 / 60), **extra))
    assert Handover(env, Objects()).train_on_s() == pytest.approx(4 / 60)


def test_a_local_cloud_whose_machines_are_off_before_the_grace_ends_bounds_it_by_its_window(tmp_path: Path) -> None:
    notice = tmp_path / "notice"
    notice.write_text("preempted\n")
    extra = {"RESPAWN_HANDOVER": str(tmp_path / "h"), "RESPAWN_NOTICE_FILE": str(notice), "RESPAWN_GRACE_S": "25"}
    assert Handover(load_env(env_of(tmp_path, **extra, RESPAWN_TEST_WINDOW_S="5")), Objects()).train_on_s() == 2.5
    assert Handover(load_env(env_of(tmp_path, **extra, RESPAWN_TEST_WINDOW_S="30")), Objects()).train_on_s() == 12.5


def test_the_noticed_trainer_stops_training_as_its_successor_says_it_is_ready(tmp_path: Path) -> None:
    notice = tmp_path / "notice"
    notice.write_text("preempted\n")
    prefix = str(tmp_path / "attempt-1")
    env = load_env(env_of(tmp_path, RESPAWN_HANDOVER=prefix, RESPAWN_NOTICE_FILE=str(notice)))
    watch, handover = Watch(), Handover(env, Objects())
    watch.notice("SIGTERM", handover.on_notice(watch))
    time.sleep(0.3)
    assert not watch.noticed  # training on
    Path(prefix + READY).write_text("{}")
    deadline = time.monotonic() + 2
    while not watch.noticed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watch.noticed and watch.sources == ["SIGTERM", "the next machine is ready"]
    handover.drained("job-1", 1, 42)
    assert Path(prefix + EXITED).read_text() == '{"job_id": "job-1", "attempt": 1, "step": 42}'


def test_the_successor_says_ready_then_waits_for_the_final_save(tmp_path: Path) -> None:
    prefix = str(tmp_path / "attempt-1")
    env = load_env(env_of(tmp_path, RESPAWN_TAKEOVER=prefix, RESPAWN_START_AFTER=str(time.time() + 30)))
    threading.Timer(0.5, lambda: Path(prefix + EXITED).write_text("{}")).start()
    outcome, waited = take_over(env, Objects(), Watch(), primary=True)
    assert outcome == "found" and 0.5 <= waited < 3
    assert Path(prefix + READY).exists()


def test_without_the_final_save_the_successor_starts_when_the_noticed_machine_is_off(tmp_path: Path) -> None:
    prefix = str(tmp_path / "attempt-1")
    env = load_env(env_of(tmp_path, RESPAWN_TAKEOVER=prefix, RESPAWN_START_AFTER=str(time.time() + 0.5)))
    outcome, waited = take_over(env, Objects(), Watch(), primary=False)
    assert outcome == "timeout" and 0.4 <= waited < 3
    assert not Path(prefix + READY).exists()  # a slice's other hosts leave it to worker 0


def test_a_successor_noticed_while_it_waits_stops_waiting(tmp_path: Path) -> None:
    env = load_env(env_of(tmp_path, RESPAWN_TAKEOVER=str(tmp_path / "a"), RESPAWN_START_AFTER=str(time.time() + 30)))
    watch = Watch()
    threading.Timer(0.3, lambda: watch.notice("SIGTERM")).start()
    outcome, waited = take_over(env, Objects(), watch, primary=True)
    assert outcome == "stopped" and waited < 3


@pytest.mark.emulator
@pytest.mark.slow
def test_a_head_start_hands_over_with_one_save_and_the_successor_restores_it(
    fake_gcs: FakeGcs, bucket: str, tmp_path: Path, compile_cache: Path
) -> None:
    """Two trainers on Cloud Storage (fake-gcs-server), as on a noticed machine and its head start's: the noticed one
    trains on after SIGTERM until the successor has set itself up, saves, and says so; the successor restores that
    save, so no step is trained twice and none lost."""
    uri, notice = f"gs://{bucket}/runs/job-test", tmp_path / "notice"
    prefix = f"{uri}.respawn/attempt-1"
    args = ["--model=none", "--steps=400", "--step-time=0.02", "--checkpoint-every=50", "--log-every=1"]
    sink_a, sink_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = start(trainer_env(uri, sink_a, compile_cache, RESPAWN_HANDOVER=prefix, RESPAWN_NOTICE_FILE=str(notice)), args)
    at_notice = a.wait_step(60)
    notice.write_text("preempted\n")  # the shutdown script, asked the metadata server
    a.signal(signal.SIGTERM)
    env_b = trainer_env(
        uri,
        sink_b,
        compile_cache,
        RESPAWN_ATTEMPT="2",
        RESPAWN_TAKEOVER=prefix,
        RESPAWN_START_AFTER=f"{time.time() + 60}",
    )
    b = start(env_b, args)
    assert a.finish() == 0, a.tail()
    assert b.finish() == 0, b.tail()

    stopped, started = last(sink_a, "stopped"), last(sink_b, "started")
    assert stopped["step"] > at_notice + 5, a.tail()  # trained on while the successor set itself up
    assert "preemption notice (the next machine is ready)" in "".join(a.stderr), a.tail()
    assert started["restored_step"] == stopped["step"] and started["takeover_wait_s"] > 0
    assert started["takeover"] == "found"  # the marker released it, long before its start-after
    assert last(sink_b, "completed")["step"] == 400
    assert [e["event"] for e in entries(sink_b)].count("started") == 1
    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    names = {blob.name for blob in client.list_blobs(bucket, prefix="runs/job-test.respawn/")}
    assert names == {"runs/job-test.respawn/attempt-1.ready", "runs/job-test.respawn/attempt-1.exited"}


def test_a_successor_noticed_before_it_took_over_exits_143_without_a_word(tmp_path: Path) -> None:
    """Nothing restored, nothing to save: no `failed` (its exit code with the notice file says nothing either), no
    `started`; the machine's preemption event replaces it."""
    from respawn_trainer import Run
    from respawn_trainer.run import NoticedBeforeStart
    from trainer.sleeper import MarkerCheckpoints

    sink = tmp_path / "entries.jsonl"
    env = env_of(
        tmp_path,
        RESPAWN_LOG_SINK=str(sink),
        RESPAWN_TAKEOVER=str(tmp_path / "attempt-1"),
        RESPAWN_START_AFTER=str(time.time() + 30),
    )
    run = Run(10, checkpointer=MarkerCheckpoints(str(tmp_path / "ckpt")), env=env, use_jax=False)
    threading.Timer(0.3, lambda: run.watch.notice("SIGTERM")).start()
    with pytest.raises(NoticedBeforeStart) as stopped, run:
        run.restore({"step": 0})
    assert stopped.value.code == 143
    assert Path(str(tmp_path / "attempt-1") + READY).exists()
    assert not sink.exists() or entries(sink) == []
