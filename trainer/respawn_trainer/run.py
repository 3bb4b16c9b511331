"""`Run`: one attempt of a training job, seen from inside the user's own loop.

    with Run(steps=STEPS) as run:                 # the notice watch, JAX setup, the compilation cache
        state, step = run.restore(init_state)     # the newest checkpoint, else init_state()
        while run.keep_going(step):               # False at STEPS, or once any host got the notice
            state = train_step(state, step)       # (or with data=iterator in restore: next(run.data))
            step += 1
            run.step_done(step, state)            # saves on schedule (Young/Daly); `progress` entries
        run.finish(step, state)                   # the last save; `completed` or `stopped`

An exception inside the block waits for a save under way, sends `failed` and propagates (exit non-zero).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from respawn_trainer import runtime
from respawn_trainer.checkpoint import forget_listings
from respawn_trainer.env import ConfigError, RunEnv, load_env
from respawn_trainer.failures import classify, one_line
from respawn_trainer.goodput import Goodput, process_started
from respawn_trainer.handover import Handover, objects_for, take_over
from respawn_trainer.lifecycle import Lifecycle, NullSink, open_sink
from respawn_trainer.notice import PreemptionWatch, leave_notice, on_gce
from respawn_trainer.schedule import SaveDone, SaveSchedule, save_policy
from respawn_trainer.world import WORLD_CHANGED_RC, Membership, WorldChanged, next_world, say_ready

if TYPE_CHECKING:
    from respawn_trainer.checkpoint import Checkpointer

log = logging.getLogger("trainer")
RESTORE_FAILED_WAIT_S = 60.0  # how long a host that could not read a step waits for the others to agree


class _Saving:
    """A run's saves: on schedule and the last, Young/Daly's interval, and their `checkpoint` entries (Run's)."""

    checkpoints: Checkpointer
    schedule: SaveSchedule
    goodput: Goodput
    handover: Handover | None
    lifecycle: Lifecycle
    step: int
    _fields: dict[str, Any]
    _saved_fields: dict[int, dict[str, Any]]
    _first_save_at: float

    def _save_last(self, state: Any) -> None:
        if self.schedule.should_save(self.step, loop_ended=True):
            self._save(state)
        self._report(self.checkpoints.wait())

    def _save(self, state: Any) -> None:
        _wait_until_computed(state)  # the step itself finishes before the save's clock starts
        blocking = self.checkpoints.save(self.step, state)
        self._saved_fields[self.step] = self._fields
        self._first_save_at = self._first_save_at or time.monotonic()  # Young/Daly times the steps from here
        before = self.schedule.interval()
        # Every host must pick the same Young/Daly interval: they agree on the slowest save.
        cost = runtime.agree_max(blocking) if self.schedule.young_daly is not None else blocking
        self.schedule = self.schedule.saved(self.step, cost)
        if self.schedule.interval() != before:
            self._log_interval()
        self.goodput.saved(blocking)

    def _log_interval(self) -> None:
        young_daly, context = self.schedule.young_daly, self.schedule.context()
        assert young_daly is not None
        log.info(
            "checkpoint interval: auto -> every %s steps (Young/Daly tau %.1fs from save cost %.3fs, MTBI %.0fs, "
            "step %.4fs)",
            young_daly.interval(context),
            young_daly.tau_s(context),
            context.save_cost_s,
            young_daly.mtbi_s,
            context.step_s or 0.0,
        )

    def _report(self, saves: list[SaveDone]) -> None:
        for done in saves:
            if self.handover:
                self.handover.saved(done.total_s)
            self.lifecycle.emit(
                "checkpoint",
                done.step,
                blocking_s=round(done.blocking_s, 4),
                total_s=round(done.total_s, 4),
                **self._saved_fields.pop(done.step, {}),
            )


class Run(_Saving):
    def __init__(
        self,
        steps: int,
        *,
        checkpoint_every: int | None = None,
        keep: int = 3,
        checkpointer: Checkpointer | None = None,
        env: Mapping[str, str] | None = None,
        distributed: str = "auto",
        use_jax: bool = True,
        started: float | None = None,
    ) -> None:
        """steps: the job's total. checkpoint_every: N steps, or None for Young/Daly from the measured save cost
        and RESPAWN_MTBI_S. checkpointer: default Orbax `Checkpoints` on RESPAWN_CHECKPOINT_URI.
        distributed: auto (multi-host when TPU_WORKER_HOSTNAMES lists several hosts), on or off.
        use_jax False: no JAX setup at all (a checkpointer of your own, host-side state)."""
        began = time.monotonic()
        self.goodput = Goodput(started=started if started is not None else process_started())  # every world's
        self._world_began = self.goodput.started  # this world's start: the process's, or its re-form's
        environ = os.environ if env is None else env
        self.env: RunEnv = load_env(environ, on_gce=on_gce())
        self.steps, self.step = steps, 0
        self._sink = open_sink(self.env.log_sink, self.env.job_id, self.env.attempt, self.env.metadata_url)
        # A world of several slices (RESPAWN_WORLD_VERSION): joined before JAX, whose runtime spans the whole world
        ready = functools.partial(say_ready, self.env, self._sink)  # a replacement, warm, waiting to be let in
        self.world = Membership.join(self.env, ready) if self.env.world_version is not None else None
        self.handover = Handover(self.env, objects_for(self.env)) if self.env.handover else None
        train_on = self.handover.on_notice if self.handover else None
        self.watch = PreemptionWatch(self.env.metadata_url, lead_s=self.env.notice_lead_s, train_on=train_on).start()
        self.lifecycle = Lifecycle(self._sink, *self._job_and_attempt(), self.world.fields() if self.world else None)
        self._startup_split = {"import_s": began - self.goodput.started}
        self._gc = _PausedGc()
        self._distributed, self._keep, self._user_checkpointer = distributed, keep, checkpointer
        try:
            if use_jax:
                runtime.configure(self.env, distributed, self.world.placement() if self.world else None)
            self._formed()
        except BaseException as e:
            self._failed(e)
            raise
        self._closed, self._loss = False, None
        self.data: TimedIterator | None = None
        self._fields: dict[str, Any] = {}  # of the newest step (step_done)
        self._saved_fields: dict[int, dict[str, Any]] = {}  # of each save not yet reported
        self._first_save_at = 0.0
        self.schedule = SaveSchedule(save_policy(checkpoint_every, self.env.mtbi_s), final_step=steps)
        self._ready_at = time.monotonic()
        self._startup_split["setup_s"] = self._ready_at - began

    def _job_and_attempt(self) -> tuple[str, int]:
        return self.env.job_id, self.env.attempt

    def _formed(self) -> None:
        """JAX's runtime is up (over the whole world, in one): who speaks for the attempt, and the checkpointer."""
        if self.world:
            self.world.formed()
            sink = self._sink if self.world.slice_lead else NullSink()
            self.lifecycle = Lifecycle(sink, *self._job_and_attempt(), self.world.fields())
        elif not runtime.is_primary():
            self.lifecycle = Lifecycle(NullSink(), *self._job_and_attempt())
        checkpointer = self._user_checkpointer
        if checkpointer is None:
            from respawn_trainer.checkpoint import Checkpoints

            checkpointer = Checkpoints(self.env.checkpoint_uri, self._keep, self.env.save_delay_s)
        self.checkpoints = checkpointer

    def reform(self) -> bool:
        """After a world of several slices stopped for a change (exit_code WORLD_CHANGED_RC): join the next world in
        this same process, on the machine it runs on. No container start, no imports, no device runtime to find
        again: JAX's runtime is left and initialized anew over the new world, the programs of a world size seen
        before come from the compilation cache, and restore() reads this host's local copy of the change's save.
        True: call restore() and run the loop again. False where no world with this slice comes within
        RESPAWN_REFORM_WAIT_S: the process then exits 75, and the startup script starts a new one in the next world.
        A world that cannot form here ends the process as at its start (WorldChanged: exit 75)."""
        if self.world is None or self.exit_code != WORLD_CHANGED_RC:
            return False
        began = time.monotonic()  # the world's start, here: its wait for the key included
        signal.signal(signal.SIGTERM, _noticed_while_waiting)  # everything is saved: a notice ends the wait
        found = next_world(self.env, self.world.version)
        if found is None:
            return False
        world, etag = found
        self.env = replace(self.env, world_version=world.version, takeover=None)  # a head start takes over once
        self._loss, self._fields, self._saved_fields, self.data = None, {}, {}, None  # nothing of the old devices'
        log.info("joining world %d in this process: slices %s", world.version, list(world.members))
        runtime.reset()
        forget_listings()  # the steps the old world committed, as a new process lists them
        self.world = Membership(self.env, world, etag)
        sink = self._sink if self.world.slice_lead else NullSink()
        self.lifecycle = Lifecycle(sink, *self._job_and_attempt(), self.world.fields())  # a failure names the new world
        try:
            runtime.configure(self.env, self._distributed, self.world.placement())
            self._formed()
        except BaseException as e:
            self._failed(e)
            raise
        train_on = self.handover.on_notice if self.handover else None
        self.watch = PreemptionWatch(self.env.metadata_url, lead_s=self.env.notice_lead_s, train_on=train_on).start()
        self._world_began = began  # the goodput goes on: the attempt's split sums every world of this process
        self._closed, self._startup_split = False, {"import_s": 0.0}
        self._ready_at = time.monotonic()
        self._startup_split["setup_s"] = self._ready_at - began
        return True

    # -- the loop's calls ---------------------------------------------------------------------------------------

    def restore(self, init: Any, template: Any = None, data: Any = None) -> tuple[Any, int]:
        """(state, step): the newest readable checkpoint, else the fresh state at step 0.

        init: the fresh state, or a function returning it (called only when there is no checkpoint).
        template: the restore target (shapes, dtypes, shardings); by default that of `init`.
        data: a data iterator with get_state()/set_state() (a Grain DatasetIterator, say), fresh: every save holds
        its state (each process its own; once, where the iterator says `state_is_global = True`, and then any
        process count restores it), and the restore sets it back to the restored step's. `run.data` is it,
        timed: `next(run.data)` counts its wait as `input_s`, not as training.

        On a head start's machine (RESPAWN_TAKEOVER) it first waits for the noticed machine's final save; a notice of
        its own meanwhile ends the process (exit 143, nothing to save)."""
        waited, outcome = 0.0, ""
        if self.env.takeover:
            if "jax" in sys.modules:  # Orbax's import, on the way to the restore: now, while the noticed machine saves
                from respawn_trainer.checkpoint import _orbax

                _orbax()
            outcome, waited = take_over(self.env, objects_for(self.env), self.watch, runtime.is_primary())
            if outcome == "stopped":
                raise NoticedBeforeStart(143)
        began = time.monotonic()
        if data is not None:
            follow = getattr(self.checkpoints, "follow", None)
            if follow is None:
                raise TypeError(f"data: {type(self.checkpoints).__name__} cannot save a data iterator's state")
            follow(data)
            self.data = TimedIterator(data, self.goodput)
        if template is None:
            template = _template(init)
        if self.world:
            restored = self.world.restore(self.checkpoints, template, agree_after_restore)
        else:
            restored = self.checkpoints.restore_newest(template, agree_after_restore)
        if restored is None:
            state, step = (init() if callable(init) else init), 0
        else:
            state, step = restored
        read = time.monotonic()
        runtime.programs_ready()  # those compiled() loads in the background meanwhile
        if self.world and self.world.stale():  # a newer world before the first step: leave it without training
            self.world.exit_code = WORLD_CHANGED_RC
            self.close(prune=False)
            raise WorldChanged("a newer world came before the first step")
        now = time.monotonic()
        self.step = step
        self.schedule = SaveSchedule(self.schedule.policy, final_step=self.steps, restored_step=step)
        self.goodput.startup_s += began - waited - self._world_began + now - read
        self.goodput.restore_s += read - began
        compile_s = began - self._ready_at + now - read
        split = {**self._startup_split, "compile_s": compile_s - waited, "restore_s": read - began}
        takeover = {"takeover": outcome} if self.env.takeover else {}  # "found": the drain marker; "timeout": none
        if self.env.takeover:
            split["takeover_wait_s"] = waited
        if self.world:
            takeover["restored_from"] = self.world.restored_from  # "local": this host's copy of the change's save
        startup = now - waited - self._world_began
        self.lifecycle.emit(
            "started",
            step,
            restored_step=step,
            startup_s=round(startup, 3),
            **{k: round(v, 3) for k, v in split.items()},
            **takeover,
        )
        log.info("started at step %d of %d (startup %.2fs, restore %.2fs)", step, self.steps, startup, read - began)
        self._gc.resume()
        self._last_step_at = self._progress_at = now
        self._first_save_at = 0.0
        return state, step

    def keep_going(self, step: int) -> bool:
        """False once `steps` are done, or when any host has the preemption notice (every host agrees); in a world,
        also when a newer world wants it stopped (exit_code then says how the process ends)."""
        if self.world and step < self.steps:
            return self.world.keep_going(step, self.watch.noticed)
        return step < self.steps and not runtime.agree_any(self.watch.noticed)

    @property
    def exit_code(self) -> int:
        """The process's exit code once finished: 0, or WORLD_CHANGED_RC (75) where its world changed and it is to be
        started again in the new one (a world's slice that did not have the notice itself)."""
        return self.world.exit_code if self.world else 0

    def step_done(self, step: int, state: Any, loss: Any = None, **fields: Any) -> None:
        """After each step: a `progress` entry at most every RESPAWN_PROGRESS_S, a save when one is due. `fields`
        (JSON values of the caller's own, of this step) join the `checkpoint` entry of a save of this step."""
        self.step, self._loss, self._fields = step, loss, fields
        now = time.monotonic()
        self.goodput.steps(now - self._last_step_at)
        if now - self._progress_at >= self.env.progress_s:
            self.lifecycle.emit("progress", step, loss=_finite(loss), worker=self.env.worker_id or 0)
            self._progress_at = time.monotonic()
        if self.schedule.should_save(step):
            self._save(state)
        elif self.schedule.wants_step_time(step):
            _wait_until_computed(state)  # the timed steps
            seconds = (time.monotonic() - self._first_save_at) / (step - self.schedule.last_saved)
            self.schedule = self.schedule.measured(runtime.agree_max(seconds))
            self._log_interval()
        self._report(self.checkpoints.poll())
        self._last_step_at = time.monotonic()

    def finish(self, step: int, state: Any, params: Any = None, **fields: Any) -> str:
        """The last save, then `completed` (step >= steps, with `params_sha256` of `params`, by default of the
        whole state) or `stopped` (the notice), each with `fields` of the caller's own (JSON values) added.
        Returns the event sent."""
        self.step, self._fields = step, fields
        if step < self.steps and self.exit_code == 0:
            leave_notice(self.env.notice_file)
        self._save_last(state)
        if self.world and step < self.steps:
            runtime.barrier("saved")  # every process's part, and process 0's commit, before any lists the store
            self.world.keep_local(step, state, self.checkpoints)
        if self.handover and self.watch.noticed_at is not None and runtime.is_primary():  # done, or trained to the end
            self.handover.drained(self.env.job_id, self.env.attempt, step)
        if step >= self.steps:
            digest = state_sha256(state if params is None else params)
            loss = _finite(state.get("loss") if isinstance(state, dict) and "loss" in state else self._loss)
            kept = _keep_final(self.checkpoints, step) if runtime.is_primary() else {}
            self.lifecycle.emit(
                "completed",
                step,
                final_loss=loss,
                params_sha256=digest,
                goodput=self.goodput.summary(),
                **kept,
                **fields,
            )
            log.info("completed step %d: loss %.4f params_sha256 %s", step, loss or 0.0, digest)
            event = "completed"
        elif self.exit_code == WORLD_CHANGED_RC:
            self.lifecycle.emit("stopped", step, reason="world-changed", goodput=self.goodput.summary(), **fields)
            log.info("world changed: stopped at step %d, saved; exit %d", step, WORLD_CHANGED_RC)
            event = "stopped"
        else:
            self.lifecycle.emit("stopped", step, reason="preempted", goodput=self.goodput.summary(), **fields)
            took = time.monotonic() - (self.watch.noticed_at or time.monotonic())
            level = logging.INFO if took <= self.env.grace_s else logging.WARNING
            log.log(
                level, "stopped at step %d, saved %.2fs after the notice (grace %.0fs)", step, took, self.env.grace_s
            )
            event = "stopped"
        self.close(prune=event == "completed")
        return event

    def close(self, *, prune: bool = True) -> None:
        """Release the checkpointer, the notice watch and the distributed runtime (finish() does it).

        prune False, for a machine about to be taken away once its last save is durable: the deletion of old
        steps still under way in the background is not waited for (the next attempt removes what is left)."""
        self._gc.resume()
        if not self._closed:
            self._closed = True
            if prune:
                self.checkpoints.close()
            runtime.shutdown()
        self.watch.stop()
        if self.world:
            self.world.stop()

    # -- context: failures and teardown -------------------------------------------------------------------------

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is not None:
            self._failed(error)
            self.watch.stop()
            return
        self.close()

    def _failed(self, error: BaseException) -> None:
        """Keep a save that was already under way, then tell the control plane (no entry for Ctrl-C)."""
        self._gc.resume()
        if isinstance(error, (KeyboardInterrupt, NoticedBeforeStart, WorldChanged)):
            return
        failure = classify(error)  # its cause and fix, and whether another machine would do better
        log.error("failed: %s", failure.text, exc_info=not isinstance(error, ConfigError))
        try:
            self._report(self.checkpoints.wait())
        except AttributeError:
            pass  # failed before the checkpointer existed
        except Exception as late:
            log.warning("the pending checkpoint did not complete: %s", one_line(late))
        permanent = {"permanent": True} if failure.permanent else {}  # no other machine would do better
        summary = self.goodput.summary(lost=True)
        self.lifecycle.emit("failed", self.step, error=failure.text, goodput=summary, **permanent)


def agree_after_restore(failed: bool) -> bool:
    """Did any host fail to read the step? A host that read it passed Orbax's barrier after the read, so
    every host did. A host that failed meets the others here if they failed too (an unreadable step);
    if they are waiting in Orbax's barrier instead, its wait times out and the slice fails, rather than
    hang (a step only some hosts can read: a lost shard, or a transient read error)."""
    runtime.barrier("restored", RESTORE_FAILED_WAIT_S if failed else runtime.BARRIER_TIMEOUT_S)
    return runtime.agree_any(failed)


def _keep_final(checkpoints: Any, step: int) -> dict[str, str]:
    """The final save, kept past the checkpoint bucket's retention (Checkpoints.keep_final): {"final_weights":
    where}, or nothing for a checkpointer of the user's own or when the copy failed (said in the log)."""
    keep = getattr(checkpoints, "keep_final", None)
    if keep is None:
        return {}
    try:
        where = str(keep(step))
    except Exception as e:
        log.warning("could not keep the final checkpoint past the bucket's retention: %s", one_line(e))
        return {}
    log.info("final weights kept at %s", where)
    return {"final_weights": where}


class TimedIterator:
    """The loop's data iterator, each next() timed as the goodput's input_s; get_state/set_state pass through."""

    def __init__(self, iterator: Any, goodput: Goodput) -> None:
        self.iterator, self._goodput = iterator, goodput

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        began = time.monotonic()
        try:
            return next(self.iterator)
        finally:
            self._goodput.waited_for_input(time.monotonic() - began)

    def get_state(self) -> Any:
        return self.iterator.get_state()

    def set_state(self, state: Any) -> None:
        self.iterator.set_state(state)


class NoticedBeforeStart(SystemExit):
    """A head start's trainer got the notice before it took over, or a world's survivor while it waited for its next
    world: it exits 143 (SIGTERM's), having nothing (more) to save."""


def _noticed_while_waiting(signum: int, frame: Any) -> None:
    log.warning("preemption notice while waiting for the next world: nothing to save, exit 143")
    raise NoticedBeforeStart(143)


class _PausedGc:
    """Python's cyclic garbage collector, paused from Run() to the end of restore(): the start's imports and setup
    allocate hundreds of thousands of objects that live as long as the process, and collecting them again and
    again took a sixth of the CPU time of importing jax, optax and orbax (0.12 s of 0.69 s, measured). Resumed
    with everything allocated so far frozen (gc.freeze), so later collections skip it too."""

    def __init__(self) -> None:
        self._paused = gc.isenabled()  # a program that turned it off itself keeps it off
        gc.disable()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            gc.freeze()
            gc.enable()


def _template(init: Any) -> Any:
    """The restore target of `init` without computing it when it is a function (jax.eval_shape)."""
    if "jax" not in sys.modules:
        return init() if callable(init) else init
    import jax

    if callable(init):
        return jax.eval_shape(init)
    from respawn_trainer.checkpoint import abstract

    return abstract(init)


def _wait_until_computed(state: Any) -> None:
    if "jax" in sys.modules:
        import jax

        jax.block_until_ready(state)


def _finite(loss: Any) -> float | None:
    """The loss as a float for an entry, or None (none given, not a number, not finite)."""
    try:
        value = float(loss)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def state_sha256(state: Any) -> str:
    """sha256 over (path, dtype, shape, bytes) of every leaf's global value, in sorted path order: equal iff
    bitwise equal, and the same on every process of a multi-host job (a collective: every process calls it).
    State without JAX: the sha256 of its JSON."""
    if "jax" not in sys.modules:
        return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()
    import jax
    import numpy as np

    runtime.barrier("fingerprint")  # after the final save, which ends at different times on each host
    digest = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        host = _global_value(leaf)
        digest.update(f"{jax.tree_util.keystr(path)}|{host.dtype.str}|{host.shape}|".encode())
        digest.update(np.ascontiguousarray(host).tobytes())
    return digest.hexdigest()


def _global_value(leaf: Any) -> Any:
    """The whole array on the host; a leaf sharded over other processes' devices is gathered (a collective)."""
    import jax
    import numpy as np

    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)
