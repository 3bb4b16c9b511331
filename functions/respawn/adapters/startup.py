"""What a machine carries: labels, metadata and the startup script that runs the trainer container.

The machine's scripts are shell files beside this module (startup.sh, shutdown.sh and common.sh, which both use),
each opening with what runs it, when, and what it may rely on. `render` makes a script of one: `#!/bin/bash`, the
values of the job and the attempt as readonly variables (every one through shlex.quote), common.sh, then the file.

Every string that comes from a job message (image, args, env, checkpoint URI)
reaches the script through shlex.quote only, so nothing in it can inject shell.
The structured metadata keys let the local cloud start the same trainer without
a shell; no credentials are ever put in metadata (the machine's service account
authenticates the trainer and the image pull). The job's `secrets` are Secret
Manager references: the script reads each with the machine's account into its
own environment and names it to `docker run -e NAME`, so a value is never in
the script, the metadata or a command line.

Before the trainer, the script readies the machine: it installs Docker where the
boot image has none (Compute Engine's TPU images: docs/compute-engine.md, The
machine), and on a multi-host TPU slice waits until the metadata server names this
VM's worker number and all its peers, which the trainer needs to find the others
(on a GPU machine of several VMs, until the Compute Engine API lists all of its
MIG's VMs: their order by name gives each its worker number); it makes the data
directory (DATA_DIR) that the container mounts, for what the trainer copies.
What cannot be readied is the attempt's `failed` entry, naming the cause (the
trainer never starts).
Lifecycle entries, secrets and the registry login go through the REST APIs with
the machine's token from the metadata server, never through gcloud: no source
says every TPU image has it, and Ubuntu's snap gcloud fails during shutdown,
when the `notice` and exit-code entries are written (common.sh).

The image is pulled once per machine: a machine that has it (an earlier boot of
this machine pulled it, so a Spot VM restarted on its own disk, or it is pinned
by digest) runs it without asking the registry; one whose boot image holds it
under a tag (baked: docs/operations.md, Machines that start fast) fetches only
what changed since, once, and runs the copy it has when the registry is out of
reach. IMAGE_MARK on the machine's disk names the image an earlier boot pulled.

When the container exits, the script speaks for a trainer that may have said
nothing (docs/trainer-protocol.md, Exit codes): exit 0 is `stopped` after the
notice and `completed` without it (worker 0 speaks for a slice), anything else
without the notice is `failed` (any worker), each marked `"source": "exit-code"`.
The notice is the marker file the shutdown script (or the script's own SIGTERM
trap) leaves, or the metadata server's `instance/preempted`. The shutdown script
also writes the `notice` entry at once, trainer or not, so that respawn can
request the next machine while this one saves (a head start); that next machine
boots and pulls its image at once but starts its trainer only once the noticed
machine's final save is done: when the noticed machine's drain marker appears
(written by its worker 0 once its trainer exited 0 after the notice, before the
`stopped` entry) or at metadata `respawn-start-after`, when the noticed machine is
off, whichever comes first.

The container's lines go to Cloud Logging through docker's gcplogs driver; when
that driver cannot reach Cloud Logging as the container starts (`docker run`
exits 125 and runs nothing), the trainer runs again with local logs and the
script says so (LOCAL_LOGS, docs/operations.md): never a failure of the trainer.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from respawn.events import EXIT_CODE
from respawn.jobs import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED, GpuMachine, JobSpec, machine_name
from respawn.machine import (
    CONTAINER,
    DRAIN_MARKER_METADATA,
    EXIT_ENTRIES,
    NOTICE_ENV,
    NOTICE_FILE,
    OOM_KILLED,
    OOM_KILLED_RC,
    PERMANENT_EXITS,
    SHUT_DOWN_RC,
    START_AFTER_METADATA,
    STARTUP_LOG,
    TRAINER_LOG,
    drain_marker,
    handover_prefix,
)
from respawn.machine import grace_s as kind_grace_s
from respawn.machine import trainer_env as machine_trainer_env

NOTICE_DIR = NOTICE_FILE.rsplit("/", 1)[0]  # mounted into the container at the same path


def grace_s(spec: JobSpec) -> int:
    """The grace period of the job's machine kind (respawn/machine.py)."""
    return kind_grace_s(spec.machine.kind)


_ARTIFACT_REGISTRY = re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev$")
IMAGE_MARK = "/var/lib/respawn/trainer-image"  # the image an earlier boot of this machine pulled (its disk keeps it)
IMAGE_MARK_ENV = "RESPAWN_IMAGE_MARK"  # names another file on a machine without /var/lib (the local cloud's)
# A directory on the machine's own disk, mounted into the container at the same path and named to it by DATA_DIR_ENV:
# what the trainer keeps there (its copies of a dataset's shards) outlives the container, for this machine's later
# attempts (a Spot VM started again on its own disk), and stays out of the container's writable layer
DATA_DIR = "/var/lib/respawn/data"
DATA_DIR_ENV = "RESPAWN_DATA_DIR"  # also names another directory on a machine without /var/lib (the local cloud's)


def machine_labels(spec: JobSpec, attempt: int) -> dict[str, str]:
    """The user's labels plus respawn's (respawn's win on a clash)."""
    return {**dict(spec.labels), LABEL_MANAGED: "true", LABEL_JOB: spec.job_id, LABEL_ATTEMPT: str(attempt)}


def progress_s(spec: JobSpec) -> int:
    """How often process 0 sends a `progress` entry: a quarter of the hang timeout, from 10 s to once a minute."""
    return 60 if spec.hang_timeout_s is None else max(10, min(60, spec.hang_timeout_s // 4))


# The expected seconds to interruption of the machine's zone (the placement outlook's, CreateMachine.mtbi_s): the
# trainer's Young/Daly checkpoint interval comes from it. A job's env cannot set it (RESPAWN_ names are reserved).
MTBI_ENV = "RESPAWN_MTBI_S"
NOTICE_LEAD_ENV = "RESPAWN_NOTICE_LEAD_S"  # metadata `preempted` comes this long before the soft off (SIGTERM)
HANDOVER_ENV = "RESPAWN_HANDOVER"
# A head start's machine whose image starts early (TAKEOVER_LABEL): the noticed attempt's handover prefix and
# respawn-start-after, set by the startup script, so that the trainer sets itself up before it takes over
TAKEOVER_ENV, START_AFTER_ENV = "RESPAWN_TAKEOVER", "RESPAWN_START_AFTER"
TAKEOVER_LABEL = "respawn.takeover"  # an image label, "1": its trainer honours RESPAWN_TAKEOVER (respawn_trainer's)
MTBI_METADATA = "respawn-mtbi-s"
# A world of several slices (docs/design/several-slices.md, Telling the machines): the metadata key that names the
# world the machine's slice is a member of ({"version": N, ...}, respawn_trainer.world reads the rest) and the one
# that names the slice; the trainer's environment for them, and its local copy of a save on the machine's disk (in
# DATA_DIR); the exit code by which a trainer leaves its world for a newer one (EX_TEMPFAIL), to run again in place
WORLD_METADATA, SLICE_METADATA = "respawn-world", "respawn-slice"
WORLD_ENV, SLICE_ENV, LOCAL_COPY_ENV = "RESPAWN_WORLD_VERSION", "RESPAWN_SLICE", "RESPAWN_LOCAL_COPY_DIR"
WORLD_CHANGED_RC = 75


def trainer_env(spec: JobSpec, attempt: int, mtbi_s: float | None = None) -> list[tuple[str, str]]:
    """The container's environment (respawn/machine.py): the job's env, then respawn's, the zone's MTBI when
    the placement outlook gave one, and the Spot VM's metadata notice before its soft off when the job asks for one."""
    env = machine_trainer_env(
        kind=spec.machine.kind,
        job_id=spec.job_id,
        attempt=attempt,
        checkpoint_uri=spec.checkpoint_uri,
        progress_s=progress_s(spec),
        env=spec.env,
    )
    if mtbi_s is not None:
        env.append((MTBI_ENV, _seconds(mtbi_s)))
    if spec.preemption_notice_s is not None:
        env.append((NOTICE_LEAD_ENV, str(spec.preemption_notice_s)))
    if spec.head_start:  # its trainer hands over to a head start's (docs/trainer-protocol.md, The handover)
        env.append((HANDOVER_ENV, handover_prefix(spec.checkpoint_uri, attempt)))
    return env


def _seconds(mtbi_s: float) -> str:
    return str(max(1, round(mtbi_s)))


# Every line the container prints reaches Cloud Logging (log `gcplogs-docker-driver`) with these two variables in
# jsonPayload.container.metadata: `respawn logs` selects a job's lines by them (respawn_ops/joblogs.py).
CLOUD_LOGS = ("--log-driver=gcplogs", "--log-opt=env=RESPAWN_JOB_ID,RESPAWN_ATTEMPT")
# Where the trainer's lines go when docker's gcplogs driver cannot reach Cloud Logging as the container starts (it
# pings Cloud Logging first, and `docker run` then exits 125 without running anything): docker's default json-file
# driver, bounded, on the machine's disk; the attached `docker run` also prints them into the startup script's own
# output (serial console, journal).
LOCAL_LOGS = ("--log-driver=json-file", "--log-opt=max-size=100m", "--log-opt=max-file=3")


def docker_run_argv(
    spec: JobSpec, attempt: int, logs: tuple[str, ...] = CLOUD_LOGS, mtbi_s: float | None = None
) -> list[str]:
    if spec.image.startswith("-"):
        raise ValueError(f"image: {spec.image!r} starts with '-'; allowed: a container image reference")
    gpu = isinstance(spec.machine, GpuMachine)
    argv = ["docker", "run", "--rm", "--name", CONTAINER, "--net=host"]
    # The daemon stops the container itself as the VM shuts down, in parallel with the shutdown script, with the
    # container's own stop timeout (10 s unless given): the trainer's whole grace, and a second to exit
    argv += [f"--stop-timeout={grace_s(spec) + 1}"]
    # TPU VMs expose the chips as /dev/accel* or, on v5p, v6e and TPU7x, through vfio-pci, whose pinned DMA memory
    # counts against the memlock limit of a process without CAP_IPC_LOCK: the image's non-root user has none
    # (docs/compute-engine.md, The container)
    argv += ["--gpus", "all"] if gpu else ["--privileged", "--ulimit", "memlock=-1:-1"]
    argv += logs
    for key, value in trainer_env(spec, attempt, mtbi_s):
        argv += ["-e", f"{key}={value}"]
    # this worker of the slice: a TPU slice's from the metadata server, a GPU slice's from its MIG (the script exports
    # them; a single GPU VM has none, and docker passes a variable that is not set as nothing)
    argv += ["-e", "TPU_WORKER_ID", "-e", "TPU_WORKER_HOSTNAMES"]
    # The notice file, which a trainer that stops on a slice peer's notice leaves too (docs/trainer-protocol.md)
    argv += ["-v", f"{NOTICE_DIR}:{NOTICE_DIR}", "-e", NOTICE_ENV]
    argv += ["-v", f"{DATA_DIR}:{DATA_DIR}", "-e", DATA_DIR_ENV]  # the data directory (startup.sh, ready_data_dir)
    argv += ["-e", TAKEOVER_ENV, "-e", START_AFTER_ENV]  # set on a head start's machine only (startup.sh)
    argv += ["-e", WORLD_ENV, "-e", SLICE_ENV, "-e", LOCAL_COPY_ENV]  # set on a slice of a world only (startup.sh)
    for key, _ in spec.secrets:  # the value comes from the script's environment (startup.sh, secret)
        argv += ["-e", key]
    return [*argv, spec.image, *spec.args]


def machine_metadata(
    spec: JobSpec,
    attempt: int,
    mtbi_s: float | None = None,
    *,
    start_after: float | None = None,
    slice_world: tuple[int | None, str | None] = (None, None),
) -> dict[str, str]:
    """TPU node `metadata` map / GCE metadata items; `mtbi_s`, the placement outlook's expected seconds to
    interruption of the machine's zone, as `respawn-mtbi-s` and in the trainer's environment; `start_after`
    (CreateMachine.start_after, epoch s) holds the trainer back until the noticed machine this one replaces is off,
    or until that machine's drain marker appears (`respawn-drain-marker`, its final save done).

    The machine replaced is the attempt before this one: a head start's create follows the noticed attempt. Where
    capacity refused that create and the zone walk made another attempt, the marker named is of an attempt that
    never ran a trainer: it never appears, and the trainer starts at respawn-start-after as before the marker.

    `slice_world` (CreateMachine.slice and .world), a slice of a job of several: the slice it is and the world it is
    told at its making (respawn-slice, respawn-world), which its startup script runs the trainer in, or waits to be
    let into (startup.sh)."""
    slice_, world = slice_world
    return {
        "startup-script": startup_script(spec, attempt, mtbi_s),
        "shutdown-script": shutdown_script(spec, attempt),
        "respawn-job-id": spec.job_id,
        "respawn-attempt": str(attempt),
        "respawn-checkpoint-uri": spec.checkpoint_uri,
        "respawn-image": spec.image,
        "respawn-args": json.dumps(list(spec.args)),
        "respawn-env": json.dumps(dict(spec.env), sort_keys=True),
        "respawn-progress-s": str(progress_s(spec)),
        **({"respawn-secrets": json.dumps(dict(spec.secrets), sort_keys=True)} if spec.secrets else {}),  # references
        **({MTBI_METADATA: _seconds(mtbi_s)} if mtbi_s is not None else {}),
        **({START_AFTER_METADATA: str(math.ceil(start_after))} if start_after is not None else {}),
        **(
            {DRAIN_MARKER_METADATA: drain_marker(spec.checkpoint_uri, attempt - 1)}
            if start_after is not None and attempt > 1
            else {}
        ),
        **({SLICE_METADATA: str(slice_), WORLD_METADATA: world} if slice_ is not None and world is not None else {}),
    }


def _registry_host(image: str) -> str | None:
    first = image.split("/", 1)[0]
    return first if "/" in image and _ARTIFACT_REGISTRY.match(first) else None


# How long a slice VM waits for its metadata: 120 tries 5 s apart, about 10 minutes.
SLICE_METADATA_TRIES = 120

ShellValue = str | int | Sequence[str]


def render(script: str, values: Mapping[str, ShellValue]) -> str:
    """Script `script` (a file beside this module) as a machine runs it: `#!/bin/bash`, each value as a readonly
    variable (a sequence as an array), every string through shlex.quote so that none can inject shell, then
    common.sh, then the script's own file."""

    def quoted(value: ShellValue) -> str:
        if isinstance(value, str | int):
            return shlex.quote(str(value))
        return "(" + " ".join(shlex.quote(v) for v in value) + ")"

    return "".join(
        [
            f"#!/bin/bash\n# respawn: rendered from respawn/adapters/{script}: its values, common.sh, {script}\n",
            "# shellcheck disable=SC2016,SC2054  # data, each quoted whole: no expansion, commas inside arguments\n",
            "{\n",
            *(f"  readonly {name}={quoted(value)}\n" for name, value in values.items()),
            "}\n",
            _script_file("common.sh"),
            _script_file(script),
        ]
    )


def _script_file(name: str) -> str:
    return (resources.files(__package__) / name).read_text(encoding="utf-8")


def _exit_entries() -> str:
    """respawn/machine.py's EXIT_ENTRIES as startup.sh reads them: KEY:EVENT:SEVERITY rows, KEY three digits (1 yes,
    0 no) for: the exit code is 0, the machine got the notice, worker 0."""
    rows = (
        "".join(str(int(b)) for b in key) + f":{entry[0]}:{entry[1]}" for key, entry in EXIT_ENTRIES.items() if entry
    )
    return " ".join(rows)


def _common(spec: JobSpec, attempt: int) -> dict[str, ShellValue]:
    """The values both scripts read (common.sh's, and the notice's)."""
    return {
        "job_id": spec.job_id,
        "attempt": int(attempt),
        "trainer_log": TRAINER_LOG,
        "container": CONTAINER,
        "grace_s": grace_s(spec),
        "notice_file": NOTICE_FILE,
        "notice_env": NOTICE_ENV,
    }


def shutdown_script(spec: JobSpec, attempt: int) -> str:
    """The shutdown script of attempt `attempt`'s machine (shutdown.sh)."""
    return render("shutdown.sh", _common(spec, attempt))


def startup_script(spec: JobSpec, attempt: int, mtbi_s: float | None = None) -> str:
    """The startup script of attempt `attempt`'s machine (startup.sh)."""
    return render(
        "startup.sh",
        {
            **_common(spec, attempt),
            "machine": machine_name(spec.job_id, attempt),
            "machine_kind": "gpu" if isinstance(spec.machine, GpuMachine) else "tpu",
            "slice_hosts": spec.machine.hosts,
            "slice_metadata_tries": SLICE_METADATA_TRIES,
            "registry": _registry_host(spec.image) or "",
            "secrets": [part for pair in spec.secrets for part in pair],
            "image": spec.image,
            "image_mark_file": IMAGE_MARK,
            "image_mark_env": IMAGE_MARK_ENV,
            "data_dir": DATA_DIR,
            "data_dir_env": DATA_DIR_ENV,
            "start_after_key": START_AFTER_METADATA,
            "drain_marker_key": DRAIN_MARKER_METADATA,
            "takeover_label": TAKEOVER_LABEL,
            "takeover_env": TAKEOVER_ENV,
            "start_after_env": START_AFTER_ENV,
            "drain_marker": drain_marker(spec.checkpoint_uri, attempt),
            "startup_log": STARTUP_LOG,
            "notice_lead_s": "" if spec.preemption_notice_s is None else spec.preemption_notice_s,
            "world_key": WORLD_METADATA,
            "slice_key": SLICE_METADATA,
            "world_env": WORLD_ENV,
            "slice_env": SLICE_ENV,
            "local_copy_env": LOCAL_COPY_ENV,
            "world_changed_rc": WORLD_CHANGED_RC,
            "run": docker_run_argv(spec, attempt, mtbi_s=mtbi_s),
            "run_local": docker_run_argv(spec, attempt, LOCAL_LOGS, mtbi_s),
            "exit_entries": _exit_entries(),
            "exit_code_source": EXIT_CODE,
            "shut_down_rc": SHUT_DOWN_RC,
            # machine.py's PERMANENT_EXITS as CODE CAUSE pairs, and the OOM killer's cause
            "permanent_exits": [part for code, cause in PERMANENT_EXITS.items() for part in (str(code), cause)],
            "oom_killed_rc": OOM_KILLED_RC,
            "oom_killed": OOM_KILLED,
        },
    )
