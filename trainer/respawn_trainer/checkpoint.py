"""Checkpoints on a local path or gs:// through Orbax's CheckpointManager.

Saves are async: `save` blocks only while the arrays are copied off the device; the write and the
atomic commit (rename on a file system, commit_success.txt on GCS) finish in the background, so a
crash at any moment leaves either a complete step or none. Steps beyond the newest `keep` are deleted
in the background too, off the save's path; a deletion cut short leaves an old step that the next
attempt removes (at start when its commit marker is gone, else at a save beyond `keep`).
`restore_newest` walks back from the newest step when one cannot be read.

A data iterator followed by `follow(data)` (get_state()/set_state(): a Grain iterator, say) is saved in the same
step as the state, so the step commits both or neither; its state is read at the save call, and set back on the
iterator by the restore of that step. Each process saves its own (`data/process_<i>-of-<n>.json`, Grain's own layout),
restored on as many processes only; an iterator whose state is the same on every process, a position in one global
stream (`state_is_global = True`, as the demo trainer's `Stream`), is saved once (`data/global.json`, by process 0)
and restored on any process count: a tier of another host count resumes it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from respawn_trainer.schedule import SaveDone

log = logging.getLogger("trainer")


@functools.cache
def _orbax() -> Any:
    """orbax.checkpoint, imported at the first checkpoint operation rather than at import (a sixth of a second:
    a restart's compiled program loads meanwhile). It imports google-cloud-logging (half a second) for an
    optional logger respawn does not use: hidden for that one import, so a restart does not pay for it."""
    hidden = "google.cloud.logging" not in sys.modules
    if hidden:
        sys.modules["google.cloud.logging"] = None  # type: ignore[assignment]  # makes that import fail fast
    try:
        import orbax.checkpoint as ocp
    finally:
        if hidden:
            del sys.modules["google.cloud.logging"]
    import jax

    # A replicated leaf is written by its replicas together, a slice each, only where a slice is this large: a
    # norm's scale split 16 ways is 16 tiny writes, and a slicing program each host compiles at its first save
    handler = ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    _coordination_barriers()
    return ocp


def _coordination_barriers() -> None:
    """Orbax's barriers between processes (about ten a save, two at a CheckpointManager's start) as waits at JAX's
    coordination service, a gRPC call each, rather than its default: a device collective each, whose program every
    world compiles anew and whose first call waits for it on every process (0.1-0.6 s of a world re-formed in
    place, measured on the local cloud). Orbax's own switch, an absl flag it reads at each barrier (marked
    experimental in the installed 0.12); set as a command line would, unless the program's command line set it."""
    from absl import flags

    flag = flags.FLAGS["experimental_orbax_use_distributed_barrier"]
    if not flag.present:
        flag.parse("true")


MIN_REPLICA_SLICE_BYTES = 1 << 20


class Checkpointer(Protocol):
    """Where a run's state goes: `Checkpoints` (Orbax) for JAX pytrees, or anything that keeps these promises.

    `wait` makes every save durable; `close` releases the rest and is skipped when a run stops for the notice."""

    def restore_newest(self, template: Any, agree_any: Callable[[bool], bool]) -> tuple[Any, int] | None: ...
    def save(self, step: int, state: Any) -> float: ...
    def poll(self) -> list[SaveDone]: ...
    def wait(self) -> list[SaveDone]: ...
    def close(self) -> None: ...


class Checkpoints:
    def __init__(self, uri: str, keep: int, save_delay_s: float = 0.0) -> None:
        self.uri, self.keep, self.save_delay_s = uri, keep, save_delay_s
        self._manager: Any = None
        self._pending: tuple[int, float, float] | None = None  # step, started, blocking_s
        self._finished: list[SaveDone] = []  # durable, not yet reported
        self.data: Any = None  # the iterator whose state each step holds beside the state (follow())
        self.data_is_global = False  # its state is the same on every process: saved once, restored on any count

    def follow(self, data: Any) -> None:
        """Save `data.get_state()` with every step from now on, and restore it with the state. An iterator with
        `state_is_global = True` says its state is the same on every process (one stream position): it is saved
        once and restored on any process count."""
        for method in ("get_state", "set_state"):
            if not callable(getattr(data, method, None)):
                raise TypeError(f"data: {type(data).__name__} has no {method}(); a Grain DatasetIterator has both")
        self.data = data
        self.data_is_global = getattr(data, "state_is_global", False) is True

    @property
    def manager(self) -> Any:
        """Orbax's CheckpointManager, made at the first use."""
        if self._manager is None:
            ocp = _orbax()
            delay = self.save_delay_s
            async_options = ocp.AsyncOptions(post_finalization_callback=_sleeper(delay)) if delay else None
            self._manager = ocp.CheckpointManager(
                self.uri,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=self.keep,
                    cleanup_tmp_directories=True,
                    enable_background_delete=True,
                    lightweight_initialize=True,
                    enable_async_checkpointing=True,
                    async_options=async_options,
                ),
            )
        return self._manager

    def restore_newest(
        self, abstract_state: Any, agree_any: Callable[[bool], bool] = lambda flag: flag
    ) -> tuple[Any, int] | None:
        """The newest readable checkpoint (state, step), or None when there is none at all.

        `abstract_state` carries the target shardings: each process reads the shards its devices hold. A step
        that any process cannot read is unreadable for all (`agree_any`), so every host restores the same step.
        Unreadable steps newer than the restored one are removed (a later save reuses their numbers).
        When steps exist but none can be read, this raises: starting over would discard them all.
        """
        unreadable: list[int] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            error: str | None = None
            try:
                state = self._restore(step, abstract_state)
            except Exception as e:  # any reason a step cannot be read: fall back to the previous one
                error = _error_line(e)
                log.warning("checkpoint step %d cannot be read (%s); trying the previous one", step, error)
            if agree_any(error is not None):
                if error is None:
                    log.warning("checkpoint step %d cannot be read on another host; trying the previous one", step)
                unreadable.append(step)
                continue
            for bad in unreadable:
                log.warning("removing unreadable checkpoint step %d (restored step %d instead)", bad, step)
                self.manager.delete(bad)
            return state, step
        if unreadable:
            raise RuntimeError(f"no checkpoint can be read (steps {sorted(unreadable)})")
        return None

    def restore_alone(self, step: int, abstract_state: Any) -> Any:
        """Step `step` read by this process alone, none of Orbax's barriers with the other processes (its options
        for a single active process): a process new to a world whose other processes restore their own copies of
        that step (world.Membership.restore). None where it cannot be read (logged)."""
        import jax

        ocp = _orbax()
        me = jax.process_index()
        only_me = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
        options = ocp.CheckpointManagerOptions(read_only=True, create=False, multiprocessing_options=only_me)
        alone = ocp.CheckpointManager(self.uri, options=options)
        try:
            return self._restore(step, abstract_state, alone)
        except Exception as e:  # any reason it cannot be read: the world then restores from the store together
            log.warning("checkpoint step %d cannot be read by this process alone (%s)", step, _error_line(e))
            return None
        finally:
            alone.close()

    def latest_step(self) -> int | None:
        """The newest step in the store (committed), None when there is none."""
        return max(self.manager.all_steps(), default=None)

    def save(self, step: int, state: Any) -> float:
        """Start an async save; returns the seconds training was blocked (waiting for a previous save included)."""
        started = time.monotonic()
        self._collect()
        ocp = _orbax()
        args = ocp.args.StandardSave(state)
        if self.data is not None:
            data = _iterator_args()[0](self.data.get_state(), self.data_is_global)
            args = ocp.args.Composite(state=args, data=data)
        self.manager.save(step, args=args, force=True)
        blocking = time.monotonic() - started
        self._pending = (step, started, blocking)
        return blocking

    def _restore(self, step: int, abstract_state: Any, manager: Any = None) -> Any:
        ocp = _orbax()
        manager = manager or self.manager
        if self.data is None:
            return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
        restore = _iterator_args()[1]
        both = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=restore(self.data))
        return manager.restore(step, args=both)["state"]

    def poll(self) -> list[SaveDone]:
        """Saves that have become durable since the last call (non-blocking)."""
        if self._pending is not None and not self.manager.is_saving_in_progress():
            self._collect()
        done, self._finished = self._finished, []
        return done

    def wait(self) -> list[SaveDone]:
        """Block until the pending save is durable (raises if it failed); returns it and any unreported ones."""
        self._collect()
        done, self._finished = self._finished, []
        return done

    def _collect(self) -> None:
        if self._pending is not None:
            self.manager.wait_until_finished()
            step, started, blocking = self._pending
            self._pending = None
            self._finished.append(SaveDone(step, blocking, time.monotonic() - started))

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()

    def keep_final(self, step: int) -> str:
        """Copy step `step` (durable) where the checkpoint bucket's retention rule never deletes it (`final_uri`);
        returns where. A local checkpoint directory has no such rule: its step stays where it is."""
        source = f"{self.uri.rstrip('/')}/{step}"
        if not self.uri.startswith("gs://"):
            return source
        import gcsfs

        target = final_uri(self.uri, step)
        gcsfs.GCSFileSystem().copy(source, target, recursive=True)  # a server-side rewrite, object by object
        return target


def warm_store(uri: str) -> None:
    """For a process that waits before it may start (a replacement slice, warm until its world lets it in): the
    store's client made and the checkpoint directory asked for once now, through the filesystem Orbax's paths use,
    so that the world's restore does not wait for the client's first request in this process (its credentials, a
    session, the bucket's type). A failure here is the restore's to report."""
    from etils import epath

    try:
        epath.Path(uri).exists()
    except Exception as e:  # any: the restore asks again and says what is wrong
        log.debug("warming the checkpoint store's client: %s", _error_line(e))


def forget_listings() -> None:
    """Drop the Cloud Storage listings this process has cached. gcsfs keeps each listing it made (fsspec's dircache)
    until a write of its own changes it, and its filesystems live as long as the process (fsspec's instance cache,
    which Orbax's paths go through): a process that joins another world in place (run.Run.reform) would not see the
    steps the old world's process 0 committed, and would restore another step than its peers."""
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None:
        return
    for kind in (gcsfs.GCSFileSystem, *gcsfs.GCSFileSystem.__subclasses__()):
        for fs in list(getattr(kind, "_cache", {}).values()):
            fs.invalidate_cache()


# A finished job's final checkpoint is kept under this prefix of its bucket, which the bucket's retention rule spares
# (infra/terraform/storage.tf: the rule deletes only under runs/, where job messages put their checkpoint_uri)
FINAL_PREFIX = "final"


def final_uri(uri: str, step: int) -> str:
    """gs://BUCKET/final/PATH/STEP for the checkpoints gs://BUCKET/PATH."""
    bucket, _, path = uri.removeprefix("gs://").rstrip("/").partition("/")
    return f"gs://{bucket}/{FINAL_PREFIX}/{path + '/' if path else ''}{step}"


@functools.cache
def _iterator_args() -> tuple[Any, Any]:
    """Orbax's save and restore arguments of a data iterator's state, registered with their handler at first use."""
    ocp = _orbax()

    class IteratorStateHandler(ocp.CheckpointHandler):  # type: ignore[misc,name-defined]
        """The iterator's state in the step (JSON; a bytes state as its text), read back into the iterator. A global
        state (the same on every process) is one file, written by process 0 and read by every process, whatever
        their count; otherwise each process writes and reads its own, and a process count other than the saved
        one finds no file for it, so that step is unreadable."""

        def save(self, directory: Any, args: Any) -> None:
            state = args.state.decode() if isinstance(args.state, bytes) else json.dumps(args.state)
            if not args.is_global:
                (directory / _process_file()).write_text(state)
            elif _process_index() == 0:
                (directory / GLOBAL_FILE).write_text(state)

        def restore(self, directory: Any, args: Any) -> Any:
            path = directory / GLOBAL_FILE
            if not path.exists():
                path = directory / _process_file()
            if not path.exists():
                saved = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
                raise FileNotFoundError(
                    f"{path}: no data iterator state for this process (the step holds {', '.join(saved) or 'none'}):"
                    " a per-process state restores on as many processes as saved it; an iterator whose state is the"
                    " same on every process says so with state_is_global = True, and restores on any count"
                )
            text = path.read_text()
            args.iterator.set_state(text.encode() if isinstance(args.iterator.get_state(), bytes) else json.loads(text))
            return args.iterator

    @ocp.args.register_with_handler(IteratorStateHandler, for_save=True)
    @dataclasses.dataclass
    class IteratorSave(ocp.args.CheckpointArgs):  # type: ignore[misc,name-defined]
        state: Any
        is_global: bool = False

    @ocp.args.register_with_handler(IteratorStateHandler, for_restore=True)
    @dataclasses.dataclass
    class IteratorRestore(ocp.args.CheckpointArgs):  # type: ignore[misc,name-defined]
        iterator: Any

    return IteratorSave, IteratorRestore


GLOBAL_FILE = "global.json"  # a global iterator state, in the step's data/


def _process_file() -> str:
    import jax

    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


def _process_index() -> int:
    import jax

    return int(jax.process_index())


def abstract(state: Any) -> Any:
    """Shapes, dtypes and shardings of `state`: the restore target."""
    import jax

    return jax.tree.map(_orbax().utils.to_shape_dtype_struct, state)


def _sleeper(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def _error_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text[:300]
