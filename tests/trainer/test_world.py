"""Worlds of several slices (respawn_trainer.world): 2 slices x 1 host on loopback, 1 CPU device each, gloo.

The reference is the uninterrupted 2-slice world. A world that stops for a change saves once at one agreed step;
the next world restores (from the survivors' local copies) and trains on: the same steps, each once, the same batches.
Bitwise equal to the reference where the next world's membership is the reference's; else the loss of every step
within 1e-3 relative of the reference's (data-exact).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import COMPLETED, committed_steps, trainer_env
from world_harness import (
    SliceMetadata,
    WorldKey,
    coordinator,
    entries_of,
    finish_all,
    losses,
    start_world,
    tails,
)

STEPS = 60
ARGS = ["--model=nano", f"--steps={STEPS}", "--seed=7", "--checkpoint-every=10", "--log-every=1"]
TOLERANCE = 1e-3  # relative, per step, where the membership differs from the reference's
WORLD_CHANGED = 75


@dataclass(frozen=True)
class WorldReference:
    params_sha256: str
    losses: dict[int, float]


@dataclass
class Servers:
    key: WorldKey
    slices: dict[int, SliceMetadata]


@pytest.fixture
def servers() -> Iterator[Servers]:
    key = WorldKey()
    found = Servers(key, {s: SliceMetadata(key) for s in (0, 1)})
    yield found
    for server in found.slices.values():
        server.server.shutdown()


def single_losses(runs: list) -> dict[int, float]:
    found = losses(runs)
    assert all(len(v) == 1 for v in found.values()), {k: v for k, v in found.items() if len(v) > 1}
    return {k: v[0] for k, v in found.items()}


@pytest.fixture(scope="module")
def world_reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> WorldReference:
    """The uninterrupted 2-slice world."""
    root = tmp_path_factory.mktemp("world-reference")
    key = WorldKey()
    slices = {s: SliceMetadata(key) for s in (0, 1)}
    key.set(1, [0, 1], coordinator())
    env = trainer_env(str(root / "ckpt"), root / "unused.jsonl", compile_cache)
    runs = start_world(env, 1, [0, 1], slices, root, ARGS)
    codes = finish_all(runs)
    assert codes == {0: 0, 1: 0}, tails(runs)
    hashes = {COMPLETED.findall("".join(r.stderr))[-1][1] for r in runs.values()}
    assert len(hashes) == 1
    for server in slices.values():
        server.server.shutdown()
    return WorldReference(hashes.pop(), single_losses([runs[0]]))


def entry_of(root: Path, slice_: int, event: str, timeout: float = 60.0, **match: object) -> dict[str, Any]:
    """Slice `slice_`'s newest `event` entry with the fields of `match`, waited for."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in entries_of(root, slice_) if e["event"] == event and match.items() <= e.items()]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no {event} {match} from slice {slice_}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_slices_notice_stops_the_world_the_survivor_trains_on_in_its_process_and_the_replacement_joins(
    tmp_path: Path, compile_cache: Path, servers: Servers, world_reference: WorldReference
) -> None:
    """Worlds of 2, 1 and 2 slices: slice 1's notice, then its replacement joining at an announced step. The survivor
    is one process throughout: it joins worlds 2 and 3 in place, from its local copy each time."""
    ckpt = tmp_path / "ckpt"
    env = trainer_env(str(ckpt), tmp_path / "unused.jsonl", compile_cache)
    servers.key.set(1, [0, 1], coordinator())
    first = start_world(env, 1, [0, 1], servers.slices, tmp_path, ARGS)
    survivor = first[0]
    assert survivor.wait_step(12) >= 12, tails(first)
    first[1].signal(signal.SIGTERM)  # slice 1's notice only (its soft off: the metadata flag is polled each second)
    assert finish_all({1: first[1]}) == {1: 0}, tails(first)
    stopped = {s: entry_of(tmp_path, s, "stopped", world=1) for s in (0, 1)}
    step = stopped[0]["step"]
    assert stopped[1]["step"] == step and step in committed_steps(ckpt)
    assert stopped[0]["reason"] == "world-changed" and stopped[1]["reason"] == "preempted"
    assert stopped[1]["slice"] == 1 and survivor.proc.poll() is None, tails(first)  # waiting for its next world
    assert (tmp_path / "notice-1").exists() and not (tmp_path / "notice-0").exists()

    servers.key.set(2, [0], None, step)  # the survivor alone: one process, no coordinator needed
    joins = survivor.wait_step(step + 3) + 10  # the replacement is ready: it joins at a boundary announced ahead
    servers.key.set(3, [0, 1], coordinator(), joins)
    replacement = start_world(env, 3, [1], servers.slices, tmp_path, ARGS)
    runs = {0: survivor, 1: replacement[1]}
    assert finish_all(runs) == {0: 0, 1: 0}, tails(runs)
    started = {w: entry_of(tmp_path, 0, "started", world=w) for w in (2, 3)}
    assert started[2]["restored_step"] == step and started[2]["restored_from"] == "local"
    assert started[3]["restored_step"] == joins and started[3]["restored_from"] == "local"  # the replacement: store
    assert entry_of(tmp_path, 0, "stopped", world=2)["step"] == joins
    joined = entry_of(tmp_path, 1, "started", world=3)  # a new process: no local copy, the store
    assert joined["restored_step"] == joins and joined["restored_from"] == "store"
    done = [entry_of(tmp_path, s, "completed", world=3)["params_sha256"] for s in (0, 1)]
    assert done[0] == done[1]  # each slice's own copy of the replicated state: the same bits
    ends = (("stopped", 1), ("stopped", 2), ("completed", 3))
    goodput = [entry_of(tmp_path, 0, event, world=w)["goodput"] for event, w in ends]
    for key in ("total_s", "startup_s", "restore_s", "productive_s"):  # the attempt's split: all its process's worlds
        assert goodput[0][key] <= goodput[1][key] <= goodput[2][key], (key, goodput)
    said = survivor.tail(400)  # worlds 2 and 3: the previous world's stop, the store not asked for its steps
    assert f"restored step {step}, the previous world's stop, from the local copy" in said
    assert f"restored step {joins}, the previous world's stop, from the local copy" in said
    assert f"restored step {joins}, the previous world's stop, from the store" in replacement[1].tail(400)
    assert survivor.tail(400).count("in this process") == 2 and (tmp_path / "local-0" / "world").read_text() == "3\n"
    trained = single_losses([survivor])  # each step once: none redone, none skipped
    assert sorted(trained) == list(range(1, STEPS + 1))
    for s in range(1, STEPS + 1):
        if s <= step:  # the reference's membership: the same bits
            assert trained[s] == world_reference.losses[s], s
        else:  # the same batch, summed in another order from step + 1 on
            assert abs(trained[s] - world_reference.losses[s]) <= TOLERANCE * world_reference.losses[s], s


@pytest.mark.slow
def test_a_newer_world_with_a_step_stops_both_there_and_the_next_world_ends_bitwise(
    tmp_path: Path, compile_cache: Path, servers: Servers, world_reference: WorldReference
) -> None:
    """Each process leaves with 75 (RESPAWN_REFORM_WAIT_S 0: none waits for its next world in place), and new ones
    start in the next world: the startup script's way, where a process cannot join in place."""
    ckpt = tmp_path / "ckpt"
    env = trainer_env(str(ckpt), tmp_path / "unused.jsonl", compile_cache, RESPAWN_REFORM_WAIT_S="0")
    servers.key.set(1, [0, 1], coordinator())
    first = start_world(env, 1, [0, 1], servers.slices, tmp_path, ARGS)
    boundary = first[0].wait_step(5) + 20  # announced ahead, as the control plane does
    servers.key.set(2, [0, 1], coordinator(), boundary)
    assert finish_all(first) == {0: WORLD_CHANGED, 1: WORLD_CHANGED}, tails(first)
    for s in (0, 1):
        stopped = [e for e in entries_of(tmp_path, s) if e["event"] == "stopped"][-1]
        assert stopped["step"] == boundary and stopped["reason"] == "world-changed"
    assert boundary in committed_steps(ckpt)
    assert all(server.world_gets < 20 for server in servers.slices.values())  # hanging GETs, not a poll

    second = start_world(env, 2, [0, 1], servers.slices, tmp_path, ARGS)
    assert finish_all(second) == {0: 0, 1: 0}, tails(second)
    for s in (0, 1):
        started = [e for e in entries_of(tmp_path, s) if e["event"] == "started"][-1]
        assert started["restored_step"] == boundary and started["restored_from"] == "local"
        completed = [e for e in entries_of(tmp_path, s) if e["event"] == "completed"][-1]
        assert completed["params_sha256"] == world_reference.params_sha256
    assert sorted(single_losses([first[0], second[0]])) == list(range(1, STEPS + 1))


def test_an_older_world_is_ignored_and_a_slice_the_newest_lacks_says_ready_when_warm_and_joins_a_world_with_it(
    tmp_path: Path, compile_cache: Path, servers: Servers
) -> None:
    """Slice 1's machine, started for world 2 while the key still says 1: it waits (1 is ignored). World 3 lacks
    slice 1 (a replacement, set up while the others train): the trainer imports, says `ready` and waits, warm.
    World 4 has it: the trainer joins world 4, not the one it was started for, and trains."""
    env = trainer_env(str(tmp_path / "ckpt"), tmp_path / "unused.jsonl", compile_cache)
    args = [*ARGS[:1], "--steps=6", *ARGS[2:]]
    servers.key.set(1, [0], None)
    waiting = start_world(env, 2, [1], servers.slices, tmp_path, args)
    time.sleep(3.0)
    assert waiting[1].proc.poll() is None and entries_of(tmp_path, 1) == [], tails(waiting)
    servers.key.set(3, [0], None)
    ready = entry_of(tmp_path, 1, "ready")
    assert ready["world"] == 3 and ready["worker"] == 0
    time.sleep(1.0)
    assert waiting[1].proc.poll() is None, tails(waiting)
    servers.key.set(4, [1], None)
    assert finish_all(waiting, 120) == {1: 0}, tails(waiting)
    assert [e["event"] for e in entries_of(tmp_path, 1)][:2] == ["ready", "started"]
    started = entry_of(tmp_path, 1, "started")
    assert started["world"] == 4 and started["restored_step"] == 0
    assert "ignoring world 1" in waiting[1].tail(200)


def test_a_world_whose_key_names_no_coordinator_finds_it_beside_the_checkpoints_and_trains(
    tmp_path: Path, compile_cache: Path, servers: Servers
) -> None:
    """The control plane's key has no coordinator (it cannot know the machines' addresses): process 0 writes its own
    (loopback here: these metadata servers have no network interfaces) to the rendezvous object, and the other
    process, started first, waits for it."""
    ckpt = tmp_path / "ckpt"
    env = trainer_env(str(ckpt), tmp_path / "unused.jsonl", compile_cache)
    servers.key.set(4, [0, 1])
    args = [*ARGS[:1], "--steps=6", *ARGS[2:]]
    late = start_world(env, 4, [1], servers.slices, tmp_path, args)  # process 1 waits for process 0's object
    time.sleep(1.0)
    first = start_world(env, 4, [0], servers.slices, tmp_path, args)
    runs = {**first, **late}
    assert finish_all(runs) == {0: 0, 1: 0}, tails(runs)
    written = (tmp_path / "ckpt.respawn" / "world-4.coordinator").read_text()
    assert re.fullmatch(r"127\.0\.0\.1:\d+", written), written
    assert f"world coordinator {written}, read from" in late[1].tail(200)
    completed = [[e for e in entries_of(tmp_path, s) if e["event"] == "completed"][-1] for s in (0, 1)]
    assert completed[0]["step"] == 6 and completed[0]["params_sha256"] == completed[1]["params_sha256"]


class Position:
    """A data iterator whose state is one global stream position."""

    state_is_global = True

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def set_state(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_a_local_copy_restores_the_state_and_the_data_position_bitwise_and_only_for_the_newest_step(
    tmp_path: Path,
) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from respawn_trainer.checkpoint import abstract
    from respawn_trainer.local_copy import LocalCopy

    state = {
        "params": {"w": jax.random.normal(jax.random.PRNGKey(3), (8, 4)), "b": jnp.arange(4, dtype=jnp.bfloat16)},
        "step": jnp.int32(17),
    }
    copy = LocalCopy(str(tmp_path), "gs://bucket/job")
    assert copy.keep(16, state, Position(99), True, world=3) is not None
    assert copy.keep(17, state, Position(123), True, world=4) is not None  # only the newest is kept
    assert [p.name for p in copy.dir.iterdir()] == ["17"]
    (copy.dir / ".18.tmp-1").mkdir()  # a copy still being written: not one
    assert (copy.kept_by(4), copy.kept_by(3), copy.kept_by(5)) == (17, None, None)  # the world that saved it
    assert copy.read(16, abstract(state), None) is None  # not the store's newest: not used
    data = Position()
    restored = copy.read(17, abstract(state), data)
    assert restored is not None and restored[1] == {"position": 123}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored[0]), strict=True):
        assert a.dtype == b.dtype and a.sharding == b.sharding
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    other = LocalCopy(str(tmp_path), "gs://bucket/another-job")  # another job's checkpoints: nothing
    assert other.read(17, abstract(state), data) is None


def test_a_world_key_older_or_equal_is_ignored_and_a_newer_one_stops_at_its_step() -> None:
    from respawn_trainer.world import World, WorldWatch

    assert World.parse('{"version": 2, "members": [0, 1], "coordinator": "h:1", "step": null}') == World(
        2, (0, 1), "h:1", None
    )
    assert World.parse("not json") is None and World.parse('{"members": [0]}') is None
    world = World(3, (2, 5), "h:1")
    assert world.placement(5, 1, hosts=2).process_id == 3 and world.placement(5, 1, hosts=2).process_count == 4
    assert world.slice_of_processes(2) == [2, 2, 5, 5]
    explicit = World(3, (2, 5), "h:1", process_ids={"5/0": 0, "2/0": 1})
    assert explicit.placement(2, 0, hosts=1).process_id == 1 and explicit.slice_of_processes(1) == [5, 2]
    watch = WorldWatch("http://127.0.0.1:9", 2, None)  # not started: its decision alone
    assert not watch.stop_at(10)
    watch.newest = World(3, (0,), step=12)
    assert not watch.stop_at(11) and watch.stop_at(12) and watch.stop_at(20)
    watch.newest = World(3, (0,), step=None)
    assert watch.stop_at(1)


def test_the_key_is_read_at_most_once_a_second_from_a_server_that_does_not_hang_and_at_once_after_a_plain_read(
    servers: Servers,
) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from respawn_trainer.world import _Reader, _wait_for

    asked: list[float] = []

    class NoHanging(BaseHTTPRequestHandler):  # answers every GET at once, wait_for_change or not
        def do_GET(self) -> None:
            asked.append(time.monotonic())
            body = b'{"version": 1, "members": [0]}'
            self.send_response(200)
            self.send_header("ETag", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoHanging)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1"
        assert _wait_for(_Reader(url), 2, 3.0) is None
    finally:
        server.shutdown()
    assert 3 <= len(asked) <= 5, asked  # the plain read, a hanging GET at once, then one a second
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(asked[1:])), asked  # after the first hanging GET

    servers.key.set(1, [0])
    threading.Timer(0.2, lambda: servers.key.set(2, [0])).start()
    began = time.monotonic()
    found = _wait_for(_Reader(servers.slices[0].url), 2, 10.0)  # a plain read (1), then the hanging GET at once
    assert found is not None and found.version == 2 and time.monotonic() - began < 0.8


def test_a_survivor_waiting_for_its_next_world_leaves_at_once_on_its_own_notice(
    tmp_path: Path, compile_cache: Path, servers: Servers
) -> None:
    """Its save is done and kept: a notice while it waits for the control plane's next world ends it (143)."""
    env = trainer_env(str(tmp_path / "ckpt"), tmp_path / "unused.jsonl", compile_cache)
    servers.key.set(1, [0, 1], coordinator())
    first = start_world(env, 1, [0, 1], servers.slices, tmp_path, ARGS)
    assert first[0].wait_step(5) >= 5, tails(first)
    first[1].signal(signal.SIGTERM)
    assert finish_all({1: first[1]}) == {1: 0}, tails(first)
    entry_of(tmp_path, 0, "stopped", world=1)
    time.sleep(0.5)
    assert first[0].proc.poll() is None, tails(first)  # waiting for world 2
    first[0].signal(signal.SIGTERM)
    assert finish_all({0: first[0]}, 20) == {0: 143}, tails(first)
    assert "while waiting for the next world" in first[0].tail(20)


STUCK = """
import sys, time
from respawn_trainer.env import load_env
from respawn_trainer.world import Membership, World
url = "http://127.0.0.1:9"  # nothing answers: the watch only warns
env = load_env({"RESPAWN_WORLD_VERSION": "1", "RESPAWN_METADATA_URL": url, "RESPAWN_WORLD_LEAVE_S": "1"})
member = Membership(env, World(1, (0, 1)), None)
member.formed()
how = sys.argv[1]
if how not in ("starting", "joined"):
    assert member.stale() is False  # the world starts: from now on it stops at a step
if how == "stopped":
    member.left = True  # the world stopped in time: a newer world is no hang
member._leave_if_forming(World(2, (0, 1, 2) if how == "joined" else (0,)))
time.sleep(3)
"""


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        ("stuck", WORLD_CHANGED, "did not stop within 1s of world 2"),
        ("stopped", 0, None),
        ("starting", WORLD_CHANGED, "was starting, and slice(s) [1] are gone from it: exit 75"),
    ],
)
def test_a_world_that_does_not_stop_in_time_after_a_newer_one_came_is_left_with_75(
    how: str, code: int, said: str | None
) -> None:
    """A collective waiting for a dead peer holds the main thread until JAX's heartbeat gives up: the watch's timer
    ends the process instead, RESPAWN_WORLD_LEAVE_S after the newer world came, unless the world stopped. A world
    not started yet (restoring, compiling) that a newer world shows a member slice gone from is left at once: its
    collectives may wait for that slice's processes, and it has trained nothing."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STUCK, how], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert ("did not stop within" in done.stderr) == (how == "stuck"), done.stderr
    assert said is None or said in done.stderr, done.stderr  # "starting": at once, before the 1 s timer


def test_a_newer_world_that_only_adds_a_slice_to_one_starting_is_left_in_place_at_its_first_step() -> None:
    """A join is no reason to leave at once: every member is there, and stale() takes the world to the next in
    place before its first step. Only the timer ends a world that then does not stop."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STUCK, "joined"], capture_output=True, text=True, timeout=60)
    assert done.returncode == WORLD_CHANGED and "did not stop within 1s of world 2" in done.stderr, done.stderr
    assert "was starting" not in done.stderr, done.stderr


HELD = """
import sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(sys.argv[2], 3, int(sys.argv[1]))
from respawn_trainer import runtime
cases = [(5, None, 5), (5, 7, None), (None, None, None), (2**24 + 3, 2**24 + 3, 2**24 + 3), (0, None, None)]
print([runtime.agree_held(case[jax.process_index()]) for case in cases], flush=True)
jax.distributed.shutdown()
"""


def test_the_step_every_holder_of_a_copy_holds_is_agreed_on_and_a_process_holding_none_does_not_count() -> None:
    """Three processes: the survivors' copies of one step and a newcomer without one agree on that step; copies of
    two steps, or none at all, agree on none; a step beyond float32's exact integers is agreed on exactly."""
    import subprocess
    import sys

    from respawn_trainer.slice_env import free_port

    address, path = f"127.0.0.1:{free_port()}", str(Path(__file__).resolve().parents[2] / "trainer")
    env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen([sys.executable, "-c", HELD, str(i), address], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    said = [p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs]
    assert said == [str([5, None, None, 2**24 + 3, 0])] * 3, said


def test_a_process_started_for_one_world_that_joins_a_newer_one_watches_the_key_as_that_newer_worlds() -> None:
    """A replacement started for world 5 that is let into world 6: the key's world 6 is its own, not a newer one
    (read as newer, the world stopped at the hanging GET's first timeout and waited for a world 7 never made)."""
    import subprocess
    import sys

    script = """
from respawn_trainer.env import load_env
from respawn_trainer.world import Membership, World
env = load_env({"RESPAWN_WORLD_VERSION": "5", "RESPAWN_METADATA_URL": "http://127.0.0.1:9"})
member = Membership(env, World(6, (0, 1)), None)
print(member.watch.version, member.watch.stop_at(1))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["6", "False"], done.stderr
