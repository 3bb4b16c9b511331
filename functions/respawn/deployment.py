"""Deployed configuration: Settings from the environment (bootstrap.py builds the functions' Service from them).

A leaf: it imports nothing of respawn, so every room may read it.

The same variables configure the functions and the CLI (SPEC: deployed
configuration). A missing setting is one clear error naming the variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


class SettingsError(Exception):
    """A required setting is missing or invalid (str(e) is one line naming the variable)."""


# setting -> (environment variable, what it must name)
VARIABLES = {
    "project": ("RESPAWN_PROJECT", "the Google Cloud project id (GOOGLE_CLOUD_PROJECT is the fallback)"),
    "state_bucket": ("RESPAWN_STATE_BUCKET", "the bucket that holds the job records (gs://BUCKET/respawn/jobs/)"),
    "jobs_topic": ("RESPAWN_JOBS_TOPIC", "the Pub/Sub topic of job messages (default respawn-jobs)"),
    "events_topic": (
        "RESPAWN_EVENTS_TOPIC",
        "the Pub/Sub topic of log entries and sweep ticks (default respawn-events)",
    ),
    "status_topic": (
        "RESPAWN_STATUS_TOPIC",
        "the Pub/Sub topic of status messages, respawn-status as deployed (unset: no notices are published)",
    ),
}
# Seconds of the machines' own timings per real second (decide.Policy.time_scale): 1 in the cloud; the local cloud
# sets its recovery profile's scale (1/60 for `--profile cloud`), so that a head start's drain reads in its time.
TIME_SCALE = "RESPAWN_TIME_SCALE"


@dataclass(frozen=True)
class Settings:
    project: str = ""
    state_bucket: str = ""
    jobs_topic: str = "respawn-jobs"
    events_topic: str = "respawn-events"
    status_topic: str | None = None  # None: publish no status messages
    machine_service_account: str | None = None
    tpu_endpoint: str | None = None  # local cloud only: http://127.0.0.1:PORT
    compute_endpoint: str | None = None  # local cloud only
    time_scale: float = 1.0  # RESPAWN_TIME_SCALE: local cloud only (a recovery profile replayed faster)

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = e.get(name, "").strip()
            return value or None

        return Settings(
            project=get("RESPAWN_PROJECT") or get("GOOGLE_CLOUD_PROJECT") or "",
            state_bucket=(get("RESPAWN_STATE_BUCKET") or "").removeprefix("gs://").rstrip("/"),
            jobs_topic=get("RESPAWN_JOBS_TOPIC") or "respawn-jobs",
            events_topic=get("RESPAWN_EVENTS_TOPIC") or "respawn-events",
            status_topic=get("RESPAWN_STATUS_TOPIC"),
            machine_service_account=get("RESPAWN_MACHINE_SERVICE_ACCOUNT"),
            tpu_endpoint=get("RESPAWN_TPU_ENDPOINT"),
            compute_endpoint=get("RESPAWN_COMPUTE_ENDPOINT"),
            time_scale=_time_scale(get(TIME_SCALE)),
        )

    def require(self, *names: str) -> Settings:
        """Raise SettingsError naming the first of `names` that is empty; return self otherwise."""
        for name in names:
            if not getattr(self, name):
                variable, meaning = VARIABLES[name]
                raise SettingsError(f"{variable} is not set: it must name {meaning}")
        return self


def _time_scale(text: str | None) -> float:
    """RESPAWN_TIME_SCALE as a number; SettingsError (one line) for anything but a positive finite number."""
    if text is None:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SettingsError(
            f"{TIME_SCALE} is {text!r}: it must be a positive number (local seconds per real second; default 1)"
        )
    return value
