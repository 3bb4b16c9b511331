"""A world: one JAX multi-controller job over every host of every member slice, which the control plane re-forms
when a slice goes or comes (docs/design/several-slices.md, "One step, then a new world").

The contract (the control plane produces it; trainer/README.md, Worlds of several slices):
* `RESPAWN_WORLD_VERSION` (int >= 1): the world this process was started for. Absent: no world, today's behaviour.
* `RESPAWN_SLICE` (int >= 0, default 0): the slice this host belongs to; `TPU_WORKER_ID` is its host in the slice.
* The VM metadata key `respawn-world`, JSON `{"version", "members", "step"}`, read from the metadata server and
  watched with its own hanging GET (`wait_for_change=true`, `last_etag`, `timeout_sec`): never polled faster than
  once a second, whatever the server does. `process_ids` ({"SLICE/WORKER": id}) may be added; left out, process ids
  follow `members` order, each slice's hosts in worker order. JAX's runtime is initialized with the world's
  coordinator, this process's id and the world's process count.
* The coordinator: the key's `coordinator` ("host:port") where it names one; else (the control plane's key: it
  cannot know the machines' addresses) the rendezvous object `{RESPAWN_CHECKPOINT_URI}.respawn/world-{V}.coordinator`
  beside the checkpoints, "HOST:PORT", which process 0 writes with its own address and a free port before it serves
  the coordinator, and which every other process waits for (`rendezvous`).
* Exit code 75 (EX_TEMPFAIL, `WORLD_CHANGED_RC`): the world changed and this process could not join the next one in
  place; start me again in the new one. A process whose world stopped for a change joins the next in its own process
  where it can (`next_world`, run.Run.reform), and says which world it runs in now in RESPAWN_LOCAL_COPY_DIR/world.

Before the world is formed, a process that finds a newer version on the key exits 75 at once (nothing is trained, so
nothing is lost; a peer that already left would otherwise hold `jax.distributed.initialize` until its timeout). Once
formed, every stop is agreed through the collective that makes a slice's hosts agree on the notice
(`runtime.agree_max_each`): all processes stop after the same step, and the world saves once. A version older than
this process's is ignored wherever it is read.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from respawn_trainer import runtime
from respawn_trainer.env import RunEnv
from respawn_trainer.handover import Objects, objects_for
from respawn_trainer.lifecycle import Lifecycle
from respawn_trainer.local_copy import LocalCopy
from respawn_trainer.slice_env import LOOPBACK, free_port

log = logging.getLogger("trainer")
WORLD_CHANGED_RC = 75  # EX_TEMPFAIL: "the world changed: start me again in the new world"
KEY = "instance/attributes/respawn-world"
WAIT_S = 60  # timeout_sec of one hanging GET
JOIN_WAIT_S = 300.0  # how long a process started for version v waits for the key to say v before it exits 75
MIN_INTERVAL_S = 1.0  # a server that does not hang (or answers errors) is asked at most this often
READ_TIMEOUT_S = 10.0
ADDRESS_KEY = "instance/network-interfaces/0/ip"
RAN_FILE = "world"  # in RESPAWN_LOCAL_COPY_DIR: the version of the world this machine's trainer runs in now
RENDEZVOUS_POLL_S = (0.05, 0.25)  # a waiter asks for the rendezvous object this often, backing off from the first


class WorldChanged(SystemExit):
    """The process leaves its world without training on (exit 75): a newer world is on the key, or its own never
    came."""

    def __init__(self, why: str) -> None:
        super().__init__(WORLD_CHANGED_RC)
        self.why = why
        log.warning("%s: exit %d", why, WORLD_CHANGED_RC)


@dataclass(frozen=True)
class World:
    """One version of the `respawn-world` key."""

    version: int
    members: tuple[int, ...]
    coordinator: str | None = None
    step: int | None = None  # of a newer version than the running one: the save boundary to stop at
    process_ids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> World | None:
        """The key's value, or None (with a warning) when it is not a world: a bad value is ignored, as a stale one."""
        try:
            value = json.loads(text)
            step = value.get("step")
            world = cls(
                version=int(value["version"]),
                members=tuple(int(m) for m in value["members"]),
                coordinator=value.get("coordinator") or None,
                step=None if step is None else int(step),
                process_ids={str(k): int(v) for k, v in (value.get("process_ids") or {}).items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("ignoring the %s key: not a world (%s: %s)", KEY, type(e).__name__, e)
            return None
        return world

    def ids(self, hosts: int) -> dict[tuple[int, int], int]:
        """(slice, worker) -> process id: `process_ids`, else members order with each slice's hosts in worker order."""
        if self.process_ids:
            pairs = (key.split("/", 1) for key in self.process_ids)
            return {(int(s), int(w)): self.process_ids[f"{s}/{w}"] for s, w in pairs}
        return {(s, w): i * hosts + w for i, s in enumerate(self.members) for w in range(hosts)}

    def placement(self, slice_: int, worker: int, hosts: int) -> runtime.Placement:
        """This process's place; its coordinator is "" where the key names none (then `rendezvous` finds it)."""
        ids = self.ids(hosts)
        if (slice_, worker) not in ids:
            raise WorldChanged(f"slice {slice_} host {worker} has no process id in world {self.version}")
        return runtime.Placement(self.coordinator or "", ids[(slice_, worker)], len(ids))

    def slice_of_processes(self, hosts: int) -> list[int]:
        """The slice of each process id, in id order (for a mesh with a `slice` axis)."""
        by_id = {i: s for (s, _), i in self.ids(hosts).items()}
        return [by_id[i] for i in sorted(by_id)]


def read_world(metadata_url: str, etag: str | None = None, wait_s: float = 0) -> tuple[World | None, str | None]:
    """(the key's world or None, its ETag). wait_s > 0: the metadata server's hanging GET, answered when the value
    differs from `etag` (or after wait_s). A missing key is (None, its ETag); other errors raise OSError."""
    query = {"wait_for_change": "true", "timeout_sec": str(int(wait_s))} if wait_s > 0 else {}
    if query and etag:
        query["last_etag"] = etag
    url = f"{metadata_url}/{KEY}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=wait_s + READ_TIMEOUT_S) as response:
            return World.parse(response.read().decode(errors="replace")), response.headers.get("ETag")
    except urllib.error.HTTPError as e:
        if e.code == 404:  # no key yet: a wait from its ETag answers once it appears
            return None, e.headers.get("ETag") if e.headers else None
        raise


def rendezvous_uri(checkpoint_uri: str, version: int) -> str:
    """Beside the job's checkpoints, not among them (`{checkpoint_uri}.respawn/`, as the handover's objects), so that
    no checkpoint manager lists it. One per version: a waiter never takes an earlier world's coordinator for its own.
    They are left there (a few bytes a world change): a later world's process 0 cannot know that an earlier world's
    processes are all past their read, and a lost object would cost that world its start."""
    return f"{checkpoint_uri}.respawn/world-{version}.coordinator"


def host_address(metadata_url: str) -> str:
    """This VM's primary internal IP, which every VM of the job's network reaches: the metadata server's
    `instance/network-interfaces/0/ip` (https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys).
    A metadata server that has no such key (the local cloud's, a test's: every machine is a process here) means
    loopback; one out of reach, the address of the host's name (the VM's internal IP on Compute Engine's images)."""
    request = urllib.request.Request(f"{metadata_url}/{ADDRESS_KEY}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:
            address = response.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as e:
        log.info(
            "the metadata server has no %s (HTTP %d): the coordinator listens on %s", ADDRESS_KEY, e.code, LOOPBACK
        )
        return LOOPBACK
    except OSError as e:
        log.warning("cannot read %s (%s): the coordinator's address is the host name's", ADDRESS_KEY, e)
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return LOOPBACK
    return address or LOOPBACK


def serve_coordinator(objects: Objects, uri: str, metadata_url: str) -> str:
    """Process 0: its address and a free port, written to the rendezvous object before JAX's coordinator serves it
    (jax.distributed.initialize binds every interface: `[::]:port`). The startup script runs a world's version once
    on a machine, so this object is written once per world; a failed write fails the process (its peers could
    only wait their bound)."""
    coordinator = f"{host_address(metadata_url)}:{free_port()}"
    objects.write(uri, coordinator.encode(), "text/plain")
    log.info("world coordinator %s, written to %s", coordinator, uri)
    return coordinator


def find_coordinator(objects: Objects, uri: str, wait_s: float) -> str:
    """Every other process: the rendezvous object's "HOST:PORT", polled (backing off to once a second) up to wait_s;
    none by then is WorldChanged, as a world that never came. A newer world meanwhile ends the process at once
    (Membership's watch)."""
    deadline, pause, warned = time.monotonic() + wait_s, RENDEZVOUS_POLL_S[0], False
    while True:
        try:
            found = objects.get(uri)
        except (OSError, ValueError) as e:
            found = None
            if not warned:
                log.warning("cannot read %s (%s); still waiting", uri, e)
                warned = True
        coordinator = found.decode(errors="replace").strip() if found else ""
        if coordinator:
            log.info("world coordinator %s, read from %s", coordinator, uri)
            return coordinator
        if time.monotonic() + pause > deadline:
            raise WorldChanged(f"no coordinator in {uri} within {wait_s:.0f}s")
        time.sleep(pause)
        pause = min(pause * 2, RENDEZVOUS_POLL_S[1])


def rendezvous(env: RunEnv, world: World, placement: runtime.Placement, objects: Objects) -> runtime.Placement:
    """The placement with its coordinator: the key's, else the rendezvous object's (one process world: none)."""
    if placement.coordinator or placement.process_count <= 1:
        return placement
    assert env.metadata_url
    uri = rendezvous_uri(env.checkpoint_uri, world.version)
    if placement.process_id == 0:
        coordinator = serve_coordinator(objects, uri, env.metadata_url)
    else:
        coordinator = find_coordinator(objects, uri, JOIN_WAIT_S)
    return placement._replace(coordinator=coordinator)


class _Reader:
    """Successive reads of the key for one waiter: hanging GETs from the last ETag, never more than one a second. A
    hanging GET right after a plain read goes at once: it hangs until the value differs from the one just read (a
    pause there would only delay a world change, by up to the interval)."""

    def __init__(self, metadata_url: str, etag: str | None = None) -> None:
        self.url, self.etag = metadata_url, etag
        self._last, self._hung, self._warned = 0.0, False, False

    def next(self, wait_s: float, pause: threading.Event | None = None) -> World | None:
        idle = self._last + MIN_INTERVAL_S - time.monotonic()
        if idle > 0 and self._hung:
            (pause or threading.Event()).wait(idle)
        self._last, self._hung = time.monotonic(), wait_s > 0
        try:
            world, self.etag = read_world(self.url, self.etag, wait_s)
        except (OSError, http.client.HTTPException) as e:  # a bad answer is a failed read: the watch goes on
            if not self._warned:
                log.warning("cannot read %s (%s); still waiting", KEY, e)
                self._warned = True
            return None
        return world


def _wait_for(reader: _Reader, least: int, wait_s: float) -> World | None:
    """The key's first world of version `least` or newer (an older one is ignored), read with hanging GETs for up to
    wait_s; None when none came by then."""
    deadline = time.monotonic() + wait_s
    world = reader.next(0)
    while world is None or world.version < least:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if world is not None:
            log.info("ignoring world %d on the key: this process is for world %d or newer", world.version, least)
        world = reader.next(min(WAIT_S, max(left, 1.0)))
    return world


def join(env: RunEnv, waiting: Callable[[World], None] = lambda world: None) -> tuple[World, str | None]:
    """The world this process trains in: the key's newest, of version RESPAWN_WORLD_VERSION or newer (an older one is
    ignored, up to JOIN_WAIT_S), once it lists this slice. While it does not (a replacement, set up while the others
    train), `waiting(world)` is called once (the `ready` entry: the control plane then lets the slice in at the
    running world's next step) and the process waits for a world with it, warm, up to JOIN_WAIT_S. None by then is
    WorldChanged (exit 75)."""
    assert env.world_version is not None and env.metadata_url
    reader, deadline = _Reader(env.metadata_url), time.monotonic() + JOIN_WAIT_S
    world = _wait_for(reader, env.world_version, JOIN_WAIT_S)
    told = False
    while world is not None and env.slice not in world.members:
        if not told:
            log.info("slice %d is not a member of world %d (%s): ready", env.slice, world.version, list(world.members))
            waiting(world)
            told = True
        world = _wait_for(reader, world.version + 1, deadline - time.monotonic())
    if world is None:
        raise WorldChanged(f"no world from {env.world_version} on with slice {env.slice} within {JOIN_WAIT_S:.0f}s")
    return world, reader.etag


def say_ready(env: RunEnv, sink: Any, world: World) -> None:
    """A slice that the key's world lacks (a replacement): JAX and Orbax imported and the checkpoint store's client
    made first, so that the world stops for it only once it can join at once; then its first host says `ready` (and
    the process waits to be let in)."""
    import jax  # noqa: F401  # the world's wait for this slice starts once it is warm

    from respawn_trainer.checkpoint import _orbax, warm_store

    _orbax()
    warm_store(env.checkpoint_uri)
    if (env.worker_id or 0) == 0:
        Lifecycle(sink, env.job_id, env.attempt).emit("ready", 0, worker=0, world=world.version)


def next_world(env: RunEnv, after: int) -> tuple[World, str | None] | None:
    """For a process whose world `after` stopped for a change: the next world from the key, waited for up to
    RESPAWN_REFORM_WAIT_S, to join in this same process (run.Run.reform). None where none comes in time, or where the
    newest has no place for this slice: the process then leaves (exit 75) and the startup script waits instead."""
    if env.reform_wait_s <= 0 or not env.metadata_url:
        return None
    reader = _Reader(env.metadata_url)
    world = _wait_for(reader, after + 1, env.reform_wait_s)
    if world is None:
        log.warning("no world after %d on the key within %.0fs: exit %d", after, env.reform_wait_s, WORLD_CHANGED_RC)
        return None
    if env.slice not in world.members:
        log.info("slice %d is not a member of world %d (%s)", env.slice, world.version, list(world.members))
        return None
    return world, reader.etag


def mark_ran(env: RunEnv, version: int) -> None:
    """Say on the host's disk which world this machine's trainer runs in now (RAN_FILE in RESPAWN_LOCAL_COPY_DIR): the
    startup script counts its entries and its wait for a newer world from it once the trainer ends, which may be
    worlds after the one it was started for."""
    if not env.local_copy_dir:
        return
    path = os.path.join(env.local_copy_dir, RAN_FILE)
    try:
        os.makedirs(env.local_copy_dir, exist_ok=True)
        with open(f"{path}.tmp", "w") as f:
            f.write(f"{version}\n")
        os.replace(f"{path}.tmp", path)
    except OSError as e:
        log.warning("cannot write %s (%s): the startup script counts from the world it started", path, e)


class WorldWatch:
    """Watches the key from a thread with the metadata server's hanging GET: `newest` is the newest version above
    the running one seen so far (an older or equal version is ignored)."""

    def __init__(self, metadata_url: str, version: int, etag: str | None) -> None:
        self.version = version
        self.newest: World | None = None
        self.on_newer: Any = None  # called with the new world, from the watch's thread
        self._reader = _Reader(metadata_url, etag)
        self._stop = threading.Event()

    def start(self) -> WorldWatch:
        threading.Thread(target=self._watch, name="world-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def stop_at(self, step: int) -> bool:
        """Whether the newer world wants the running one stopped after `step`: at its `step`, else at once."""
        newest = self.newest
        return newest is not None and (newest.step is None or step >= newest.step)

    def _watch(self) -> None:
        while not self._stop.is_set():
            world = self._reader.next(WAIT_S, self._stop)
            if self._stop.is_set():  # a world this process has left: what came meanwhile is its next world's news
                return
            newest = self.newest
            if world is None or world.version <= max(self.version, newest.version if newest else 0):
                continue
            self.newest = world
            at = "at once" if world.step is None else f"after step {world.step}"
            log.warning("world %d is on the key (this is %d): saving and leaving %s", world.version, self.version, at)
            if self.on_newer is not None:
                self.on_newer(world)


class Membership:
    """One process's place in its world: the world, the watch on the key, how it stops and with which exit code."""

    def __init__(self, env: RunEnv, world: World, etag: str | None) -> None:
        assert env.world_version is not None and env.metadata_url
        self.env, self.world, self.slice = env, world, env.slice
        self.worker, self.hosts = env.worker_id or 0, env.hosts
        self.exit_code = 0  # 0: completed, or stopped on its own slice's notice; WORLD_CHANGED_RC: start me again
        self.noticed_slices: tuple[int, ...] = ()
        self.restored_from = "store"  # or "local": the restore read this host's local copy
        self.local = LocalCopy(env.local_copy_dir, env.checkpoint_uri) if env.local_copy_dir else None
        self._forming, self._lock, self._armed = True, threading.Lock(), False
        self._started = False  # its processes agreed to train (stale() said no newer world): it stops at a step
        self.left = False  # the world stopped (keep_going said so, or the run ended): a newer one is no hang
        mark_ran(env, world.version)
        # the world joined, not RESPAWN_WORLD_VERSION: a replacement started for world v may join v + 1 or later
        self.watch = WorldWatch(env.metadata_url, world.version, etag)
        self.watch.on_newer = self._leave_if_forming
        self.watch.start()

    @classmethod
    def join(cls, env: RunEnv, waiting: Callable[[World], None]) -> Membership:
        world, etag = join(env, waiting)
        log.info("world %d: slices %s, this one %d", world.version, list(world.members), env.slice)
        return cls(env, world, etag)

    @property
    def version(self) -> int:
        return self.world.version

    def placement(self) -> runtime.Placement:
        """Called once, before jax.distributed.initialize: the coordinator is found here where the key names none."""
        placement = self.world.placement(self.slice, self.worker, self.hosts)
        return rendezvous(self.env, self.world, placement, objects_for(self.env))

    @property
    def slice_lead(self) -> bool:
        """Each member slice's first host sends its own attempt's lifecycle entries."""
        return self.worker == 0

    def fields(self) -> dict[str, int]:
        """Added to every lifecycle entry."""
        return {"world": self.version, "slice": self.slice}

    def slice_of_processes(self) -> list[int]:
        return self.world.slice_of_processes(self.hosts)

    def formed(self) -> None:
        """JAX's runtime is up over the whole world: from now on a newer world is agreed on, at a step boundary."""
        with self._lock:
            self._forming = False

    def _leave_if_forming(self, world: World) -> None:
        """A newer world while this one forms, or while it starts (restore, compile) without a member slice it had
        (noticed or lost: a collective may wait for its processes until JAX's heartbeat gives up), is left at once:
        nothing is trained yet, so nothing is lost, and the startup script starts this process again in the newer
        world. Once started, the world stops at a step boundary that every process agrees on (keep_going)."""
        with self._lock:
            lost = [m for m in self.world.members if m not in world.members]
            starting = not self._started and lost and self.slice in world.members
            if self._forming or starting:
                why = "forming" if self._forming else f"starting, and slice(s) {lost} are gone from it"
                log.warning("world %d came while world %d was %s: exit %d", world.version, self.version, why, 75)
                sys.stderr.flush()
                os._exit(WORLD_CHANGED_RC)
        if not self._armed:  # the first newer world: this one must stop in time
            self._armed = True
            timer = threading.Timer(self.env.world_leave_s, self._leave_if_still_here, (world.version,))
            timer.daemon = True
            timer.start()

    def _leave_if_still_here(self, newer: int) -> None:
        """A world that has not stopped RESPAWN_WORLD_LEAVE_S after a newer one came is stuck (a collective that waits
        for a peer that died, until JAX's heartbeat gives up): the process leaves it (exit 75), and the startup script
        starts a new one in the newer world."""
        if not self.left:
            log.warning(
                "world %d did not stop within %.0fs of world %d: exit %d",
                self.version,
                self.env.world_leave_s,
                newer,
                WORLD_CHANGED_RC,
            )
            sys.stderr.flush()
            os._exit(WORLD_CHANGED_RC)

    def stale(self) -> bool:
        """Before the first step: has any process seen a newer world? (a collective: every process calls it)"""
        newer = runtime.agree_any(self.watch.newest is not None)
        with self._lock:
            self._started = not newer
        return newer

    def keep_going(self, step: int, noticed: bool) -> bool:
        """One agreement per step: stop when a newer world wants it (its `step`, or at once) or a host of any member
        slice has the notice. The noticed slices' processes then exit as for a notice (0), the others 75."""
        mine = [float(noticed and member == self.slice) for member in self.world.members]
        agreed = runtime.agree_max_each([float(self.watch.stop_at(step)), *mine])
        noticed_slices = tuple(m for m, flag in zip(self.world.members, agreed[1:], strict=True) if flag > 0)
        if agreed[0] <= 0 and not noticed_slices:
            return True
        self.noticed_slices = noticed_slices
        self.exit_code = 0 if self.slice in noticed_slices else WORLD_CHANGED_RC
        self.left = True
        why = f"slice(s) {list(noticed_slices)} noticed" if noticed_slices else "a newer world"
        log.warning("world %d stops after step %d: %s; exit %d", self.version, step, why, self.exit_code)
        return False

    def restore(self, checkpoints: Any, template: Any, agree: Any) -> tuple[Any, int] | None:
        """This host's local copy where every process holds one of the store's newest step, else the store's.

        Where the processes that kept a copy in the world just before this one all kept one of the same step (that
        world's stop), the step is the store's newest without asking the store: no world trained in between. They
        restore their copies, and a process new to the world (a replacement slice's) reads that step from the
        store alone. Asking the store for its steps together (Orbax's CheckpointManager: a listing and barriers,
        every process waiting for the slowest) is then left to the first save, when the processes are in step."""
        kept = self.local.kept_by(self.version - 1) if self.local else None
        step = runtime.agree_held(kept)
        data = getattr(checkpoints, "data", None)
        restored: tuple[Any, int] | None = None
        if step is not None:  # the previous world's stop
            alone = getattr(checkpoints, "restore_alone", None)
            mine = self._read(step, template, data) if kept is not None else alone and alone(step, template)
            if not runtime.agree_any(mine is None):
                self.restored_from = "local" if kept is not None else "store"
                restored = (mine, step)
                log.info("restored step %d, the previous world's stop, from %s", step, self._where())
        if restored is None:  # the store's newest, every process asking
            newest = _newest_step(checkpoints)
            local = self._read(newest, template, data) if newest is not None else None
            if not runtime.agree_any(local is None):
                assert newest is not None
                self.restored_from, restored = "local", (local, newest)
                log.info("restored step %d, the store's newest, from %s", newest, self._where())
            else:
                restored = checkpoints.restore_newest(template, agree)
        if not runtime.agree_same(-1 if restored is None else restored[1]):  # never a world over different steps
            raise RuntimeError(f"the processes of world {self.version} restored different steps")
        return restored

    def _read(self, step: int, template: Any, data: Any) -> Any:
        """This host's copy of `step` (its data iterator set to the copy's position), or None."""
        got = self.local.read(step, template, data) if self.local else None
        if got is None:
            return None
        state, data_state = got
        if data is not None:
            data.set_state(data_state)
        return state

    def _where(self) -> str:
        return f"the local copy in {self.local and self.local.dir}" if self.restored_from == "local" else "the store"

    def keep_local(self, step: int, state: Any, checkpoints: Any) -> None:
        """A process that will start again in the next world keeps its save of the change on its own disk."""
        if self.local is not None and self.exit_code == WORLD_CHANGED_RC:
            data, is_global = getattr(checkpoints, "data", None), getattr(checkpoints, "data_is_global", False)
            self.local.keep(step, state, data, is_global, self.version)

    def stop(self) -> None:
        self.left = True
        self.watch.stop()


def _newest_step(checkpoints: Any) -> int | None:
    """The store's newest step, or None for a checkpointer that cannot say (then the local copy is not used)."""
    newest = getattr(checkpoints, "latest_step", None)
    return newest() if callable(newest) else None
