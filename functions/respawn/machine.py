"""What a machine does for its trainer, in one place: the startup script renders it and the local cloud runs it.

The grace period each kind of machine gives its trainer after the notice, the notice itself (the marker file the
shutdown script or the startup script's trap leaves), the trainer's environment, the entry the startup script
writes from the trainer's exit code, and the names of the logs a machine writes to. adapters/startup.py renders the
machine's scripts (adapters/startup.sh, shutdown.sh) with it; the local cloud (localcloud/machines/vms.py) runs them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable

# respawn's own trainer image of each machine kind, REPOSITORY/NAME:TAG in the deployment's repository (terraform
# output trainer_images), and the trainer/Dockerfile VARIANT that cloudbuild.yaml builds it with: JAX's TPU wheels
# for TPU machines, its CUDA 12 wheels for GPU machines (docs/gpus.md).
TRAINER_IMAGES = {"gpu": "trainer-cuda", "tpu": "trainer"}
IMAGE_VARIANTS = {"gpu": "cuda", "tpu": "tpu"}
# What the CLI checks a job without `image` with (respawn submit, plan, doctor): the deployment's trainer image of its
# machine's kind, which only the functions know (RESPAWN_TRAINER_IMAGES); the message goes out without an image.
DEPLOYMENT_IMAGES = {kind: f"deployment/{name}" for kind, name in TRAINER_IMAGES.items()}


def image_mismatch(kind: str, image: str) -> str | None:
    """What is wrong when a job of machine `kind` names respawn's trainer image of the other kind
    (REPOSITORY/trainer:TAG on a GPU, REPOSITORY/trainer-cuda:TAG on a TPU), else None: its JAX would not find the
    machine's accelerator, and the trainer would fail at its start (RESPAWN_ACCELERATOR)."""
    repository, _, last = image.rpartition("/")
    name = re.split(r"[:@]", last)[0]
    tag = last[len(name) :].partition("@")[0]  # ":TAG", or "" for a digest alone
    other = next((k for k, n in TRAINER_IMAGES.items() if n == name and k != kind), None)
    if other is None or kind not in TRAINER_IMAGES:
        return None
    wanted = f"{repository}/{TRAINER_IMAGES[kind]}{tag}"  # the same tag; a digest names one image only
    return f"image {image} is respawn's {other.upper()} trainer image; a {kind} machine runs {wanted}"


# The trainer's save window after the shutdown signal, inside the notice each kind of machine really gets:
# a Spot / preemptible GPU VM gets 30 s (ACPI soft off, then hard off); Spot TPU VMs are reported to get about
# 10 s in practice (docs/operations.md, Notice windows).
GRACE_S = {"gpu": 25, "tpu": 8}
# The notice window itself, from the notice to the hard stop (docs/operations.md, Notice windows): Compute Engine
# documents 30 s for Spot VMs; for Spot TPU VMs Google documents none, and about 10 s is what users report. A head
# start (respawn.decide) keeps a noticed machine this long (plus a margin) before its replacement's trainer starts.
NOTICE_S = {"gpu": 30, "tpu": 10}

# 128 + SIGTERM: the exit code of a trainer stopped by `docker stop` (the notice, or the machine deleted), and the
# startup script's own when its machine shuts down before the trainer starts; the local cloud reads it as no failure
SHUT_DOWN_RC = 128 + signal.SIGTERM
# EX_CONFIG (sysexits.h): a trainer that exits with it says no machine of the job would do better (respawn_trainer's
# failures: its devices, a compile error, device memory); the startup script's `failed` entry then says `permanent`
# too, so the job fails at once whichever of that entry and the trainer's own arrives first (docs/trainer-protocol.md,
# What its exit code means)
PERMANENT_RC = 78
# The exit codes that no other machine of the job would change, each with the cause and the fix that the startup
# script's `failed` entry names after "the trainer exited with code N: ", marked `permanent`: the job fails at once.
# Any other code is retried up to max_failures. No double quote or backslash in them: they go into JSON as they are.
PERMANENT_EXITS: dict[int, str] = {
    2: "a usage error, as argparse exits on a bad flag and Python on a missing script; fix: the job's args",
    PERMANENT_RC: "EX_CONFIG, the program's word that no machine of the job would do better (its own entry says why)",
    126: "docker could not run the image's command (not executable); fix: the image, or the job's args",
    127: "docker found no such command in the image; fix: the image's entrypoint, or the job's args",
}
# 128 + SIGKILL with Docker's `oom` event for the trainer's container: the kernel's OOM killer ended it, as it would on
# any machine of the type. A SIGKILL after the notice (at the end of the grace) is the preemption's, never this.
OOM_KILLED_RC = 128 + signal.SIGKILL
OOM_KILLED = (
    "the kernel killed it for want of host memory (Docker's OOMKilled); fix: less host memory per process "
    "(a smaller batch, fewer data workers) or a machine type with more memory"
)
CONTAINER = "respawn-trainer"  # the trainer's container, which `docker stop -t GRACE` stops
NOTICE_FILE = "/run/respawn/notice"  # left by the shutdown script (or the startup script's trap) before `docker stop`,
# and by a trainer that stops on a peer's notice (its directory is mounted into the container)
NOTICE_ENV = "RESPAWN_NOTICE_FILE"  # names another notice file on a machine without /run (the local cloud's)
TRAINER_LOG = "respawn-trainer"  # the lifecycle entries: the trainer's own and the startup script's
STARTUP_LOG = "respawn-startup"  # the startup script's notes for the operator (never read by the control plane)
# A head start's machine (respawn.decide): the epoch second before which its startup script starts no trainer
START_AFTER_METADATA = "respawn-start-after"
# ... and the object (gs://BUCKET/OBJECT) whose existence lets it start sooner: the drain marker (drain_marker) of the
# attempt it replaces, written once that attempt's trainer has exited after its notice (its final save is done)
DRAIN_MARKER_METADATA = "respawn-drain-marker"

# The variables respawn sets in the trainer's environment, which the job's `env` cannot override.
RESERVED_ENV = (
    "RESPAWN_JOB_ID",
    "RESPAWN_ATTEMPT",
    "RESPAWN_CHECKPOINT_URI",
    "RESPAWN_LOG_SINK",
    "RESPAWN_GRACE_S",
    "RESPAWN_PROGRESS_S",
    "RESPAWN_HANDOVER",
    "RESPAWN_TAKEOVER",
    "RESPAWN_START_AFTER",
)


def grace_s(kind: str) -> int:
    """The grace period of a machine of `kind` ("gpu" or "tpu")."""
    if kind not in GRACE_S:
        raise ValueError(f"machine kind: {kind!r} is not a machine kind; allowed: {', '.join(sorted(GRACE_S))}")
    return GRACE_S[kind]


def notice_s(kind: str) -> int:
    """The notice window of a machine of `kind` ("gpu" or "tpu"): the machine is off this long after its notice."""
    if kind not in NOTICE_S:
        raise ValueError(f"machine kind: {kind!r} is not a machine kind; allowed: {', '.join(sorted(NOTICE_S))}")
    return NOTICE_S[kind]


def drain_marker(checkpoint_uri: str, attempt: int) -> str:
    """The object (gs://BUCKET/OBJECT) that attempt `attempt`'s machine writes once its trainer has exited 0 after
    the notice: its final save is done, so a head start's replacement may start its trainer before
    respawn-start-after. Beside the job's checkpoints, not among them (`{checkpoint_uri}.respawn/`), so that no
    checkpoint manager lists it."""
    return handover_prefix(checkpoint_uri, attempt) + ".exited"


def handover_prefix(checkpoint_uri: str, attempt: int) -> str:
    """Attempt `attempt`'s objects of a head start's handover (docs/trainer-protocol.md, The handover): PREFIX.exited
    (drain_marker, written by the trainer once its final save is durable, and by the startup script at its exit 0)
    and PREFIX.ready (written by the trainer of the machine that replaces it, once it has set itself up)."""
    return f"{checkpoint_uri.rstrip('/')}.respawn/attempt-{int(attempt)}"


def trainer_env(
    *,
    kind: str,
    job_id: str,
    attempt: int,
    checkpoint_uri: str,
    progress_s: int,
    env: Iterable[tuple[str, str]] = (),
    log_sink: str = "cloud",
) -> list[tuple[str, str]]:
    """The trainer's environment: the job's `env`, then respawn's (which the job cannot override).

    `log_sink` is where the trainer sends its lifecycle entries: `cloud` (Cloud Logging) on a real machine."""
    own = [
        ("RESPAWN_JOB_ID", job_id),
        ("RESPAWN_ATTEMPT", str(attempt)),
        ("RESPAWN_CHECKPOINT_URI", checkpoint_uri),
        ("RESPAWN_LOG_SINK", log_sink),
        ("RESPAWN_GRACE_S", str(grace_s(kind))),
        ("RESPAWN_ACCELERATOR", kind),  # the trainer fails at once where JAX does not find it (wrong image variant)
        ("RESPAWN_PROGRESS_S", str(progress_s)),
    ]
    return [(k, v) for k, v in env if k not in RESERVED_ENV] + own


# The exit code rules, once (docs/trainer-protocol.md, Exit codes): the (event, severity) the startup script writes for
# a trainer that exited, from (its exit code is 0, the machine got the notice, this is worker 0). adapters/startup.py
# renders them into the script (startup.sh reads them as `exit_entries`).
EXIT_ENTRIES: dict[tuple[bool, bool, bool], tuple[str, str] | None] = {
    (True, False, True): ("completed", "INFO"),
    (True, True, True): ("stopped", "WARNING"),
    (True, False, False): None,  # worker 0 speaks for a slice
    (True, True, False): None,
    (False, False, True): ("failed", "ERROR"),  # failed, or killed without a word (OOM, segfault): any worker
    (False, False, False): ("failed", "ERROR"),
    (False, True, True): None,  # after the notice the preemption's system event speaks for it
    (False, True, False): None,
}


def exit_code_entry(code: int, worker: int, *, noticed: bool) -> tuple[str, str] | None:
    """The (event, severity) the startup script logs from the exit code of a trainer (docs/trainer-protocol.md,
    Exit codes), marked `"source": "exit-code"`; None when the script says nothing."""
    return EXIT_ENTRIES[(code == 0, noticed, worker == 0)]


def exit_code_failure(code: int, *, oom_killed: bool = False) -> tuple[str, bool]:
    """(error, permanent) of the startup script's `failed` entry for a trainer that exited `code` without the notice;
    `oom_killed`: Docker reported the kernel's OOM killer for its container."""
    cause = OOM_KILLED if oom_killed and code == OOM_KILLED_RC else PERMANENT_EXITS.get(code)
    return f"the trainer exited with code {code}" + (f": {cause}" if cause else ""), cause is not None
