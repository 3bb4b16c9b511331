# shellcheck shell=bash
# What both of a machine's scripts (startup.sh, shutdown.sh) use to reach its metadata server and Google's APIs.
#
# Rendered into each script by adapters/startup.py, after the readonly values and before the script itself, so it
# runs first on every worker VM of the machine, as root, at boot (startup.sh) and at shutdown (shutdown.sh). It only
# defines: it may rely on the values job_id, attempt and trainer_log, on curl, sed and base64, and on nothing else.
#
# The metadata server's address: metadata.google.internal, or GCE_METADATA_HOST where the machine names another (the
# variable Google's client libraries read; the local cloud's machines have a local server). Cloud Logging and Secret
# Manager through their REST APIs with the token of the machine's service account from the metadata server, never
# through gcloud: no source says every TPU image has it, and where it is a snap (Ubuntu's TPU and GPU images) it fails
# during shutdown (TransactionIsDestructive), when the `notice` and exit-code entries are written. An entry has
# resource `global`, as `gcloud logging write` writes it. docs/cloud-contracts.md, The machine.

metadata="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
md() {
  curl -sf -m 2 -H 'Metadata-Flavor: Google' "$metadata/instance/$1"
}
# Every worker VM of a slice runs the scripts; which one this is: a TPU slice's metadata server says so, a GPU slice's
# startup script noted it beside the notice file (startup.sh, ready_gpu_workers); else 0.
this_worker() {
  local number
  number=$(md attributes/agent-worker-number || cat "${notice:+${notice%/*}/worker}" 2>/dev/null || echo 0)
  case "$number" in ''|*[!0-9]*) number=0 ;; esac
  echo "$number"
}
token() {  # an OAuth access token of the machine's service account
  curl -sf -m 10 -H 'Metadata-Flavor: Google' "$metadata/instance/service-accounts/default/token" \
    | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p'
}
# Each API's root: Google's, or where gcloud's endpoint overrides name another (the local cloud's machines).
logging_api=${CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING:-https://logging.googleapis.com/}
secretmanager_api=${CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER:-https://secretmanager.googleapis.com/}
write_entry() {  # an entry in log $1 with severity $2 and jsonPayload $3 (a JSON object)
  local project
  project=$(curl -sf -m 2 -H 'Metadata-Flavor: Google' "$metadata/project/project-id") || return 1
  printf '{"entries": [{"logName": "projects/%s/logs/%s", "resource": {"type": "global"}, "severity": "%s", '\
'"jsonPayload": %s}]}' "$project" "$1" "$2" "$3" \
    | curl -sf -m 30 -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: application/json' \
      --data-binary @- "${logging_api}v2/entries:write" >/dev/null
}
read_secret() {  # secret version $1 (projects/P/secrets/S/versions/V), byte for byte on stdout
  local answer
  answer=$(curl -sf -m 30 -H "Authorization: Bearer $(token)" "${secretmanager_api}v1/$1:access") || return 1
  printf %s "$answer" | sed -n 's/.*"data" *: *"\([^"]*\)".*/\1/p' | base64 -d
}
# The notice file's directory, writable to the container's user whatever its uid (the trainer leaves the file when
# it stops on a slice peer's notice), as /tmp is: this script runs as root.
make_notice_dir() {
  mkdir -p "${notice%/*}" && chmod 1777 "${notice%/*}"
}
# The `notice` entry (docs/trainer-protocol.md), whatever the trainer, so that respawn may request the next machine at
# once (a head start): from the shutdown script, and from the startup script's watch of the metadata `preempted` flag.
notice_entry() {
  write_entry "$trainer_log" WARNING \
    "$(printf '{"event": "notice", "job_id": "%s", "attempt": %d, "worker": %d}' "$job_id" "$attempt" "$worker")" \
    || echo "respawn: could not log the notice" >&2
}
