# shellcheck shell=bash
# The startup script of one attempt's machine: readies the machine, runs the trainer container, forwards the shutdown
# signal to it, and speaks for a trainer that exited without a word.
#
# Compute Engine runs it as root on every worker VM of the machine at each boot (a Spot VM started again on its own
# disk runs it anew). adapters/startup.py renders it: `#!/bin/bash`, the readonly values it names below (each set
# from the job and the attempt, quoted), then common.sh, then this file. It may rely on bash, the metadata server and
# a boot image's usual tools (curl, sed, awk, grep, tr, paste; apt-get to install docker and the NVIDIA container
# toolkit where the image lacks them).
#
# The values: job_id, attempt, machine (the attempt's machine name: a slice's MIG); machine_kind (gpu or tpu),
# slice_hosts (a slice's worker VMs: a TPU slice's hosts, a GPU machine's vms) and slice_metadata_tries; registry (the Artifact Registry host to log docker in to, or empty); secrets (NAME REF
# pairs); image, image_mark_file and image_mark_env; data_dir and data_dir_env; container and grace_s; notice_file and
# notice_env;
# start_after_key, drain_marker_key, takeover_label, takeover_env and start_after_env; drain_marker (this attempt's);
# trainer_log and startup_log; notice_lead_s (empty without a preemption notice); world_key, slice_key, world_env,
# slice_env, local_copy_env and world_changed_rc (a world of several slices); run and run_local (the trainer's
# `docker run` command lines, with Cloud Logging's and with local logs); exit_entries, exit_code_source, shut_down_rc,
# permanent_exits (CODE CAUSE pairs), oom_killed_rc and oom_killed (respawn/machine.py's exit-code rules).
set -u
log() { echo "respawn-startup: $*" >&2; }
worker=$(this_worker)

# The attempt's `failed` entry when the machine cannot be readied: counted against max_failures (the next attempt
# gets a new machine), and no trainer is started. $1 is respawn's own text (no quotes or backslashes).
fail() {
  log "$1"
  write_entry "$trainer_log" ERROR \
    "$(printf '{"event": "failed", "job_id": "%s", "attempt": %d, "worker": %d, "error": "%s"}' \
      "$job_id" "$attempt" "$worker" "$1")" \
    || log "could not log the failure"
  exit 1
}

# A note for the operator in log startup_log (not a lifecycle entry: the control plane never reads it), best effort
# and in the background: it may be Cloud Logging that is out of reach. $1 is the note's kind, $2 its text.
note() {
  write_entry "$startup_log" WARNING \
    "$(printf '{"note": "%s", "job_id": "%s", "attempt": %d, "worker": %d, "detail": "%s"}' \
      "$1" "$job_id" "$attempt" "$worker" "$2")" >/dev/null 2>&1 &
}

# Cloud Storage's JSON API with the machine's token, at STORAGE_EMULATOR_HOST where the machine names another (the
# variable Google's client libraries read; the local cloud's fake-gcs-server), for a head start's drain marker
# (respawn.machine.drain_marker). Uploads: https://cloud.google.com/storage/docs/uploading-objects#uploading-an-object
# (JSON API, uploadType=media); objects.get: https://cloud.google.com/storage/docs/json_api/v1/objects/get (the name
# percent-encoded, "/" too). Object names here are respawn's: spec.py's characters only, encoded below.
storage=${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}
case "$storage" in http://* | https://*) ;; *) storage="http://$storage" ;; esac
gs_split() {  # gs://BUCKET/OBJECT -> the caller's bucket and object (percent-encoded)
  local rest=${1#gs://}
  bucket=${rest%%/*}
  object=$(printf %s "${rest#*/}" | sed 's/%/%25/g; s#/#%2F#g; s/+/%2B/g; s/=/%3D/g; s/@/%40/g; s/,/%2C/g; s/~/%7E/g')
}
put_object() {  # object $1 (gs://BUCKET/OBJECT) with the JSON $2
  local bucket object
  gs_split "$1"
  printf %s "$2" | curl -sf -m 10 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: application/json' \
    --data-binary @- "$storage/upload/storage/v1/b/$bucket/o?uploadType=media&name=$object" >/dev/null
}
has_object() {  # whether object $1 (gs://BUCKET/OBJECT) exists, asked with the token $2
  local bucket object
  gs_split "$1"
  curl -sf -m 5 -o /dev/null -H "Authorization: Bearer $2" "$storage/storage/v1/b/$bucket/o/$object"
}

# A head start (respawn.decide): this machine replaces one that got the notice and may still be saving; its trainer
# starts once that machine's drain marker appears (metadata drain_marker_key, polled each second: its trainer exited 0
# after the notice, so the final save is done) or at metadata start_after_key (epoch s), when that machine is off,
# whichever comes first; so it restores what the final save completed. Boot, readying and the image pull come first
# and overlap that save. Without a marker to poll, one sleep. Returns 1 when this machine is shut down meanwhile (its
# trap ran): then no trainer starts. An image labelled takeover_label=1 (respawn's trainer's) waits itself: its trainer
# starts at once with takeover_env (the marker's prefix) and start_after_env, sets itself up (JAX, its programs) while
# the noticed machine trains on and saves, and restores once the marker appears (docs/trainer-protocol.md, The
# handover). Docker's `image inspect --format` prints the labels as JSON.
wait_to_start() {
  local after left marker auth
  after=$(md "attributes/$start_after_key" || true)
  case "$after" in ''|*[!0-9]*) return 0 ;; esac
  left=$((after - $(date +%s)))
  # shellcheck disable=SC2015  # time left and not stopping: wait below; else return whether not stopping
  [ "$left" -gt 0 ] && [ -z "$stopping" ] || { [ -z "$stopping" ]; return; }
  marker=$(md "attributes/$drain_marker_key" || true)
  case "$marker" in gs://?*/?*.exited) ;; *) marker= ;; esac
  if [ -n "$marker" ] && docker image inspect --format '{{json .Config.Labels}}' "$image" 2>/dev/null \
    | grep -q "\"$takeover_label\": *\"1\""; then
    export "$takeover_env=${marker%.exited}" "$start_after_env=$after"
    log "the trainer starts now and takes over once the machine this one replaces has saved ($marker) or is off" \
      "(${left}s, $start_after_key $after)"
    return 0
  fi
  if [ -z "$marker" ]; then
    log "waiting ${left}s until the machine this one replaces is off ($start_after_key $after)"
    sleep "$left" &
    wait $! || kill $! 2>/dev/null
    [ -z "$stopping" ]
    return
  fi
  log "waiting until the machine this one replaces has saved ($marker) or is off (${left}s, $start_after_key $after)"
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
}

# This attempt's drain marker (respawn.machine.drain_marker), written by worker 0 when its trainer exited 0 after the
# notice, before the script's `stopped` entry: the final save is done, so a head start's replacement may start its
# trainer. respawn deletes this machine as soon as it reads the trainer's own `stopped`, so the machine may be
# shutting down as the marker is written: the write ignores the shutdown's SIGTERM (curl's own -m bounds it). Best
# effort: without a marker, that trainer starts at its start-after.
drained() {
  (
    trap '' TERM INT HUP
    put_object "$drain_marker" \
      "$(printf '{"job_id": "%s", "attempt": %d, "exit_code": %d}' "$job_id" "$attempt" "$rc")"
  ) || log "could not write the drain marker $drain_marker"
}

# apt-get install of packages "${@:2}" (four tries), or the attempt's `failed` entry: $1, then the cause (apt's last
# error line). At first boot apt's lock is often held by unattended-upgrades (DPkg::Lock::Timeout waits for it, for
# the lists and the packages both), and a mirror may fail once. apt's output follows in this script's own output.
apt_install() {
  local why=$1 i out cause=''
  shift
  command -v apt-get >/dev/null 2>&1 || fail "$why: the boot image has no apt-get"
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l
  for i in 1 2 3 4; do
    if out=$({ apt-get -q -o DPkg::Lock::Timeout=120 update \
        && apt-get -q -y -o DPkg::Lock::Timeout=120 install "$@"; } 2>&1); then
      printf '%s\n' "$out" >&2
      return 0
    fi
    printf '%s\n' "$out" >&2
    # shellcheck disable=SC1003  # quotes and backslashes deleted, not a quote escaped
    cause=$(printf '%s\n' "$out" | grep -E '^(E:|Err:[0-9])' | sed -n '$p' | tr -d '"\\' | tr -s '\t' ' ' | cut -c1-300)
    log "apt-get install $* failed (try $i): ${cause:-no error line}"
    [ "$i" -eq 4 ] || sleep $((i * 15))
  done
  fail "$why: apt-get install $* failed 4 times (${cause:-apt-get printed no error line})"
}

# Compute Engine's TPU boot images (ubuntu-accel-*) come without Docker; Cloud TPU API runtime images and the GPU
# image have it, so there this is one `command -v`. The install is the OS's own package (apt_install: waits for
# apt's lock, retries, fails the attempt with the cause). Cost: docs/compute-engine.md, The machine; an image with
# Docker skips it.
ready_docker() {
  if ! command -v docker >/dev/null 2>&1; then
    log "installing Docker from the OS packages"
    apt_install "could not install docker" docker.io
    command -v docker >/dev/null 2>&1 || fail "could not install docker: apt-get installed docker.io without it"
    systemctl enable --now docker || log "could not enable the docker service"
  fi
}

# The Deep Learning VM image installs the driver on first boot (metadata install-nvidia-driver=True): waited for, up
# to 10 minutes, else the attempt fails naming nvidia-smi's last word. The NVIDIA Container Toolkit provides
# `docker run --gpus`: installed from NVIDIA's apt repository where the image lacks it (apt_install, as Docker is),
# its key and list fetched with a few tries; any step that fails is the attempt's `failed` entry with its cause.
ready_gpu() {
  local i smi='' keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  local repo=https://nvidia.github.io/libnvidia-container
  for i in $(seq 1 120); do
    smi=$(nvidia-smi 2>&1) && break
    # shellcheck disable=SC1003  # quotes and backslashes deleted, not a quote escaped
    smi=$(printf '%s\n' "$smi" | grep -m1 . | tr -d '"\\' | cut -c1-200)
    [ "$i" -lt 120 ] || fail "the NVIDIA driver did not come up in 10 minutes (nvidia-smi: ${smi:-no output})"
    log "waiting for the NVIDIA driver"; sleep 5
  done
  if ! command -v nvidia-ctk >/dev/null 2>&1; then
    log "installing the NVIDIA Container Toolkit"
    for i in 1 2 3 4; do
      curl -fsSL -m 60 "$repo/gpgkey" | gpg --batch --yes --dearmor -o "$keyring" \
        && curl -fsSL -m 60 "$repo/stable/deb/nvidia-container-toolkit.list" \
          | sed "s#deb https://#deb [signed-by=$keyring] https://#g" \
          > /etc/apt/sources.list.d/nvidia-container-toolkit.list \
        && grep -q '^deb ' /etc/apt/sources.list.d/nvidia-container-toolkit.list && break
      [ "$i" -lt 4 ] || fail "could not install the NVIDIA Container Toolkit: $repo unreachable (4 tries)"
      log "could not fetch the NVIDIA Container Toolkit's repository (try $i)"; sleep $((i * 15))
    done
    apt_install "could not install the NVIDIA Container Toolkit" nvidia-container-toolkit
    nvidia-ctk runtime configure --runtime=docker \
      || fail "could not configure docker for GPUs (nvidia-ctk runtime configure --runtime=docker failed)"
    systemctl restart docker || fail "could not restart docker after configuring it for GPUs"
  fi
}

# What JAX's own TPU cluster detection reads (jax/_src/clusters/cloud_tpu_cluster.py): worker-network-endpoints is
# host names (the newer format, which JAX parses from 0.10.0: its changelog names the fix for GCE TPU managed
# instance groups) or NAME:ID:IP triples (Cloud TPU API nodes). The trainer gets them as TPU_WORKER_ID /
# TPU_WORKER_HOSTNAMES. On a multi-host slice the script waits until the metadata names this VM's worker number
# and every peer: Google does not say whether a MIG VM's metadata is complete when its startup script first runs,
# and a VM that read nothing would take itself for worker 0 of a one-host slice.
ready_tpu_workers() {
  peers=$(md attributes/worker-network-endpoints)
  if [ "$slice_hosts" -gt 1 ]; then
    tries=0
    until number=$(md attributes/agent-worker-number) && peers=$(md attributes/worker-network-endpoints) \
        && [ "$(printf %s "$peers" | tr ',' '\n' | grep -c .)" -eq "$slice_hosts" ]; do
      tries=$((tries + 1))
      [ "$tries" -lt "$slice_metadata_tries" ] \
        || fail "the metadata server never named this VM's worker number and $slice_hosts peers"
      log "waiting for the slice's metadata (agent-worker-number, worker-network-endpoints)"; sleep 5
    done
    case "$number" in ''|*[!0-9]*) fail "agent-worker-number is not a number: $number" ;; esac
    worker=$number
  fi
  TPU_WORKER_ID=$worker
  TPU_WORKER_HOSTNAMES=$(printf %s "$peers" | tr ',' '\n' | awk -F: 'NF == 3 { print $3 } NF == 1 { print $1 }' \
    | paste -sd, -)
  export TPU_WORKER_ID TPU_WORKER_HOSTNAMES
}

# A GPU machine of several VMs (machine.vms) is a MIG named after the attempt's machine. Google's metadata server names
# no peers of a GPU VM, as it does a TPU slice's: the MIG's VMs are listed through the Compute Engine API with the
# machine's token (listManagedInstances) until all slice_hosts are there; sorted by name they are the processes of
# jax.distributed, this VM's place among them its process id, and the first one serves the coordinator (Compute
# Engine's internal DNS resolves a VM's name in its network). The trainer reads them as a TPU slice's worker does:
# TPU_WORKER_ID and TPU_WORKER_HOSTNAMES.
ready_gpu_workers() {
  [ "$slice_hosts" -gt 1 ] || return 0
  local me zone project names tries=0
  local compute_api=${CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE:-https://compute.googleapis.com/compute/v1/}
  if ! { me=$(md name) && zone=$(md zone) \
      && project=$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$metadata/project/project-id"); }; then
    fail "the metadata server did not name this VM, its zone and its project"
  fi
  until names=$(curl -sf -m 30 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Length: 0' \
        "${compute_api}projects/$project/zones/${zone##*/}/instanceGroupManagers/$machine/listManagedInstances" \
        | grep -o '"instance" *: *"[^"]*"' | sed 's#.*/##; s#"$##' | LC_ALL=C sort) \
      && [ "$(printf '%s\n' "$names" | grep -c .)" -eq "$slice_hosts" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt "$slice_metadata_tries" ] || fail "the MIG $machine never listed its $slice_hosts VMs"
    log "waiting for the MIG's $slice_hosts VMs (listManagedInstances)"; sleep 5
  done
  worker=$(printf '%s\n' "$names" | grep -nxF "$me" | cut -d: -f1)
  [ -n "$worker" ] || fail "this VM is not one of its MIG's VMs"
  worker=$((worker - 1))
  TPU_WORKER_ID=$worker
  TPU_WORKER_HOSTNAMES=$(printf '%s\n' "$names" | paste -sd, -)
  export TPU_WORKER_ID TPU_WORKER_HOSTNAMES
}

# Docker's credentials for Artifact Registry: the machine's token as the password of user oauth2accesstoken
# (https://cloud.google.com/artifact-registry/docs/docker/authentication#token).
registry_login() {
  token | docker login -u oauth2accesstoken --password-stdin "https://$registry" >/dev/null \
    || log "could not log docker in to $registry"
}

# Each secret is read with the machine's service account (a few tries), exported into this script's environment
# only and handed to the container by name. One that cannot be read is the attempt's `failed` entry, naming the
# variable and the reference.
secret() {
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

# The data directory on this machine's own disk (data_dir, or the directory the variable data_dir_env names where the
# machine names another), writable to the container's user whatever its uid, as /tmp is: this script runs as root.
# Mounted into the container and named to it by data_dir_env, it keeps what the trainer copies there (a dataset's
# shards) for this machine's later attempts, out of the container's writable layer. Without it the trainer copies
# into its own home.
ready_data_dir() {
  local dir=${!data_dir_env:-$data_dir}
  if mkdir -p "$dir" && chmod 1777 "$dir"; then
    export "$data_dir_env=$dir"
  else
    log "could not make the data directory $dir: the trainer keeps its data in the container"
    unset "$data_dir_env"
  fi
}

# The trainer image, once per machine: a machine that has it (an earlier boot of this machine pulled it, so a Spot VM
# restarted on its own disk, or it is pinned by digest) runs it without asking the registry; one whose boot image
# holds it under a tag (baked: docs/operations.md, Machines that start fast) fetches only what changed since, once,
# and runs the copy it has when the registry is out of reach. The image mark on the machine's disk (image_mark_file,
# or the file the variable named image_mark_env names) names the image an earlier boot pulled; `docker image
# inspect` says whether the machine has it.
pull_image() {
  image_mark=${!image_mark_env:-$image_mark_file}
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    for i in 1 2 3 4 5; do docker pull "$image" && break; log "image pull failed (try $i)"; sleep $((i * 5)); done
  else
    case "$image" in
      *@sha256:*)  # pinned by digest: the same bytes wherever it is, so a machine that has it never pulls it
        log "the trainer image is on this machine already (pinned by digest): not pulled again" ;;
      *)  # named by a tag: reused when an earlier boot pulled it, else (on the boot image) refreshed once
        if [ "$(cat "$image_mark" 2>/dev/null)" = "$image" ]; then
          log "the trainer image is on this machine already (pulled at an earlier boot): not pulled again"
        else
          docker pull "$image" \
            || log "could not refresh the trainer image from its registry: running the copy on this machine"
        fi ;;
    esac
  fi
  if docker image inspect "$image" >/dev/null 2>&1; then
    # shellcheck disable=SC2015  # the note when either step fails
    mkdir -p "${image_mark%/*}" && printf '%s\n' "$image" > "$image_mark" || log "could not note the image pulled"
  fi
}

# The job's preemption_notice: this Spot VM's metadata says `preempted` that long before its soft off (and its
# shutdown script). respawn hears of it at once (the `notice` entry: the head start), and the trainer's exit will
# read as `stopped`; the trainer trains on until its own notice (RESPAWN_NOTICE_LEAD_S after the flag, in
# respawn_trainer) or the shutdown script's SIGTERM, so the next machine boots while this one still trains.
watch_notice() {
  until [ "$(md preempted)" = TRUE ]; do sleep 1; done
  echo preempted > "$notice"
  log "the metadata server says preempted: the soft off follows in ${notice_lead_s}s"
  notice_entry
}

ready_docker
if [ "$machine_kind" = gpu ]; then ready_gpu; ready_gpu_workers; else ready_tpu_workers; fi
[ -z "$registry" ] || registry_login
for ((i = 0; i < ${#secrets[@]}; i += 2)); do secret "${secrets[i]}" "${secrets[i + 1]}"; done
pull_image
ready_data_dir

notice=${!notice_env:-$notice_file}  # the file the variable named notice_env names, where the machine names another
make_notice_dir && rm -f "$notice"
echo "$worker" > "${notice%/*}/worker" || log "could not note this VM's worker number"  # for the shutdown script
export "$notice_env=$notice"  # the trainer leaves it when it stops on a peer's notice (docker_run_argv)
stopping=
# shellcheck disable=SC2317  # run by the trap
shutdown() {
  stopping=1; touch "$notice"
  log "shutdown: stopping the trainer"; docker stop -t "$grace_s" "$container" >/dev/null 2>&1
}
trap shutdown TERM INT HUP
trainer() {  # runs the container (the command line in "$@") in the background, so the trap can stop it; sets rc
  docker rm -f "$container" >/dev/null 2>&1 || true
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  while [ -n "$stopping" ] && [ "$rc" -gt 128 ]; do  # the signal interrupted `wait`: wait for the trainer itself
    stopping=
    wait "$child"
    rc=$?
  done
}
# A world of several slices (docs/design/several-slices.md, Telling the machines): the metadata key world_key names
# the world this machine's slice (slice_key) is a member of, {"version": N, ...}. The trainer runs in the version the
# key names, with a local copy of its saves on this machine's disk. A trainer that exits world_changed_rc left its
# world for a newer one: it runs again here, on the machine it already runs (no create, boot or pull), once the key
# names a version above the one it ran. The metadata server's own hanging GET (wait_for_change) says when; nothing on
# the machine asks the control plane. Without the key, nothing of this runs.
world_of() {  # the version in the key's value $1
  printf %s "$1" | sed -n 's/.*"version": *\([0-9][0-9]*\).*/\1/p' | head -n 1
}
member_of() {  # whether the key's value $1 lists slice $2 in its "members"
  printf %s "$1" | tr -d '\r\n' | sed -n 's/.*"members": *\[\([0-9, ]*\)\].*/\1/p' | tr -c '0-9' '\n' | grep -qx "$2"
}
# newer_world waits until the key names a version above $1 (then world_next; the reply, headers and value, world_value);
# it fails once the machine stops.
newer_world() {
  local query='' reply asking=''
  reply=$(mktemp)
  while [ -z "$stopping" ]; do
    curl -sf -m 70 -D - -H 'Metadata-Flavor: Google' "$metadata/instance/attributes/$world_key$query" > "$reply" &
    asking=$!
    if wait "$asking"; then  # in the background, so that the shutdown trap runs at once
      world_value=$(cat "$reply")  # the headers, then the value
      world_next=$(world_of "$world_value")
      if [ "${world_next:-0}" -gt "$1" ]; then rm -f "$reply"; return 0; fi
      query="?wait_for_change=true&timeout_sec=60&last_etag=$(tr -d '\r' < "$reply" | sed -n 's/^[Ee][Tt][Aa][Gg]: *//p')"
    elif [ -z "$stopping" ]; then
      sleep 1  # no key yet, or no answer: a metadata server may answer a missing key at once
    fi
  done
  [ -z "$asking" ] || kill "$asking" 2>/dev/null  # none yet where the shutdown came first
  rm -f "$reply"
  return 1
}
world_value=$(md "attributes/$world_key") && world=$(world_of "$world_value") || world=
if [ -n "$world" ]; then
  export "$world_env=$world" "$slice_env=$(md "attributes/$slice_key" || echo 0)"
  [ -z "${!data_dir_env-}" ] || export "$local_copy_env=${!data_dir_env}/local-copy"
  # A slice that the key's world does not list yet (a replacement, set up while the others train) runs its trainer
  # all the same: the trainer says `ready` once it is warm and waits to be let in (respawn_trainer.world.join).
  member_of "$world_value" "${!slice_env}" || log "slice ${!slice_env} is not a member of world $world yet: the" \
    "trainer says ready and waits for a world with it ($world_key)"
fi

wait_to_start || { log "shut down before the trainer started"; exit "$shut_down_rc"; }
if [ -n "$notice_lead_s" ]; then
  watch_notice &
  watcher=$!
fi
started=$(date +%s)  # Docker's events of the trainer's container count from here (killed_for_memory)
trainer "${run[@]}"
[ -z "${watcher-}" ] || kill "$watcher" 2>/dev/null || true
# 125: docker itself failed. If the cause is the gcplogs driver (a probe container that runs nothing fails the same
# way), Cloud Logging is out of reach (no external IP nor Private Google Access, a hiccup), or this docker has no
# gcplogs driver: the trainer runs again with local logs, which is no failure of the trainer's.
if [ "$rc" -eq 125 ] && [ ! -e "$notice" ]; then
  probe=$(docker run --rm --log-driver=gcplogs --entrypoint /respawn-log-driver-probe "$image" 2>&1)
  case "$probe" in
    *"failed to initialize logging driver"* | *"no log driver named"*)
      # shellcheck disable=SC1003  # quotes and backslashes deleted, not a quote escaped
      why=$(printf %s "$probe" | grep -m1 "logging driver\|log driver" | tr -d '"\\' | cut -c1-300)
      log "container logs: docker's gcplogs driver cannot log to Cloud Logging ($why); running the trainer with" \
        "--log-driver=json-file: its lines are in this script's output and in docker logs $container while it runs"
      note local-logs "$why"
      trainer "${run_local[@]}"
      ;;
  esac
fi
log "trainer exited with code $rc"
# A trainer that left its world joins the next one in its own process where it can (respawn_trainer's Run.reform): the
# world it ran last is in its local copy's directory, and the entries and the wait below count from that one.
ran_world() {
  local ran
  ran=$(cat "${!local_copy_env:-/nonexistent}/world" 2>/dev/null) || return 0
  if [[ "$ran" =~ ^[0-9]+$ ]] && [ "$ran" -gt "$world" ]; then
    world=$ran
    export "$world_env=$world"
  fi
}
[ -z "$world" ] || ran_world

# The entry the exit code speaks for a trainer that may have said nothing (docs/trainer-protocol.md, Exit codes):
# the row of exit_entries (respawn/machine.py's EXIT_ENTRIES, rows KEY:EVENT:SEVERITY) whose KEY is three digits,
# 1 for yes and 0 for no: the exit code is 0, the machine got the notice (its system event replaces the machine),
# this is worker 0 (which speaks for a slice). No row: nothing to say. In a world, each entry names its version.
say() {  # lifecycle entry $1 (severity $2, more JSON fields $3) from the exit code, in case the trainer sent none
  local told=${world:+, \"world\": $world}
  entry=$(printf '{"event": "%s", "job_id": "%s", "attempt": %d, "worker": %d, "source": "%s", '\
'"exit_code": %d%s%s}' "$1" "$job_id" "$attempt" "$worker" "$exit_code_source" "$rc" "$told" "$3")
  write_entry "$trainer_log" "$2" "$entry" || log "could not log $1"
}
# Why a trainer failed where no other machine of the job would do better, from its exit code: the cause and the fix
# (permanent_exits), or the kernel's OOM killer, which Docker reports as the container's `oom` event (its
# State.OOMKilled; the container itself is gone, run with --rm). Empty for a failure worth another machine.
permanent_cause() {
  local i
  for ((i = 0; i < ${#permanent_exits[@]}; i += 2)); do
    if [ "$rc" = "${permanent_exits[i]}" ]; then echo "${permanent_exits[i + 1]}"; return; fi
  done
  if [ "$rc" = "$oom_killed_rc" ] && killed_for_memory; then echo "$oom_killed"; fi
}
killed_for_memory() {  # until a second past now, so that an event still on its way is waited for
  docker events --since "$started" --until "$(($(date +%s) + 1))" --filter type=container --filter event=oom \
    --format '{{.Actor.Attributes.name}}' 2>/dev/null | grep -qx "$container"
}
noticed() {
  [ -e "$notice" ] || [ "$(md preempted)" = TRUE ]
}
speak_for_the_exit() {
  local noticed=0 event='' severity='' row because permanent
  if noticed; then noticed=1; fi
  for row in $exit_entries; do
    case "$row" in "$((rc == 0))$noticed$((worker == 0)):"*) IFS=: read -r _ event severity <<< "$row" ;; esac
  done
  case "$event" in
    failed)  # or killed without a word; with a cause, no other machine of the job would do better
      because=$(permanent_cause) permanent=''
      if [ -n "$because" ]; then because=": $because" permanent=', "permanent": true'; fi
      say failed "$severity" ", \"error\": \"the trainer exited with code $rc$because\"$permanent" ;;
    stopped) drained; say stopped "$severity" "" ;;  # its final save is done: the drain marker first
    ?*) say "$event" "$severity" "" ;;
  esac
}

# In a world, a trainer that did not end (exit 0) nor get this machine's notice runs again here once the key names a
# newer world: one that left for it (exit 75), and one that failed, which says so first (the control plane makes the
# next world from a failure of this one, and ignores the failures of an older one: a peer's crash breaks every
# process's collectives). A failure no other machine would escape ends the job, and the machine with it.
while [ -n "$world" ] && [ "$rc" -ne 0 ] && [ -z "$stopping" ] && ! noticed; do
  if [ "$rc" -ne "$world_changed_rc" ]; then speak_for_the_exit; fi
  log "the trainer left world $world (exit $rc): waiting for a newer one ($world_key)"
  newer_world "$world" || break
  world=$world_next
  export "$world_env=$world"
  log "the trainer runs again, in world $world"
  trainer "${run[@]}"
  log "trainer exited with code $rc"
  ran_world
done
speak_for_the_exit
exit "$rc"
