# shellcheck shell=bash
# The shutdown script of one attempt's machine: the notice marked, the trainer stopped within its grace, respawn told.
#
# Compute Engine runs it as root on every worker VM it reaches, on the notice (ACPI soft off) and on any other
# shutdown, while the startup script (startup.sh) may still run the trainer. adapters/startup.py renders it:
# `#!/bin/bash`, the readonly values job_id, attempt, container, grace_s, notice_file, notice_env and trainer_log, then
# common.sh, then this file. It may rely on curl and docker, and on nothing the startup script set up.
#
# The marker first, then the trainer's grace period to save and exit, and meanwhile the `notice` entry
# (docs/trainer-protocol.md), whatever the trainer, so that respawn may request the next machine at once. A deleted
# machine writes it too; respawn reads it only for the running attempt it names.

notice=${!notice_env:-$notice_file}  # the file the variable named notice_env names, where the machine names another
make_notice_dir && touch "$notice"
# A preemption, not a deletion: the trainer may hand over to a head start's (docs/trainer-protocol.md, The handover)
[ "$(curl -sf -m 1 -H 'Metadata-Flavor: Google' "$metadata/instance/preempted")" = TRUE ] \
  && echo preempted > "$notice"
docker stop -t "$grace_s" "$container" &
worker=$(this_worker)
notice_entry
wait
