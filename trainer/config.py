"""Trainer configuration: flags (the job's `args`) and the environment contract, validated.

Pure: `load_config(argv, env, on_gce)` returns a frozen `Config` or raises `ConfigError`
whose str() is one line naming the field, what was wrong and what is allowed.
No jax import here, so a bad flag is reported in milliseconds.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
JOB_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}$")
GCS_URI_RE = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$")


@dataclass(frozen=True)
class ModelSize:
    """A decoder-only transformer preset; batch_size and seq_len are the defaults for its flags."""

    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int
    dropout: float = 0.1


# `tiny` is the default: ~300 steps in well under a minute on 2 CPU cores. The larger ones are TPU work.
SIZES: dict[str, ModelSize] = {
    "nano": ModelSize(d_model=32, n_layers=1, n_heads=2, seq_len=32, batch_size=8),
    "tiny": ModelSize(d_model=128, n_layers=2, n_heads=4, seq_len=64, batch_size=16),
    "small": ModelSize(d_model=256, n_layers=4, n_heads=4, seq_len=128, batch_size=32),
    "medium": ModelSize(d_model=512, n_layers=8, n_heads=8, seq_len=256, batch_size=64),
    "large": ModelSize(d_model=1024, n_layers=16, n_heads=16, seq_len=512, batch_size=128),
}
MODELS = (*SIZES, "none")


class ConfigError(ValueError):
    def __init__(self, field: str, problem: str, allowed: str) -> None:
        super().__init__(f"invalid {field}: {problem}; allowed: {allowed}")
        self.field, self.problem, self.allowed = field, problem, allowed


@dataclass(frozen=True)
class Config:
    # flags
    steps: int
    seed: int
    model: str
    batch_size: int
    seq_len: int
    learning_rate: float
    checkpoint_every: int | None  # None = auto (Young/Daly)
    keep: int
    log_every: int
    step_time: float
    distributed: str  # auto | on | off
    # environment
    job_id: str
    attempt: int
    checkpoint_uri: str
    log_sink: str
    grace_s: float
    metadata_url: str | None
    mtbi_s: float
    compile_cache: str | None
    save_delay_s: float  # test knob: stretches each save before its commit
    heartbeat_timeout_s: int  # multi-host: a worker whose peer stopped heartbeating exits after this long
    progress_s: float  # process 0 sends a `progress` entry at most this often
    worker_id: int | None  # TPU_WORKER_ID: this host's index in the slice
    worker_hostnames: tuple[str, ...]  # TPU_WORKER_HOSTNAMES: every host of the slice, in worker order
    coordinator_address: str | None  # JAX_COORDINATOR_ADDRESS (local slices); else the first host, port 8482

    @property
    def size(self) -> ModelSize | None:
        return SIZES.get(self.model)


# -- value parsers: each returns the value or raises ValueError("what was wrong") -------------------------------


def _int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range")
        return value

    return parse


def _float(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
            raise ValueError(f"{text} is out of range")
        return value

    return parse


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of them")
        return text

    return parse


def _every(text: str) -> int | None:
    return None if text == "auto" else _int(1, 10**9)(text)


# name -> (parser, default, allowed, help). Defaults of None for batch-size/seq-len come from the model size.
FLAGS: dict[str, tuple[Callable[[str], Any], Any, str, str]] = {
    "steps": (_int(1, 10**9), 300, "an integer 1..1e9", "total training steps"),
    "seed": (_int(0, 2**31 - 1), 0, "an integer 0..2^31-1", "seed of parameters, data order and dropout"),
    "model": (_choice(*MODELS), "tiny", " | ".join(MODELS), "model size; `none` only sleeps --step-time per step"),
    "batch-size": (_int(1, 65536), None, "an integer 1..65536", "global batch size (default: per model size)"),
    "seq-len": (_int(2, 8192), None, "an integer 2..8192", "sequence length (default: per model size)"),
    "learning-rate": (_float(0.0, 10.0, lo_open=True), 3e-3, "a number in (0, 10]", "peak AdamW learning rate"),
    "checkpoint-every": (_every, None, "`auto` or an integer >= 1", "save every N steps, or auto (Young/Daly)"),
    "keep": (_int(1, 1000), 3, "an integer 1..1000", "checkpoints kept (the newest N)"),
    "log-every": (_int(1, 10**9), 10, "an integer >= 1", "progress line to stderr every N steps"),
    "step-time": (_float(0.0, 3600.0), 0.1, "seconds 0..3600", "seconds per step with --model=none"),
    "distributed": (_choice("auto", "on", "off"), "auto", "auto | on | off", "jax.distributed.initialize()"),
}

# env var -> (parser, allowed). Only these are read; the rest of the environment belongs to the machine.
ENV: dict[str, tuple[Callable[[str], Any], str]] = {
    "RESPAWN_JOB_ID": (lambda s: _match(JOB_ID_RE, s), "^[a-z][a-z0-9-]{0,38}$"),
    "RESPAWN_ATTEMPT": (_int(0, 10**6), "an integer 0..1e6"),
    "RESPAWN_CHECKPOINT_URI": (lambda s: _checkpoint_uri(s), "gs://BUCKET/PATH or a local path"),
    "RESPAWN_LOG_SINK": (lambda s: _sink(s), "`cloud`, `stdout` or a file path"),
    "RESPAWN_GRACE_S": (_float(0.0, 3600.0, lo_open=True), "seconds in (0, 3600]"),
    "RESPAWN_METADATA_URL": (lambda s: _url(s), "an http:// or https:// URL"),
    "RESPAWN_MTBI_S": (_float(0.0, 1e9, lo_open=True), "seconds > 0"),
    "RESPAWN_COMPILE_CACHE": (lambda s: s, "a directory, or `off`"),
    "RESPAWN_TEST_SAVE_DELAY_S": (_float(0.0, 600.0), "seconds 0..600"),
    "RESPAWN_HEARTBEAT_TIMEOUT_S": (_int(2, 86400), "an integer number of seconds 2..86400"),
    "RESPAWN_PROGRESS_S": (_float(1.0, 86400.0), "seconds 1..86400"),
    "TPU_WORKER_ID": (_int(0, 65535), "an integer 0..65535, below the number of TPU_WORKER_HOSTNAMES"),
    "TPU_WORKER_HOSTNAMES": (lambda s: _hostnames(s), "comma-separated host names or addresses"),
    "JAX_COORDINATOR_ADDRESS": (lambda s: _host_port(s), "HOST:PORT"),
}
DEFAULT_HEARTBEAT_TIMEOUT_S = 100  # JAX's own default
DEFAULT_PROGRESS_S = 60.0
COORDINATOR_PORT = 8482  # on a TPU slice, process 0 (the first host) serves JAX's coordinator here


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


def _host_port(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"{text!r} is not HOST:PORT")
    return text


def parse_flags(argv: Sequence[str]) -> dict[str, Any]:
    """`--name=value` or `--name value`; every flag known, none repeated."""
    values: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--") or arg == "--":
            raise ConfigError("argument", f"{arg!r} is not a flag", "--NAME=VALUE flags: " + _flag_names())
        name, has_value, value = arg[2:].partition("=")
        if name not in FLAGS:
            raise ConfigError("flag", f"--{name} is unknown", _flag_names())
        if name in values:
            raise ConfigError(f"--{name}", "given twice", "each flag once")
        if not has_value:
            if not args:
                raise ConfigError(f"--{name}", "has no value", FLAGS[name][2])
            value = args.pop(0)
        parser, _, allowed, _ = FLAGS[name]
        try:
            values[name] = parser(value)
        except ValueError as e:
            raise ConfigError(f"--{name}", str(e), allowed) from None
    return values


def parse_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, (parser, allowed) in ENV.items():
        if name in env:
            try:
                values[name] = parser(env[name])
            except ValueError as e:
                raise ConfigError(name, str(e), allowed) from None
    return values


def load_config(argv: Sequence[str], env: Mapping[str, str], on_gce: bool = False) -> Config:
    flags = {name: spec[1] for name, spec in FLAGS.items()} | parse_flags(argv)
    e = parse_env(env)
    size = SIZES.get(flags["model"])
    job_id = e.get("RESPAWN_JOB_ID", "local")
    default_uri = os.path.abspath(os.path.join(".respawn", "checkpoints", job_id))
    cache = e.get("RESPAWN_COMPILE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "respawn", "jax"))
    metadata_url = e.get("RESPAWN_METADATA_URL", DEFAULT_METADATA_URL if on_gce else None)
    config = Config(
        steps=flags["steps"],
        seed=flags["seed"],
        model=flags["model"],
        batch_size=flags["batch-size"] or (size.batch_size if size else 1),
        seq_len=flags["seq-len"] or (size.seq_len if size else 2),
        learning_rate=flags["learning-rate"],
        checkpoint_every=flags["checkpoint-every"],
        keep=flags["keep"],
        log_every=flags["log-every"],
        step_time=flags["step-time"],
        distributed=flags["distributed"],
        job_id=job_id,
        attempt=e.get("RESPAWN_ATTEMPT", 1),
        checkpoint_uri=e.get("RESPAWN_CHECKPOINT_URI", default_uri),
        log_sink=e.get("RESPAWN_LOG_SINK", "stdout"),
        grace_s=e.get("RESPAWN_GRACE_S", 25.0),
        metadata_url=metadata_url,
        mtbi_s=e.get("RESPAWN_MTBI_S", 3600.0),
        compile_cache=None if cache in ("", "off") else os.path.abspath(os.path.expanduser(cache)),
        save_delay_s=e.get("RESPAWN_TEST_SAVE_DELAY_S", 0.0),
        heartbeat_timeout_s=e.get("RESPAWN_HEARTBEAT_TIMEOUT_S", DEFAULT_HEARTBEAT_TIMEOUT_S),
        progress_s=e.get("RESPAWN_PROGRESS_S", DEFAULT_PROGRESS_S),
        worker_id=e.get("TPU_WORKER_ID"),
        worker_hostnames=e.get("TPU_WORKER_HOSTNAMES", ()),
        coordinator_address=e.get("JAX_COORDINATOR_ADDRESS"),
    )
    hosts = config.worker_hostnames
    if config.worker_id is not None and hosts and config.worker_id >= len(hosts):
        raise ConfigError(
            "TPU_WORKER_ID", f"{config.worker_id} is not below {len(hosts)} hosts", ENV["TPU_WORKER_ID"][1]
        )
    return config


def _flag_names() -> str:
    return " ".join(f"--{name}" for name in FLAGS)


def help_text() -> str:
    lines = ["usage: python -m trainer [--FLAG=VALUE ...]", "", "flags:"]
    shown = {"checkpoint-every": "auto", "batch-size": "per model", "seq-len": "per model"}
    lines += [f"  --{n:<17} {h} ({a}; default {shown.get(n, d)})" for n, (_, d, a, h) in FLAGS.items()]
    lines += ["", "environment:"] + [f"  {n:<28} {a}" for n, (_, a) in ENV.items()]
    return "\n".join(lines)
