"""What a respawn machine tells its trainer: the RESPAWN_* and TPU_* environment, validated.

Pure (no JAX): `load_env(env, on_gce)` returns a frozen `RunEnv` or raises `ConfigError`, whose str() is one
line naming the variable, what was wrong and what is allowed. docs/trainer-protocol.md lists the contract.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
JOB_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}$")
GCS_URI_RE = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$")
DEFAULT_HEARTBEAT_TIMEOUT_S = 100  # JAX's own default
DEFAULT_PROGRESS_S = 60.0
COORDINATOR_PORT = 8482  # on a TPU slice, process 0 (the first host) serves JAX's coordinator here


class ConfigError(ValueError):
    def __init__(self, field: str, problem: str, allowed: str) -> None:
        super().__init__(f"invalid {field}: {problem}; allowed: {allowed}")
        self.field, self.problem, self.allowed = field, problem, allowed


@dataclass(frozen=True)
class RunEnv:
    job_id: str
    attempt: int
    checkpoint_uri: str
    log_sink: str  # cloud | stdout | a file path
    grace_s: float
    metadata_url: str | None
    mtbi_s: float
    compile_cache: str | None  # a directory or gs:// prefix; None: off
    save_delay_s: float  # test knob: stretches each save before its commit
    heartbeat_timeout_s: int  # multi-host: a worker whose peer stopped heartbeating exits after this long
    progress_s: float  # process 0 sends a `progress` entry at most this often
    worker_id: int | None  # TPU_WORKER_ID: this host's index in the slice
    worker_hostnames: tuple[str, ...]  # TPU_WORKER_HOSTNAMES: every host of the slice, in worker order
    coordinator_address: str | None  # JAX_COORDINATOR_ADDRESS (local slices); else the first host, port 8482
    notice_file: str | None  # RESPAWN_NOTICE_FILE: left when this host stops on the notice (its own or a peer's)
    notice_lead_s: float  # RESPAWN_NOTICE_LEAD_S: the metadata flag comes this long before the soft off (SIGTERM)
    handover: str | None  # RESPAWN_HANDOVER: this attempt's objects for a head start's successor (handover.py)
    takeover: str | None  # RESPAWN_TAKEOVER: the noticed attempt's objects this one takes over from
    start_after: float  # RESPAWN_START_AFTER: epoch s, when the noticed machine is off in any case
    time_scale: float  # test knob: the local cloud replays real timings this much faster (the handover's bound too)
    window_s: float | None  # test knob: the local cloud's notice window (its --grace), where shorter than the grace
    accelerator: str | None  # RESPAWN_ACCELERATOR: the machine's (tpu | gpu); None: whatever JAX finds
    stand_in: str | None  # RESPAWN_DEVICES_STAND_IN: the local cloud's CPU processes stand in for the accelerator
    data_dir: str | None  # RESPAWN_DATA_DIR: on the machine's own disk, kept for its later attempts (data copies)
    world_version: int | None = None  # RESPAWN_WORLD_VERSION: the world of several slices this process was started for
    slice: int = 0  # RESPAWN_SLICE: the index of the slice this host belongs to (in a world)
    local_copy_dir: str | None = None  # RESPAWN_LOCAL_COPY_DIR: host disk for a world change's save (world.py)
    reform_wait_s: float = 300.0  # RESPAWN_REFORM_WAIT_S: how long a survivor waits in its process for the next world
    world_leave_s: float = 300.0  # RESPAWN_WORLD_LEAVE_S: how long a world may take to stop once a newer one came

    @property
    def hosts(self) -> int:
        return max(len(self.worker_hostnames), 1)


# -- value parsers: each returns the value or raises ValueError("what was wrong") -------------------------------


def _one_of(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of them")
        return text

    return parse


def parse_int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range")
        return value

    return parse


def parse_float(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
            raise ValueError(f"{text} is out of range")
        return value

    return parse


def _match(pattern: re.Pattern[str], text: str) -> str:
    if not pattern.match(text):
        raise ValueError(f"{text!r} does not match")
    return text


def _checkpoint_uri(text: str) -> str:
    if text.startswith("gs://"):
        return _match(GCS_URI_RE, text.rstrip("/"))
    if "://" in text or not text.strip():
        raise ValueError(f"{text!r} is neither gs:// nor a local path")
    return os.path.abspath(os.path.expanduser(text))


def _cache(text: str) -> str:
    if text in ("", "off") or text.startswith("gs://"):
        return text.rstrip("/")
    return _checkpoint_uri(text)


def _sink(text: str) -> str:
    if not text.strip():
        raise ValueError("it is empty")
    return text if text in ("cloud", "stdout") else os.path.abspath(os.path.expanduser(text))


def _url(text: str) -> str:
    if not re.match(r"^https?://[^\s/]+", text):
        raise ValueError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def _hostnames(text: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in text.split(","))
    if not all(hosts) or any(c.isspace() or c in "/@" for h in hosts for c in h):
        raise ValueError(f"{text!r} is not a list of host names")
    return hosts


def _path(text: str) -> str:
    if not os.path.isabs(text) or text.endswith("/"):
        raise ValueError(f"{text!r} is not an absolute file path")
    return text


def _prefix(text: str) -> str:
    if text.startswith("gs://"):
        return _match(GCS_URI_RE, text)
    return _path(text)


def _host_port(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"{text!r} is not HOST:PORT")
    return text


# env var -> (parser, allowed). Only these are read; the rest of the environment belongs to the machine.
ENV: dict[str, tuple[Callable[[str], Any], str]] = {
    "RESPAWN_JOB_ID": (lambda s: _match(JOB_ID_RE, s), "^[a-z][a-z0-9-]{0,38}$"),
    "RESPAWN_ATTEMPT": (parse_int(0, 10**6), "an integer 0..1e6"),
    "RESPAWN_CHECKPOINT_URI": (_checkpoint_uri, "gs://BUCKET/PATH or a local path"),
    "RESPAWN_LOG_SINK": (_sink, "`cloud`, `stdout` or a file path"),
    "RESPAWN_GRACE_S": (parse_float(0.0, 3600.0, lo_open=True), "seconds in (0, 3600]"),
    "RESPAWN_METADATA_URL": (_url, "an http:// or https:// URL"),
    "RESPAWN_MTBI_S": (parse_float(0.0, 1e9, lo_open=True), "seconds > 0"),
    "RESPAWN_COMPILE_CACHE": (_cache, "a directory, gs://BUCKET/PATH, or `off`"),
    "RESPAWN_TEST_SAVE_DELAY_S": (parse_float(0.0, 600.0), "seconds 0..600"),
    "RESPAWN_HEARTBEAT_TIMEOUT_S": (parse_int(2, 86400), "an integer number of seconds 2..86400"),
    "RESPAWN_PROGRESS_S": (parse_float(1.0, 86400.0), "seconds 1..86400"),
    "TPU_WORKER_ID": (parse_int(0, 65535), "an integer 0..65535, below the number of TPU_WORKER_HOSTNAMES"),
    "TPU_WORKER_HOSTNAMES": (_hostnames, "comma-separated host names or addresses"),
    "JAX_COORDINATOR_ADDRESS": (_host_port, "HOST:PORT"),
    "RESPAWN_NOTICE_FILE": (_path, "an absolute file path"),
    "RESPAWN_NOTICE_LEAD_S": (parse_float(0.0, 3600.0), "seconds 0..3600"),
    "RESPAWN_HANDOVER": (_prefix, "gs://BUCKET/PREFIX or an absolute path"),
    "RESPAWN_TAKEOVER": (_prefix, "gs://BUCKET/PREFIX or an absolute path"),
    "RESPAWN_START_AFTER": (parse_float(0.0, 1e11), "epoch seconds"),
    "RESPAWN_TEST_TIME_SCALE": (parse_float(0.0, 1.0, lo_open=True), "a fraction in (0, 1]"),
    "RESPAWN_TEST_WINDOW_S": (parse_float(0.0, 3600.0, lo_open=True), "seconds in (0, 3600]"),
    "RESPAWN_ACCELERATOR": (_one_of("tpu", "gpu"), "tpu or gpu"),
    "RESPAWN_DEVICES_STAND_IN": (_one_of("cpu"), "cpu"),
    "RESPAWN_DATA_DIR": (_path, "an absolute directory path"),
    "RESPAWN_WORLD_VERSION": (parse_int(1, 10**9), "an integer 1..1e9"),
    "RESPAWN_SLICE": (parse_int(0, 65535), "an integer 0..65535"),
    "RESPAWN_LOCAL_COPY_DIR": (_path, "an absolute directory path"),
    "RESPAWN_REFORM_WAIT_S": (parse_float(0.0, 3600.0), "seconds 0..3600 (0: leave with exit 75 at once)"),
    "RESPAWN_WORLD_LEAVE_S": (parse_float(1.0, 86400.0), "seconds 1..86400"),
}


def parse_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, (parser, allowed) in ENV.items():
        if name in env:
            try:
                values[name] = parser(env[name])
            except ValueError as e:
                raise ConfigError(name, str(e), allowed) from None
    return values


def default_compile_cache(checkpoint_uri: str) -> str:
    """Next to the checkpoints when they are on GCS (a new VM's disk is empty); else the local user cache."""
    if checkpoint_uri.startswith("gs://"):
        return f"{checkpoint_uri}-compile-cache"
    return os.path.join(os.path.expanduser("~"), ".cache", "respawn", "jax")


def load_env(env: Mapping[str, str], on_gce: bool = False) -> RunEnv:
    e = parse_env(env)
    job_id = e.get("RESPAWN_JOB_ID", "local")
    checkpoint_uri = e.get("RESPAWN_CHECKPOINT_URI", os.path.abspath(os.path.join(".respawn", "checkpoints", job_id)))
    cache = e.get("RESPAWN_COMPILE_CACHE", default_compile_cache(checkpoint_uri))
    run = RunEnv(
        job_id=job_id,
        attempt=e.get("RESPAWN_ATTEMPT", 1),
        checkpoint_uri=checkpoint_uri,
        log_sink=e.get("RESPAWN_LOG_SINK", "stdout"),
        grace_s=e.get("RESPAWN_GRACE_S", 25.0),
        metadata_url=e.get("RESPAWN_METADATA_URL", DEFAULT_METADATA_URL if on_gce else None),
        mtbi_s=e.get("RESPAWN_MTBI_S", 3600.0),
        compile_cache=None if cache in ("", "off") else cache,
        save_delay_s=e.get("RESPAWN_TEST_SAVE_DELAY_S", 0.0),
        heartbeat_timeout_s=e.get("RESPAWN_HEARTBEAT_TIMEOUT_S", DEFAULT_HEARTBEAT_TIMEOUT_S),
        progress_s=e.get("RESPAWN_PROGRESS_S", DEFAULT_PROGRESS_S),
        worker_id=e.get("TPU_WORKER_ID"),
        worker_hostnames=e.get("TPU_WORKER_HOSTNAMES", ()),
        coordinator_address=e.get("JAX_COORDINATOR_ADDRESS"),
        notice_file=e.get("RESPAWN_NOTICE_FILE"),
        notice_lead_s=e.get("RESPAWN_NOTICE_LEAD_S", 0.0),
        handover=e.get("RESPAWN_HANDOVER"),
        takeover=e.get("RESPAWN_TAKEOVER"),
        start_after=e.get("RESPAWN_START_AFTER", 0.0),
        time_scale=e.get("RESPAWN_TEST_TIME_SCALE", 1.0),
        window_s=e.get("RESPAWN_TEST_WINDOW_S"),
        accelerator=e.get("RESPAWN_ACCELERATOR"),
        stand_in=e.get("RESPAWN_DEVICES_STAND_IN"),
        data_dir=e.get("RESPAWN_DATA_DIR"),
        world_version=e.get("RESPAWN_WORLD_VERSION"),
        slice=e.get("RESPAWN_SLICE", 0),
        local_copy_dir=e.get("RESPAWN_LOCAL_COPY_DIR"),
        reform_wait_s=e.get("RESPAWN_REFORM_WAIT_S", 300.0),
        world_leave_s=e.get("RESPAWN_WORLD_LEAVE_S", 300.0),
    )
    if run.worker_id is not None and run.worker_hostnames and run.worker_id >= len(run.worker_hostnames):
        raise ConfigError("TPU_WORKER_ID", f"{run.worker_id} is not below {run.hosts} hosts", ENV["TPU_WORKER_ID"][1])
    if run.world_version is not None and not run.metadata_url:
        where = "with RESPAWN_METADATA_URL (or on GCE)"
        raise ConfigError("RESPAWN_WORLD_VERSION", "set without a metadata server to read the world from", where)
    return run


def env_help() -> list[str]:
    return [f"  {n:<28} {a}" for n, (_, a) in ENV.items()]
