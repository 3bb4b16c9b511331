"""`python -m trainer [--FLAG=VALUE ...]`: see trainer/README.md for flags, environment and exit codes."""

import os
import sys

# numpy's OpenBLAS starts a thread per core that spins after numpy's import: 0.06 s of CPU on this 2-core machine
# (measured), a core taken from the start on a busy one, for BLAS the trainer never calls (XLA does its own math).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from respawn_trainer.goodput import process_started

STARTED = process_started()

from trainer.main import main  # noqa: E402  (the start time is taken before the heavy imports)

code = main(sys.argv[1:], started=STARTED)
# Entries are written and checkpoints committed by now: skip the interpreter's slow teardown of
# JAX and Orbax threads, which would eat into the preemption grace period.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
