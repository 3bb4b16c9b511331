"""The demo trainer: flags, then a training loop written on respawn_trainer like any user's loop.

Exit codes: 0 completed, 0 stopped after the preemption save, 75 the world of several slices changed and this process
could not join the next one in place (start me again in it: respawn_trainer.world), 1 failed (a `failed` entry was
sent), 2 bad configuration (one line on stderr, and a `failed` entry when the environment allows one), 78 a failure no
other machine of the job would escape (respawn_trainer.failures: the devices, a compile error, device memory).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from respawn_trainer import USAGE_RC, Run, failures
from respawn_trainer.env import load_env
from respawn_trainer.goodput import Goodput
from respawn_trainer.lifecycle import Lifecycle, open_sink
from respawn_trainer.notice import on_gce
from respawn_trainer.world import WORLD_CHANGED_RC, WorldChanged
from trainer.config import Config, ConfigError, data_cache, help_text, load_config

log = logging.getLogger("trainer")


def train(cfg: Config, run: Run) -> None:
    """The loop: restore, step, log, save on schedule, finish."""
    step_fn: Callable[[Any, int], Any]
    if cfg.model == "none":
        from trainer.sleeper import sleep_step

        step_fn = sleep_step(cfg.step_time)
        state, step = run.restore({"step": 0})
    else:
        from trainer.engine import LanguageModel

        model = LanguageModel(cfg, slices=run.world.slice_of_processes() if run.world else None)
        step_fn = model.step
        if cfg.data:
            return train_on_dataset(cfg, run, model)
        state, step = run.restore(model.fresh, template=model.abstract)
        if int(state["step"]) != step:
            raise RuntimeError(f"checkpoint step {step} holds state of step {int(state['step'])}")
    window = (time.monotonic(), step)
    while run.keep_going(step):
        state = step_fn(state, step + 1)
        step += 1
        if step % cfg.log_every == 0:
            window = _log_progress(cfg, step, state, window)
        run.step_done(step, state, loss=state.get("loss"))
    run.finish(step, state, params=state["params"] if cfg.model != "none" else None)


def train_on_dataset(cfg: Config, run: Run, model: Any) -> None:
    """The same loop on --data: the stream's position is saved and restored with the train state (on any process
    count: a tier of another host count resumes it), and the final entry says which stream positions this attempt
    trained (`examples`: from, to), so that a run's examples can be counted across its attempts."""
    import jax

    from trainer import dataset

    where = {"process_index": jax.process_index(), "process_count": jax.process_count()}
    paths = dataset.shard_paths(cfg.data, data_cache(cfg, run.env.data_dir), seed=cfg.seed, **where)
    batches = dataset.iterator(paths, seed=cfg.seed, global_batch=cfg.batch_size, seq_len=cfg.seq_len, **where)
    state, step = run.restore(model.fresh, template=model.abstract, data=batches)
    assert run.data is not None
    span: list[int] = []  # the positions trained: [first, end)
    window = (time.monotonic(), step)
    while run.keep_going(step):
        batch = next(run.data)
        first, end = dataset.global_span(batch, **where)
        expected = span[1] if span else step * cfg.batch_size  # the first after a restore: the restored step's end
        if first != expected:
            raise RuntimeError(f"step {step + 1} got data position {first}, expected {expected}")
        span = [span[0] if span else first, end]
        state = model.step(state, step + 1, batch.tokens)
        step += 1
        if step % cfg.log_every == 0:
            window = _log_progress(cfg, step, state, window)
        run.step_done(step, state, loss=state.get("loss"), examples={"from": span[0], "to": span[1]})
    examples = {"from": span[0], "to": span[1]} if span else None
    run.finish(step, state, params=state["params"], examples=examples)


def _log_progress(cfg: Config, step: int, state: Any, window: tuple[float, int]) -> tuple[float, int]:
    loss = float(state.get("loss", 0.0))  # the sleeper's state has none
    if not math.isfinite(loss):
        raise FloatingPointError(f"the loss is {loss} at step {step}")
    now = time.monotonic()
    rate = (step - window[1]) / max(now - window[0], 1e-9)
    log.info("step %d/%d loss %.4f %.1f steps/s", step, cfg.steps, loss, rate)
    return now, step


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s trainer %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    logging.getLogger("gcsfs").setLevel(logging.ERROR)


def _report_config_error(e: ConfigError, env: Mapping[str, str], started: float) -> None:
    """A `failed` entry too, so the job does not wait for a trainer that will never start: permanent, as the flags
    are the same on every machine of the job (failures.classify)."""
    try:
        known = load_env(env, on_gce=on_gce())
    except ConfigError:
        return
    sink = open_sink(known.log_sink, known.job_id, known.attempt, known.metadata_url)
    lifecycle = Lifecycle(sink, known.job_id, known.attempt)
    failure, goodput = failures.classify(e), Goodput(started=started).summary(lost=True)
    lifecycle.emit("failed", 0, error=failure.text, goodput=goodput, permanent=failure.permanent)


def main(argv: Sequence[str], started: float | None = None) -> int:
    _setup_logging()
    started = started if started is not None else time.monotonic()
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return 0
    try:
        cfg = load_config(argv)
    except ConfigError as e:
        log.error("%s", e)
        _report_config_error(e, os.environ, started)
        return USAGE_RC
    try:
        run = Run(
            cfg.steps,
            checkpoint_every=cfg.checkpoint_every,
            keep=cfg.keep,
            checkpointer=_sleeper_checkpoints() if cfg.model == "none" else None,
            distributed=cfg.distributed,
            use_jax=cfg.model != "none",
            started=started,
        )
    except ConfigError as e:  # the environment: no sink can be trusted to report it
        log.error("%s", e)
        return USAGE_RC
    except Exception as e:
        return exit_code(e)  # Run sent the `failed` entry
    try:
        with run:
            train_in_worlds(cfg, run)
    except Exception as e:  # Run logged it and sent the `failed` entry
        return exit_code(e)
    return run.exit_code


def train_in_worlds(cfg: Config, run: Run) -> None:
    """train(), and in a world of several slices again in each next world this process joins in place (Run.reform):
    a survivor of a slice's loss trains on without a new process. It exits 75 where it cannot."""
    while True:
        with contextlib.suppress(WorldChanged):  # a newer world came before the first step
            train(cfg, run)
        if run.exit_code != WORLD_CHANGED_RC or not run.reform():
            return


def exit_code(error: Exception) -> int:
    """The exit code of a failure (trainer/README.md): 2 for the configuration, PERMANENT_RC where no other machine
    of the job would do better (respawn_trainer.failures), else 1."""
    return failures.exit_code(error)


def _sleeper_checkpoints() -> Any:
    from trainer.sleeper import MarkerCheckpoints

    return MarkerCheckpoints(load_env(os.environ).checkpoint_uri)
