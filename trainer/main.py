"""The trainer's imperative shell: config, watch, engine, the training loop, lifecycle entries, exit code.

Exit codes: 0 completed, 0 stopped after the preemption save, 1 failed (a `failed` entry was sent),
2 bad configuration (one line on stderr, and a `failed` entry when the environment allows one).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from trainer.config import Config, ConfigError, help_text, load_config, parse_env
from trainer.goodput import Goodput
from trainer.lifecycle import Lifecycle, NullSink, open_sink
from trainer.preemption import PreemptionWatch, on_gce
from trainer.schedule import SaveDone, Schedule

log = logging.getLogger("trainer")


class Engine(Protocol):
    def restore(self) -> int: ...
    def run_step(self, step: int) -> None: ...
    def loss(self) -> float: ...
    def save(self, step: int) -> float: ...
    def poll(self) -> list[SaveDone]: ...
    def wait(self) -> list[SaveDone]: ...
    def agree(self, flag: bool) -> bool: ...
    def agree_max(self, value: float) -> float: ...
    def fingerprint(self) -> str: ...
    def close(self) -> None: ...


class Trainer:
    def __init__(self, cfg: Config, engine: Engine, lifecycle: Lifecycle, watch: PreemptionWatch, goodput: Goodput):
        self.cfg, self.engine, self.lifecycle, self.watch, self.goodput = cfg, engine, lifecycle, watch, goodput
        self.step = 0

    def run(self) -> int:
        cfg, engine, goodput = self.cfg, self.engine, self.goodput
        ready = time.monotonic()
        self.step = restored = engine.restore()
        now = time.monotonic()
        goodput.startup_s, goodput.restore_s = ready - goodput.started, now - ready
        startup = now - goodput.started
        self.lifecycle.emit("started", restored, restored_step=restored, startup_s=round(startup, 3))
        log.info("started at step %d of %d (startup %.2fs, restore %.2fs)", restored, cfg.steps, startup, now - ready)
        schedule = Schedule(fixed=cfg.checkpoint_every, last_saved=restored, mtbi_s=cfg.mtbi_s)
        window = (time.monotonic(), restored)
        progress_at = window[0]  # the `started` entry is the first sign of life
        first_save_at = 0.0
        while self.step < cfg.steps and not engine.agree(self.watch.noticed):
            began = time.monotonic()
            engine.run_step(self.step + 1)
            self.step += 1
            if self.step % cfg.log_every == 0:
                window = self._progress(window)
            if time.monotonic() - progress_at >= cfg.progress_s:
                progress_at = self._progress_entry()
            blocking = 0.0
            if self.step < cfg.steps and schedule.due(self.step):
                engine.loss()  # the step itself finishes before the save's clock starts
                blocking = engine.save(self.step)
                first_save_at = first_save_at or time.monotonic()
                self._saved(schedule, blocking)
            elif schedule.measuring(self.step):
                self._choose_interval(schedule, first_save_at)
            goodput.steps(time.monotonic() - began - blocking)
            if blocking:
                goodput.saved(blocking)
            self._report(engine.poll())
        if self.step >= cfg.steps:
            return self._complete(schedule)
        return self._stop(schedule)

    def _choose_interval(self, schedule: Schedule, first_save_at: float) -> None:
        self.engine.loss()  # wait for the timed steps
        steps = self.step - schedule.last_saved
        schedule.measure(self.engine.agree_max((time.monotonic() - first_save_at) / steps))
        self._log_interval(schedule)

    def _saved(self, schedule: Schedule, blocking: float) -> None:
        before = schedule.every
        # Every host must pick the same interval: they agree on the slowest save.
        schedule.saved(self.step, self.engine.agree_max(blocking) if schedule.fixed is None else blocking)
        if schedule.every != before:
            self._log_interval(schedule)

    def _log_interval(self, schedule: Schedule) -> None:
        log.info(
            "checkpoint interval: auto -> every %s steps (Young/Daly tau %.1fs from save cost %.3fs, MTBI %.0fs, "
            "step %.4fs)",
            schedule.every,
            schedule.tau_s(),
            schedule.save_cost_s,
            schedule.mtbi_s,
            schedule.step_s or 0.0,
        )

    def _progress(self, window: tuple[float, int]) -> tuple[float, int]:
        loss = self.engine.loss()
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {self.step}")
        now = time.monotonic()
        rate = (self.step - window[1]) / max(now - window[0], 1e-9)
        log.info("step %d/%d loss %.4f %.1f steps/s", self.step, self.cfg.steps, loss, rate)
        return now, self.step

    def _progress_entry(self) -> float:
        """A `progress` entry (at most one per RESPAWN_PROGRESS_S): the control plane's sign that steps go on."""
        loss = self.engine.loss()
        worker = self.cfg.worker_id or 0
        self.lifecycle.emit("progress", self.step, loss=loss if math.isfinite(loss) else None, worker=worker)
        return time.monotonic()

    def _report(self, saves: list[SaveDone]) -> None:
        for done in saves:
            self.lifecycle.emit(
                "checkpoint", done.step, blocking_s=round(done.blocking_s, 4), total_s=round(done.total_s, 4)
            )

    def _save_now(self, schedule: Schedule) -> None:
        if self.step > schedule.last_saved:
            self.engine.loss()
            blocking = self.engine.save(self.step)
            self._saved(schedule, blocking)
            self.goodput.saved(blocking)
        self._report(self.engine.wait())

    def _complete(self, schedule: Schedule) -> int:
        self._save_now(schedule)
        loss = self.engine.loss()
        digest = self.engine.fingerprint()
        summary = self.goodput.summary()
        self.lifecycle.emit("completed", self.step, final_loss=loss, params_sha256=digest, goodput=summary)
        log.info("completed step %d: loss %.4f params_sha256 %s", self.step, loss, digest)
        return 0

    def _stop(self, schedule: Schedule) -> int:
        self._save_now(schedule)
        summary = self.goodput.summary()
        self.lifecycle.emit("stopped", self.step, reason="preempted", goodput=summary)
        noticed_at = self.watch.noticed_at or time.monotonic()
        took = time.monotonic() - noticed_at
        level = logging.INFO if took <= self.cfg.grace_s else logging.WARNING
        log.log(
            level, "stopped at step %d, saved %.2fs after the notice (grace %.0fs)", self.step, took, self.cfg.grace_s
        )
        return 0


def build_engine(cfg: Config) -> tuple[Engine, bool]:
    """(engine, is this the process that reports). Imports JAX only for a real model."""
    if cfg.model == "none":
        from trainer.sleeper import SleepEngine

        return SleepEngine(cfg.seed, cfg.step_time, cfg.checkpoint_uri), True
    from trainer import runtime

    runtime.configure(cfg, os.environ)
    from trainer.engine import JaxEngine

    return JaxEngine(cfg), runtime.is_primary()


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s trainer %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("gcsfs").setLevel(logging.ERROR)


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:500]


def _report_config_error(e: ConfigError, env: Mapping[str, str], goodput: Goodput) -> None:
    """A `failed` entry too, so the job does not wait for a trainer that will never start."""
    try:
        known = parse_env(env)
    except ConfigError:
        return
    job_id, attempt = known.get("RESPAWN_JOB_ID", "local"), known.get("RESPAWN_ATTEMPT", 1)
    lifecycle = Lifecycle(open_sink(known.get("RESPAWN_LOG_SINK", "stdout"), job_id, attempt), job_id, attempt)
    lifecycle.emit("failed", 0, error=f"configuration: {e}", goodput=goodput.summary(lost=True))


def main(argv: Sequence[str], started: float | None = None) -> int:
    _setup_logging()
    goodput = Goodput(started=started if started is not None else time.monotonic())
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return 0
    try:
        cfg = load_config(argv, os.environ, on_gce=on_gce())
    except ConfigError as e:
        log.error("%s", e)
        _report_config_error(e, os.environ, goodput)
        return 2
    watch = PreemptionWatch(cfg.metadata_url).start()
    lifecycle: Lifecycle | None = None
    trainer: Trainer | None = None
    engine: Any = None
    try:
        sink = open_sink(cfg.log_sink, cfg.job_id, cfg.attempt)
        lifecycle = Lifecycle(sink, cfg.job_id, cfg.attempt)
        engine, primary = build_engine(cfg)
        if not primary:
            lifecycle = Lifecycle(NullSink(), cfg.job_id, cfg.attempt)
        trainer = Trainer(cfg, engine, lifecycle, watch, goodput)
        code = trainer.run()
        engine.close()
        return code
    except Exception as e:
        error = _one_line(e)
        log.error("failed: %s", error, exc_info=not isinstance(e, ConfigError))
        if engine is not None:
            try:
                saves = engine.wait()  # keep a save that was already under way
                if trainer is not None:
                    trainer._report(saves)
            except Exception as late:
                log.warning("the pending checkpoint did not complete: %s", _one_line(late))
        if lifecycle is not None:
            step = trainer.step if trainer else 0
            lifecycle.emit("failed", step, error=error, goodput=goodput.summary(lost=True))
        return 2 if isinstance(e, ConfigError) else 1
    finally:
        watch.stop()
