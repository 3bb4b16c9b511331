"""What a machine carries: labels, metadata and the startup script that runs the trainer container.

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
VM's worker number and all its peers, which the trainer needs to find the others.
What cannot be readied is the attempt's `failed` entry (the trainer never starts).
Lifecycle entries, secrets and the registry login go through gcloud where the
boot image has it, else through the REST APIs with the machine's token from the
metadata server (no source says every TPU image has gcloud).

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

from respawn.jobs import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED, GpuMachine, JobSpec
from respawn.machine import (
    CONTAINER,
    DRAIN_MARKER_METADATA,
    NOTICE_ENV,
    NOTICE_FILE,
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
# jsonPayload.container.metadata: `respawn logs` selects a job's lines by them (respawn/joblogs.py).
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
    argv += ["--gpus", "all"] if gpu else ["--privileged"]  # TPU VMs expose the chips as /dev/accel*
    argv += logs
    for key, value in trainer_env(spec, attempt, mtbi_s):
        argv += ["-e", f"{key}={value}"]
    if not gpu:  # this worker of the slice, from the metadata server (the script exports them)
        argv += ["-e", "TPU_WORKER_ID", "-e", "TPU_WORKER_HOSTNAMES"]
    # The notice file, which a trainer that stops on a slice peer's notice leaves too (docs/trainer-protocol.md)
    argv += ["-v", f"{NOTICE_DIR}:{NOTICE_DIR}", "-e", NOTICE_ENV]
    argv += ["-e", TAKEOVER_ENV, "-e", START_AFTER_ENV]  # set on a head start's machine only (_START_AFTER)
    for key, _ in spec.secrets:  # the value comes from the script's environment (see _SECRETS)
        argv += ["-e", key]
    return [*argv, spec.image, *spec.args]


def machine_metadata(
    spec: JobSpec, attempt: int, mtbi_s: float | None = None, *, start_after: float | None = None
) -> dict[str, str]:
    """TPU node `metadata` map / GCE metadata items; `mtbi_s`, the placement outlook's expected seconds to
    interruption of the machine's zone, as `respawn-mtbi-s` and in the trainer's environment; `start_after`
    (CreateMachine.start_after, epoch s) holds the trainer back until the noticed machine this one replaces is off,
    or until that machine's drain marker appears (`respawn-drain-marker`, its final save done).

    The machine replaced is the attempt before this one: a head start's create follows the noticed attempt. Where
    capacity refused that create and the zone walk made another attempt, the marker named is of an attempt that
    never ran a trainer: it never appears, and the trainer starts at respawn-start-after as before the marker."""
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
    }


# Run on the notice (ACPI soft off) by every worker VM it reaches, and on any other shutdown: the marker first, then
# the trainer's grace period to save and exit, and meanwhile the `notice` entry (docs/trainer-protocol.md), whatever
# the trainer, so that respawn may request the next machine at once. A deleted machine writes it too; respawn reads
# it only for the running attempt it names.
_SHUTDOWN = """#!/bin/bash
# respawn: the notice of attempt {attempt}: marked, the trainer stopped within its grace, and respawn told.
notice=${{{notice_env}:-{notice}}}
mkdir -p "${{notice%/*}}" && touch "$notice"
# A preemption, not a deletion: the trainer may hand over to a head start's (docs/trainer-protocol.md, The handover)
[ "$(curl -sf -m 1 -H 'Metadata-Flavor: Google' \
  "http://${{GCE_METADATA_HOST:-metadata.google.internal}}/computeMetadata/v1/instance/preempted")" = TRUE ] \
  && echo preempted > "$notice"
docker stop -t {grace} {container} &
"""
_NOTICE_ENTRY = """write_entry {trainer_log} WARNING \\
  "$(printf '{{"event": "notice", "job_id": "%s", "attempt": %d, "worker": %d}}' {job_id} {attempt} "$worker")" \\
  || echo "respawn: could not log the notice" >&2
"""
# The job's preemption_notice: this Spot VM's metadata says `preempted` that long before its soft off (and its
# shutdown script). respawn hears of it at once (the `notice` entry: the head start), and the trainer's exit will
# read as `stopped`; the trainer trains on until its own notice (RESPAWN_NOTICE_LEAD_S after the flag, in
# respawn_trainer) or the shutdown script's SIGTERM, so the next machine boots while this one still trains.
_WATCH = """watch_notice() {{
  until [ "$(md preempted)" = TRUE ]; do sleep 1; done
  echo preempted > "$notice"
  log "the metadata server says preempted: the soft off follows in {lead}s"
  {entry}}}
watch_notice &
watcher=$!
"""


def shutdown_script(spec: JobSpec, attempt: int) -> str:
    """The shutdown script of attempt `attempt`'s machine (_SHUTDOWN)."""
    q = shlex.quote
    header = _SHUTDOWN.format(
        attempt=int(attempt), notice_env=NOTICE_ENV, notice=q(NOTICE_FILE), grace=grace_s(spec), container=CONTAINER
    )
    return header + _METADATA + _CLOUD + _notice_entry(spec, attempt) + "wait\n"


def _notice_entry(spec: JobSpec, attempt: int) -> str:
    return _NOTICE_ENTRY.format(trainer_log=TRAINER_LOG, job_id=shlex.quote(spec.job_id), attempt=int(attempt))


def _registry_host(image: str) -> str | None:
    first = image.split("/", 1)[0]
    return first if "/" in image and _ARTIFACT_REGISTRY.match(first) else None


_HEADER = """#!/bin/bash
# respawn: runs the trainer container (attempt {attempt}) and forwards the shutdown signal to it.
set -u
log() {{ echo "respawn-startup: $*" >&2; }}
"""

# The Deep Learning VM image installs the driver on first boot (metadata install-nvidia-driver=True);
# the NVIDIA Container Toolkit provides `docker run --gpus`. Both are waited for / installed here.
_GPU = """for i in $(seq 1 120); do
  nvidia-smi >/dev/null 2>&1 && break
  log "waiting for the NVIDIA driver"; sleep 5
done
if ! command -v nvidia-ctk >/dev/null 2>&1; then
  log "installing the NVIDIA Container Toolkit"
  curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \\
    | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \\
    | sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g' \\
    > /etc/apt/sources.list.d/nvidia-container-toolkit.list
  apt-get update -q && apt-get install -y -q nvidia-container-toolkit
  nvidia-ctk runtime configure --runtime=docker && systemctl restart docker
fi
"""

# Docker's credentials for Artifact Registry: gcloud's credential helper, or the machine's token as the password of
# user oauth2accesstoken (https://cloud.google.com/artifact-registry/docs/docker/authentication#token).
_AUTH = """if [ -n "$gcloud_cli" ]; then
  gcloud auth configure-docker {host} --quiet || log "could not configure docker for {host}"
else
  token | docker login -u oauth2accesstoken --password-stdin https://{host} >/dev/null \\
    || log "could not log docker in to {host}"
fi
"""

# The metadata server's address: metadata.google.internal, or GCE_METADATA_HOST where the machine names another (the
# variable Google's client libraries read; the local cloud's machines have a local server).
_METADATA = """metadata="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
md() {
  curl -sf -m 2 -H 'Metadata-Flavor: Google' "$metadata/instance/$1"
}
# every worker VM of a slice runs this script; the metadata server says which one this is
worker=$(md attributes/agent-worker-number || echo 0)
case "$worker" in ''|*[!0-9]*) worker=0 ;; esac
"""

# Cloud Logging and Secret Manager through gcloud where the boot image has it, else through their REST APIs with the
# token of the machine's service account from the metadata server: no source says every TPU image has gcloud.
# Both write an entry with resource `global`, as `gcloud logging write` does. docs/cloud-contracts.md, The machine.
_CLOUD = """gcloud_cli=$(command -v gcloud || true)
token() {  # an OAuth access token of the machine's service account
  curl -sf -m 10 -H 'Metadata-Flavor: Google' "$metadata/instance/service-accounts/default/token" \\
    | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p'
}
write_entry() {  # an entry in log $1 with severity $2 and jsonPayload $3 (a JSON object)
  if [ -n "$gcloud_cli" ]; then
    gcloud logging write "$1" "$3" --payload-type=json --severity="$2"
    return
  fi
  local project
  project=$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$metadata/project/project-id") || return 1
  printf '{"entries": [{"logName": "projects/%s/logs/%s", "resource": {"type": "global"}, "severity": "%s", '\\
'"jsonPayload": %s}]}' "$project" "$1" "$2" "$3" \\
    | curl -sf -m 30 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: application/json' \\
      --data-binary @- https://logging.googleapis.com/v2/entries:write >/dev/null
}
read_secret() {  # secret version $1 (projects/P/secrets/S/versions/V), byte for byte on stdout
  if [ -n "$gcloud_cli" ]; then
    gcloud secrets versions access "$1" --quiet
    return
  fi
  local answer
  answer=$(curl -sf -m 30 -H "Authorization: Bearer $(token)" "https://secretmanager.googleapis.com/v1/$1:access") \\
    || return 1
  printf %s "$answer" | sed -n 's/.*"data" *: *"\\([^"]*\\)".*/\\1/p' | base64 -d
}
"""

# The attempt's `failed` entry when the machine cannot be readied: counted against max_failures (the next attempt
# gets a new machine), and no trainer is started. $1 is respawn's own text (no quotes or backslashes).
_FAIL = """fail() {{
  log "$1"
  write_entry {trainer_log} ERROR \\
    "$(printf '{{"event": "failed", "job_id": "%s", "attempt": %d, "worker": %d, "error": "%s"}}' \\
      {job_id} {attempt} "$worker" "$1")" \\
    || log "could not log the failure"
  exit 1
}}
"""

# A note for the operator in log `respawn-startup` (not a lifecycle entry: the control plane never reads it), best
# effort and in the background: it may be Cloud Logging that is out of reach. $1 is the note's kind, $2 its text.
_NOTE = """note() {{
  write_entry {startup_log} WARNING \\
    "$(printf '{{"note": "%s", "job_id": "%s", "attempt": %d, "worker": %d, "detail": "%s"}}' \\
      "$1" {job_id} {attempt} "$worker" "$2")" >/dev/null 2>&1 &
}}
"""

# Compute Engine's TPU boot images (ubuntu-accel-*) come without Docker; Cloud TPU API runtime images and the GPU
# image have it, so there this is one `command -v`. The install is the OS's own package, retried a few times:
# at first boot apt's lock is often held by unattended-upgrades (Lock::Timeout waits for it), and a mirror may
# fail once. Cost: docs/compute-engine.md, The machine; an image with Docker skips it.
_DOCKER = """if ! command -v docker >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "docker is missing and the boot image has no apt-get to install it"
  log "installing Docker from the OS packages"
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l
  for i in 1 2 3 4; do
    apt-get -q -o DPkg::Lock::Timeout=120 update \\
      && apt-get -q -y -o DPkg::Lock::Timeout=120 install docker.io && break
    log "docker install failed (try $i)"; sleep $((i * 15))
  done
  command -v docker >/dev/null 2>&1 || fail "could not install docker (apt-get install docker.io failed 4 times)"
  systemctl enable --now docker || log "could not enable the docker service"
fi
"""

# What JAX's own TPU cluster detection reads (jax/_src/clusters/cloud_tpu_cluster.py): worker-network-endpoints is
# host names (the newer format, which JAX parses from 0.10.0: its changelog names the fix for GCE TPU managed
# instance groups) or NAME:ID:IP triples (Cloud TPU API nodes). The trainer gets them as TPU_WORKER_ID /
# TPU_WORKER_HOSTNAMES. On a multi-host slice the script waits until the metadata names this VM's worker number
# and every peer: Google does not say whether a MIG VM's metadata is complete when its startup script first runs,
# and a VM that read nothing would take itself for worker 0 of a one-host slice.
_TPU_WORKERS = """hosts={hosts}
peers=$(md attributes/worker-network-endpoints)
if [ "$hosts" -gt 1 ]; then
  tries=0
  until number=$(md attributes/agent-worker-number) && peers=$(md attributes/worker-network-endpoints) \\
      && [ "$(printf %s "$peers" | tr ',' '\\n' | grep -c .)" -eq "$hosts" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt {tries} ] || fail "the metadata server never named this VM's worker number and $hosts peers"
    log "waiting for the slice's metadata (agent-worker-number, worker-network-endpoints)"; sleep 5
  done
  case "$number" in ''|*[!0-9]*) fail "agent-worker-number is not a number: $number" ;; esac
  worker=$number
fi
TPU_WORKER_ID=$worker
TPU_WORKER_HOSTNAMES=$(printf %s "$peers" | tr ',' '\\n' | awk -F: 'NF == 3 {{ print $3 }} NF == 1 {{ print $1 }}' \\
  | paste -sd, -)
export TPU_WORKER_ID TPU_WORKER_HOSTNAMES
"""

# Each secret is read with the machine's service account (a few tries), exported into this script's environment
# only and handed to the container by name. One that cannot be read is the attempt's `failed` entry, naming the
# variable and the reference.
_SECRETS = """secret() {
  local value i
  for i in 1 2 3; do
    if value=$(read_secret "$2" && printf .); then
      export "$1=${value%.}"
      return 0
    fi
    [ "$i" -lt 3 ] && sleep $((i * 5))
  done
  fail "could not read secret $1 from $2"
}
"""

# Cloud Storage's JSON API with the machine's token, at STORAGE_EMULATOR_HOST where the machine names another (the
# variable Google's client libraries read; the local cloud's fake-gcs-server), for a head start's drain marker
# (respawn.machine.drain_marker). Uploads: https://cloud.google.com/storage/docs/uploading-objects#uploading-an-object
# (JSON API, uploadType=media); objects.get: https://cloud.google.com/storage/docs/json_api/v1/objects/get (the name
# percent-encoded, "/" too). Object names here are respawn's: spec.py's characters only, encoded below.
_STORAGE = """storage=${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}
case "$storage" in http://* | https://*) ;; *) storage="http://$storage" ;; esac
gs_split() {  # gs://BUCKET/OBJECT -> the caller's bucket and object (percent-encoded)
  local rest=${1#gs://}
  bucket=${rest%%/*}
  object=$(printf %s "${rest#*/}" | sed 's/%/%25/g; s#/#%2F#g; s/+/%2B/g; s/=/%3D/g; s/@/%40/g; s/,/%2C/g; s/~/%7E/g')
}
put_object() {  # object $1 (gs://BUCKET/OBJECT) with the JSON $2
  local bucket object
  gs_split "$1"
  printf %s "$2" | curl -sf -m 10 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: application/json' \\
    --data-binary @- "$storage/upload/storage/v1/b/$bucket/o?uploadType=media&name=$object" >/dev/null
}
has_object() {  # whether object $1 (gs://BUCKET/OBJECT) exists, asked with the token $2
  local bucket object
  gs_split "$1"
  curl -sf -m 5 -o /dev/null -H "Authorization: Bearer $2" "$storage/storage/v1/b/$bucket/o/$object"
}
"""

# A head start (respawn.decide): this machine replaces one that got the notice and may still be saving; its trainer
# starts once that machine's drain marker appears (metadata respawn-drain-marker, polled each second: its trainer
# exited 0 after the notice, so the final save is done) or at metadata respawn-start-after (epoch s), when that
# machine is off, whichever comes first; so it restores what the final save completed. Boot, readying and the image
# pull come first and overlap that save. Without a marker to poll, one sleep. Returns 1 when this machine is shut
# down meanwhile (its trap ran): then no trainer starts. An image labelled respawn.takeover=1 (respawn's trainer's)
# waits itself: its trainer starts at once with RESPAWN_TAKEOVER (the marker's prefix) and RESPAWN_START_AFTER, sets
# itself up (JAX, its programs) while the noticed machine trains on and saves, and restores once the marker appears
# (docs/trainer-protocol.md, The handover). Docker's `image inspect --format` prints the labels as JSON.
_START_AFTER = """wait_to_start() {{
  local after left marker auth
  after=$(md attributes/{key} || true)
  case "$after" in ''|*[!0-9]*) return 0 ;; esac
  left=$((after - $(date +%s)))
  [ "$left" -gt 0 ] && [ -z "$stopping" ] || {{ [ -z "$stopping" ]; return; }}
  marker=$(md attributes/{marker_key} || true)
  case "$marker" in gs://?*/?*.exited) ;; *) marker= ;; esac
  if [ -n "$marker" ] && docker image inspect --format '{{{{json .Config.Labels}}}}' {image} 2>/dev/null \
    | grep -q '"{label}": *"1"'; then
    export {takeover_env}="${{marker%.exited}}" {start_after_env}="$after"
    log "the trainer starts now and takes over once the machine this one replaces has saved ($marker) or is off" \
      "(${{left}}s, {key} $after)"
    return 0
  fi
  if [ -z "$marker" ]; then
    log "waiting ${{left}}s until the machine this one replaces is off ({key} $after)"
    sleep "$left" &
    wait $! || kill $! 2>/dev/null
    [ -z "$stopping" ]
    return
  fi
  log "waiting until the machine this one replaces has saved ($marker) or is off (${{left}}s, {key} $after)"
  auth=$(token)
  while [ -z "$stopping" ] && [ "$(date +%s)" -lt "$after" ]; do
    if has_object "$marker" "$auth"; then
      log "the machine this one replaces has saved ($marker): starting the trainer"
      break
    fi
    sleep 1 &
    wait $! || kill $! 2>/dev/null
  done
  [ -z "$stopping" ]
}}
"""

# This attempt's drain marker (respawn.machine.drain_marker), written by worker 0 when its trainer exited 0 after the
# notice, before the script's `stopped` entry: the final save is done, so a head start's replacement may start its
# trainer. respawn deletes this machine as soon as it reads the trainer's own `stopped`, so the machine may be shutting
# down as the marker is written: the write ignores the shutdown's SIGTERM (curl's own -m bounds it). Best effort:
# without a marker, that trainer starts at its start-after.
_DRAINED = """drained() {{
  local marker={marker}
  (
    trap '' TERM INT HUP
    put_object "$marker" "$(printf '{{"job_id": "%s", "attempt": %d, "exit_code": %d}}' {job_id} {attempt} "$rc")"
  ) || log "could not write the drain marker $marker"
}}
"""

# The trainer image, once per machine (the module docstring). `docker image inspect` says whether the machine has it.
_PULL = """image_mark=${{{mark_env}:-{mark}}}
if ! docker image inspect {image} >/dev/null 2>&1; then
  for i in 1 2 3 4 5; do docker pull {image} && break; log "image pull failed (try $i)"; sleep $((i * 5)); done
{reuse}fi
if docker image inspect {image} >/dev/null 2>&1; then
  mkdir -p "${{image_mark%/*}}" && printf '%s\\n' {image} > "$image_mark" || log "could not note the image pulled"
fi
"""
# An image named by a tag that this machine has: reused when an earlier boot pulled it, else (on the boot image)
# what changed since it was baked, once, and the baked copy when the registry is out of reach.
_REUSE_TAG = """elif [ "$(cat "$image_mark" 2>/dev/null)" = {image} ]; then
  log "the trainer image is on this machine already (pulled at an earlier boot): not pulled again"
else
  docker pull {image} || log "could not refresh the trainer image from its registry: running the copy on this machine"
"""
# An image pinned by digest is the same bytes wherever it is: a machine that has it never pulls it.
_REUSE_DIGEST = """else
  log "the trainer image is on this machine already (pinned by digest): not pulled again"
"""

_RUN = """notice=${{{notice_env}:-{notice}}}
mkdir -p "${{notice%/*}}" && rm -f "$notice"
export {notice_env}="$notice"  # the trainer leaves it when it stops on a peer's notice (docker_run_argv)
stopping=
shutdown() {{
  stopping=1; touch "$notice"
  log "shutdown: stopping the trainer"; docker stop -t {grace} {container} >/dev/null 2>&1
}}
trap shutdown TERM INT HUP
trainer() {{  # runs the container (the command line in "$@") in the background, so the trap can stop it; sets rc
  docker rm -f {container} >/dev/null 2>&1 || true
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  while [ -n "$stopping" ] && [ "$rc" -gt 128 ]; do  # the signal interrupted `wait`: wait for the trainer itself
    stopping=
    wait "$child"
    rc=$?
  done
}}
wait_to_start || {{ log "shut down before the trainer started"; exit 143; }}
{watch}trainer {run}
[ -z "${{watcher-}}" ] || kill "$watcher" 2>/dev/null || true
# 125: docker itself failed. If the cause is the gcplogs driver (a probe container that runs nothing fails the same
# way), Cloud Logging is out of reach (no external IP nor Private Google Access, a hiccup), or this docker has no
# gcplogs driver: the trainer runs again with local logs, which is no failure of the trainer's.
if [ "$rc" -eq 125 ] && [ ! -e "$notice" ]; then
  probe=$(docker run --rm --log-driver=gcplogs --entrypoint /respawn-log-driver-probe {image} 2>&1)
  case "$probe" in
    *"failed to initialize logging driver"* | *"no log driver named"*)
      why=$(printf %s "$probe" | grep -m1 "logging driver\\|log driver" | tr -d '"\\\\' | cut -c1-300)
      log "container logs: docker's gcplogs driver cannot log to Cloud Logging ($why); running the trainer with" \\
        "--log-driver=json-file: its lines are in this script's output and in docker logs {container} while it runs"
      note local-logs "$why"
      trainer {run_local}
      ;;
  esac
fi
log "trainer exited with code $rc"
say() {{  # lifecycle entry $1 (severity $2, more JSON fields $3) from the exit code, in case the trainer sent none
  entry=$(printf '{{"event": "%s", "job_id": "%s", "attempt": %d, "worker": %d, "source": "exit-code", '\\
'"exit_code": %d%s}}' "$1" {job_id} {attempt} "$worker" "$rc" "$3")
  write_entry {trainer_log} "$2" "$entry" || log "could not log $1"
}}
noticed=
if [ -e "$notice" ] || [ "$(md preempted)" = TRUE ]; then noticed=1; fi  # its system event replaces the machine
if [ "$rc" -ne 0 ] && [ -z "$noticed" ]; then  # failed, or killed without a word (OOM, segfault)
  say failed ERROR ", \\"error\\": \\"the trainer exited with code $rc\\""
elif [ "$rc" -eq 0 ] && [ "$worker" -eq 0 ]; then  # worker 0 speaks for a slice
  if [ -n "$noticed" ]; then drained; say stopped WARNING ""; else say completed INFO ""; fi
fi
exit "$rc"
"""


# How long a slice VM waits for its metadata: 120 tries 5 s apart, about 10 minutes.
SLICE_METADATA_TRIES = 120


def _pull(image: str) -> str:
    """The image part of the script (_PULL, with _REUSE_DIGEST or _REUSE_TAG)."""
    q = shlex.quote(image)
    reuse = _REUSE_DIGEST if "@sha256:" in image else _REUSE_TAG.format(image=q)
    return _PULL.format(image=q, mark=shlex.quote(IMAGE_MARK), mark_env=IMAGE_MARK_ENV, reuse=reuse)


def startup_script(spec: JobSpec, attempt: int, mtbi_s: float | None = None) -> str:
    q = shlex.quote
    parts = [_HEADER.format(attempt=int(attempt)), _METADATA, _CLOUD]
    parts.append(_FAIL.format(job_id=q(spec.job_id), attempt=int(attempt), trainer_log=TRAINER_LOG))
    parts.append(_NOTE.format(job_id=q(spec.job_id), attempt=int(attempt), startup_log=STARTUP_LOG))
    parts.append(_STORAGE)
    parts.append(
        _START_AFTER.format(
            key=START_AFTER_METADATA,
            marker_key=DRAIN_MARKER_METADATA,
            image=q(spec.image),
            label=TAKEOVER_LABEL,
            takeover_env=TAKEOVER_ENV,
            start_after_env=START_AFTER_ENV,
        )
    )
    marker = q(drain_marker(spec.checkpoint_uri, attempt))
    parts.append(_DRAINED.format(marker=marker, job_id=q(spec.job_id), attempt=int(attempt)))
    parts.append(_DOCKER)
    if isinstance(spec.machine, GpuMachine):
        parts.append(_GPU)
    else:
        parts.append(_TPU_WORKERS.format(hosts=spec.machine.hosts, tries=SLICE_METADATA_TRIES))
    host = _registry_host(spec.image)
    if host:
        parts.append(_AUTH.format(host=q(host)))
    if spec.secrets:
        parts.append(_SECRETS)
        parts += [f"secret {q(name)} {q(ref)}\n" for name, ref in spec.secrets]
    parts.append(_pull(spec.image))
    parts.append(
        _RUN.format(
            image=q(spec.image),
            container=CONTAINER,
            grace=grace_s(spec),
            notice=q(NOTICE_FILE),
            notice_env=NOTICE_ENV,
            run=shlex.join(docker_run_argv(spec, attempt, mtbi_s=mtbi_s)),
            run_local=shlex.join(docker_run_argv(spec, attempt, LOCAL_LOGS, mtbi_s)),
            watch=(
                _WATCH.format(lead=spec.preemption_notice_s, entry=_notice_entry(spec, attempt))
                if spec.preemption_notice_s is not None
                else ""
            ),
            job_id=q(spec.job_id),
            attempt=int(attempt),
            trainer_log=TRAINER_LOG,
        )
    )
    return "".join(parts)
