"""The demo trainer's flags (the job's `args`), validated. The environment is respawn_trainer's (env.py).

Pure: `load_config(argv)` returns a frozen `Config` or raises `ConfigError` whose str() is one line naming
the flag, what was wrong and what is allowed. No jax import here, so a bad flag is reported in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from respawn_trainer.env import ConfigError as ConfigError  # re-exported: a bad flag fails as a bad variable does
from respawn_trainer.env import env_help, parse_float, parse_int


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
    data: str  # "" = the generated corpus; else ArrayRecord shards (trainer/dataset.py)
    data_cache: str  # where shards on gs:// are copied; "" = the machine's RESPAWN_DATA_DIR (data_cache())
    max_device_batch: int = 0  # rows per device per forward/backward pass; 0 = the whole per-device batch at once

    @property
    def size(self) -> ModelSize | None:
        return SIZES.get(self.model)


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of them")
        return text

    return parse


def _data(text: str) -> str:
    if text.startswith("gs://") and not text.removeprefix("gs://").split("/", 1)[0]:
        raise ValueError(f"{text!r} names no bucket")
    if not text:
        raise ValueError("is empty")
    return text


def _every(text: str) -> int | None:
    return None if text == "auto" else parse_int(1, 10**9)(text)


# name -> (parser, default, allowed, help). Defaults of None for batch-size/seq-len come from the model size.
FLAGS: dict[str, tuple[Callable[[str], Any], Any, str, str]] = {
    "steps": (parse_int(1, 10**9), 300, "an integer 1..1e9", "total training steps"),
    "seed": (parse_int(0, 2**31 - 1), 0, "an integer 0..2^31-1", "seed of parameters, data order and dropout"),
    "model": (_choice(*MODELS), "tiny", " | ".join(MODELS), "model size; `none` only sleeps --step-time per step"),
    "batch-size": (parse_int(1, 65536), None, "an integer 1..65536", "global batch size (default: per model size)"),
    "seq-len": (parse_int(2, 8192), None, "an integer 2..8192", "sequence length (default: per model size)"),
    "learning-rate": (parse_float(0.0, 10.0, lo_open=True), 3e-3, "a number in (0, 10]", "peak AdamW learning rate"),
    "checkpoint-every": (_every, None, "`auto` or an integer >= 1", "save every N steps, or auto (Young/Daly)"),
    "keep": (parse_int(1, 1000), 3, "an integer 1..1000", "checkpoints kept (the newest N)"),
    "log-every": (parse_int(1, 10**9), 10, "an integer >= 1", "progress line to stderr every N steps"),
    "step-time": (parse_float(0.0, 3600.0), 0.1, "seconds 0..3600", "seconds per step with --model=none"),
    "distributed": (_choice("auto", "on", "off"), "auto", "auto | on | off", "jax.distributed.initialize()"),
    "data": (_data, "", "gs://BUCKET/PREFIX or a directory", "ArrayRecord shards to train on (default: generated)"),
    "data-cache": (_data, "", "a directory", "where shards on gs:// are copied first"),
    "max-device-batch": (
        parse_int(0, 65536),
        0,
        "an integer 0..65536 (0: no limit)",
        "most rows per device in one pass: more, and the step accumulates gradients over micro-batches",
    ),
}


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


def load_config(argv: Sequence[str]) -> Config:
    flags = {name: spec[1] for name, spec in FLAGS.items()} | parse_flags(argv)
    size = SIZES.get(flags["model"])
    if flags["data"] and size is None:
        raise ConfigError("--data", "given with --model=none, which reads no data", "a model size with --data")
    return Config(
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
        data=flags["data"],
        data_cache=flags["data-cache"],
        max_device_batch=flags["max-device-batch"],
    )


# Where shards on gs:// are copied without --data-cache, on a machine that names no RESPAWN_DATA_DIR
DATA_CACHE = "~/.cache/respawn/data"


def data_cache(cfg: Config, data_dir: str | None) -> str:
    """--data-cache, else the machine's RESPAWN_DATA_DIR (its own disk, kept between its attempts), else DATA_CACHE."""
    return cfg.data_cache or data_dir or DATA_CACHE


def _flag_names() -> str:
    return " ".join(f"--{name}" for name in FLAGS)


def help_text() -> str:
    lines = ["usage: python -m trainer [--FLAG=VALUE ...]", "", "flags:"]
    shown = {"checkpoint-every": "auto", "batch-size": "per model", "seq-len": "per model", "data": "generated"}
    shown["data-cache"] = f"$RESPAWN_DATA_DIR, else {DATA_CACHE}"
    lines += [f"  --{n:<17} {h} ({a}; default {shown.get(n, d)})" for n, (_, d, a, h) in FLAGS.items()]
    lines += ["", "environment:", *env_help()]
    return "\n".join(lines)


if __name__ == "__main__":  # `python -m trainer.config FLAG...`: the flags checked, nothing run (a launcher's check)
    import sys

    try:
        parse_flags(sys.argv[1:])
    except ConfigError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
