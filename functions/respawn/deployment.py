"""Deployed configuration: Settings from the environment (bootstrap.py builds the functions' Service from them).

Nearly a leaf: of respawn it imports only the job message's rule for an image (respawn.spec.values), and only when
RESPAWN_TRAINER_IMAGES is set, so every room may read it.

The same variables configure the functions and the CLI (SPEC: deployed
configuration). A missing setting is one clear error naming the variable.
"""

from __future__ import annotations

import json
import math
import os
import re
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
# The machines' network (infra/terraform/network.tf): every create names it; unset, the project's default network
# with an external IP.
NETWORK, SUBNETWORK, EXTERNAL_IP = "RESPAWN_NETWORK", "RESPAWN_SUBNETWORK", "RESPAWN_EXTERNAL_IP"
_NETWORK = re.compile(r"projects/[a-z][-a-z0-9.:]*[a-z0-9]/global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# The deployment's own trainer image of each machine kind, a JSON object {"gpu": IMAGE, "tpu": IMAGE}
# (infra/terraform/functions.tf): the image of a job message without one (respawn.spec.parse_job_message)
IMAGES = "RESPAWN_TRAINER_IMAGES"
MACHINE_KINDS = ("gpu", "tpu")


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
    network: str | None = None  # projects/P/global/networks/N; None: the project's default network
    subnetwork: str | None = None  # a subnetwork name in every region a job uses; None: the network's own
    external_ips: bool = True
    trainer_images: tuple[tuple[str, str], ...] = ()  # RESPAWN_TRAINER_IMAGES: (kind, image) pairs, by kind

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
            network=_matching(NETWORK, get(NETWORK), _NETWORK, "projects/PROJECT/global/networks/NAME"),
            subnetwork=_matching(
                SUBNETWORK, get(SUBNETWORK), _NAME, "a subnetwork name (lowercase letters, digits, -)"
            ),
            external_ips=_boolean(EXTERNAL_IP, get(EXTERNAL_IP), default=True),
            trainer_images=_trainer_images(get(IMAGES)),
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


def _trainer_images(text: str | None) -> tuple[tuple[str, str], ...]:
    """RESPAWN_TRAINER_IMAGES as (kind, image) pairs: a JSON object of machine kinds to images, each image checked as
    a job message's `image` is; SettingsError (one line) otherwise."""
    if text is None:
        return ()
    from respawn.spec.values import SpecError, image

    allowed = 'a JSON object of machine kind to image, like {"gpu": "REPOSITORY/trainer-cuda:TAG", "tpu": ...}'
    try:
        images = json.loads(text)
    except (ValueError, RecursionError):
        images = None
    if not isinstance(images, dict) or not images:
        raise SettingsError(f"{IMAGES} is {text[:80]!r}: it must be {allowed} (unset: jobs name their image)")
    for kind, value in images.items():
        if kind not in MACHINE_KINDS:
            raise SettingsError(f"{IMAGES}: {kind[:40]!r} is not a machine kind; allowed: {', '.join(MACHINE_KINDS)}")
        try:
            image(value, f"{IMAGES}.{kind}")
        except SpecError as e:
            raise SettingsError(f"{e.field}: {e.problem}; allowed: {e.allowed}") from e
    return tuple(sorted(images.items()))


def _matching(variable: str, text: str | None, pattern: re.Pattern[str], allowed: str) -> str | None:
    """`text` when it matches `pattern` whole; SettingsError (one line) otherwise."""
    if text is not None and not pattern.fullmatch(text):
        raise SettingsError(f"{variable} is {text!r}: it must be {allowed} (unset: the default)")
    return text


def _boolean(variable: str, text: str | None, *, default: bool) -> bool:
    """`true` or `false` (any case); SettingsError (one line) for anything else."""
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise SettingsError(f"{variable} is {text!r}: it must be true or false (unset: {str(default).lower()})")
    return text.lower() == "true"
