"""Checkpoints on a local path or gs:// through Orbax's CheckpointManager.

Saves are async: `save` blocks only while the arrays are copied off the device; the write and the
atomic commit (rename on a file system, commit_success.txt on GCS) finish in the background, so a
crash at any moment leaves either a complete step or none. Steps beyond the newest `keep` are deleted
in the background too, off the save's path; a deletion cut short leaves an old step that the next
attempt removes (at start when its commit marker is gone, else at a save beyond `keep`).
`restore_newest` walks back from the newest step when one cannot be read.
"""

from __future__ import annotations

import functools
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
    return ocp


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
                state = self.manager.restore(step, args=_orbax().args.StandardRestore(abstract_state))
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

    def save(self, step: int, state: Any) -> float:
        """Start an async save; returns the seconds training was blocked (waiting for a previous save included)."""
        started = time.monotonic()
        self._collect()
        self.manager.save(step, args=_orbax().args.StandardSave(state), force=True)
        blocking = time.monotonic() - started
        self._pending = (step, started, blocking)
        return blocking

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


# A finished job's final checkpoint is kept under this prefix of its bucket, which the bucket's retention rule spares
# (infra/terraform/storage.tf: the rule deletes only under runs/, where job messages put their checkpoint_uri)
FINAL_PREFIX = "final"


def final_uri(uri: str, step: int) -> str:
    """gs://BUCKET/final/PATH/STEP for the checkpoints gs://BUCKET/PATH."""
    bucket, _, path = uri.removeprefix("gs://").rstrip("/").partition("/")
    return f"gs://{bucket}/{FINAL_PREFIX}/{path + '/' if path else ''}{step}"


def abstract(state: Any) -> Any:
    """Shapes, dtypes and shardings of `state`: the restore target."""
    import jax

    return jax.tree.map(_orbax().utils.to_shape_dtype_struct, state)


def _sleeper(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def _error_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text[:300]
