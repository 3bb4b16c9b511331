"""respawn_trainer: any JAX training loop survives Spot / preemptible machines in a few lines.

    import respawn_trainer

    with respawn_trainer.Run(steps=STEPS) as run:
        state, step = run.restore(init_state)
        while run.keep_going(step):
            state = train_step(state, step)
            step += 1
            run.step_done(step, state)
        run.finish(step, state)

What it does, and the protocol underneath (environment, signals, lifecycle entries, exit codes):
docs/trainer-protocol.md and trainer/README.md.
"""

from respawn_trainer.env import ConfigError, RunEnv, load_env
from respawn_trainer.failures import PERMANENT_RC, USAGE_RC, CompileFailed, Permanent, exit_code
from respawn_trainer.run import Run, state_sha256
from respawn_trainer.runtime import WrongDevices, compiled
from respawn_trainer.world import WORLD_CHANGED_RC, WorldChanged

__all__ = [
    "PERMANENT_RC",
    "USAGE_RC",
    "WORLD_CHANGED_RC",
    "CompileFailed",
    "ConfigError",
    "Permanent",
    "Run",
    "RunEnv",
    "WorldChanged",
    "WrongDevices",
    "compiled",
    "exit_code",
    "load_env",
    "state_sha256",
]
