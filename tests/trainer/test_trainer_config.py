"""Flags and environment: defaults, both flag forms, and one clear line for every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_harness import REPO, trainer_env

from respawn_trainer.env import DEFAULT_METADATA_URL, load_env
from trainer.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config([])
    assert (cfg.steps, cfg.model, cfg.batch_size, cfg.seq_len) == (300, "tiny", 16, 64)
    assert cfg.checkpoint_every is None and cfg.keep == 3 and cfg.log_every == 10
    run = load_env({})
    assert (run.job_id, run.attempt, run.log_sink, run.grace_s, run.mtbi_s) == ("local", 1, "stdout", 25.0, 3600.0)
    assert run.checkpoint_uri == os.path.abspath(".respawn/checkpoints/local")
    assert run.metadata_url is None
    assert run.compile_cache == os.path.expanduser("~/.cache/respawn/jax")
    assert load_env({}, on_gce=True).metadata_url == DEFAULT_METADATA_URL
    # Checkpoints on GCS: a new VM's disk is empty, so the compiled programs are kept next to them.
    on_gcs = load_env({"RESPAWN_CHECKPOINT_URI": "gs://bkt/jobs/llm-1"})
    assert on_gcs.compile_cache == "gs://bkt/jobs/llm-1-compile-cache"


def test_flags_and_environment() -> None:
    env = {
        "RESPAWN_JOB_ID": "llm-1",
        "RESPAWN_ATTEMPT": "4",
        "RESPAWN_CHECKPOINT_URI": "gs://my-bucket/runs/llm-1/",
        "RESPAWN_LOG_SINK": "cloud",
        "RESPAWN_GRACE_S": "20",
        "RESPAWN_METADATA_URL": "http://127.0.0.1:9/computeMetadata/v1/",
        "RESPAWN_MTBI_S": "60",
        "RESPAWN_COMPILE_CACHE": "off",
        "UNRELATED": "ignored",
    }
    argv = ["--steps", "50", "--model=small", "--checkpoint-every=25", "--batch-size=8", "--learning-rate=1e-3"]
    cfg, run = load_config(argv), load_env(env)
    assert (cfg.steps, cfg.model, cfg.checkpoint_every, cfg.batch_size, cfg.seq_len) == (50, "small", 25, 8, 128)
    assert (run.job_id, run.attempt, run.checkpoint_uri) == ("llm-1", 4, "gs://my-bucket/runs/llm-1")
    assert (run.log_sink, run.grace_s, run.mtbi_s, run.compile_cache) == ("cloud", 20.0, 60.0, None)
    assert run.metadata_url == "http://127.0.0.1:9/computeMetadata/v1"
    assert load_config(["--checkpoint-every=auto"]).checkpoint_every is None


def test_multi_host_environment() -> None:
    from respawn_trainer.runtime import initialize_args, wants_distributed

    single = load_env({})
    assert (single.heartbeat_timeout_s, single.progress_s, single.worker_id, single.worker_hostnames) == (
        100,
        60.0,
        None,
        (),
    )
    assert not wants_distributed(single)
    assert initialize_args(single) == {"heartbeat_timeout_seconds": 100}  # JAX auto-detects (--distributed=on)
    env = {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "t1v-w-0, t1v-w-1,t1v-w-2,t1v-w-3"}
    tpu = load_env({**env, "RESPAWN_HEARTBEAT_TIMEOUT_S": "30", "RESPAWN_PROGRESS_S": "5"})
    assert wants_distributed(tpu) and not wants_distributed(tpu, "off") and wants_distributed(single, "on")
    assert initialize_args(tpu) == {
        "coordinator_address": "t1v-w-0:8482",
        "num_processes": 4,
        "process_id": 2,
        "heartbeat_timeout_seconds": 30,
    }
    assert tpu.progress_s == 5.0
    local = load_env({**env, "JAX_COORDINATOR_ADDRESS": "127.0.0.1:4567"})
    assert initialize_args(local)["coordinator_address"] == "127.0.0.1:4567"
    one_host = {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "t1v-w-0"}
    assert not wants_distributed(load_env(one_host))


def test_a_free_port_is_drawn_below_the_ephemeral_range_where_no_connection_can_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice's coordinator found its port taken by some connection's local port and could not start its RPC server:
    ports for servers come from below the kernel's ephemeral range, and are free when drawn."""
    import socket

    from respawn_trainer import slice_env

    low = slice_env._ephemeral_low()
    ports = {slice_env.free_port() for _ in range(20)}
    if low - slice_env.EPHEMERAL_MARGIN > slice_env.FIRST_PORT:  # Linux's default range: 32768-60999
        assert all(low - slice_env.EPHEMERAL_MARGIN <= p < low for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert slice_env._ephemeral_low(str(tmp_path / "absent")) == 0
    monkeypatch.setattr(slice_env, "_ephemeral_low", lambda: 2000)  # no room below the range: the OS picks
    assert 0 < slice_env.free_port() < 65536


def test_slice_env_is_the_environment_of_a_loopback_worker() -> None:
    from respawn_trainer.slice_env import free_port, worker_env

    assert worker_env(1, 4, 8476, 2) == {
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1",
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:8476",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    }
    cfg = load_env(worker_env(3, 4, 8476, 2))
    assert (cfg.worker_id, len(cfg.worker_hostnames), cfg.coordinator_address) == (3, 4, "127.0.0.1:8476")
    for bad in [(4, 4, 8476, 2), (-1, 4, 8476, 2), (0, 4, 0, 2), (0, 4, 8476, 0)]:
        with pytest.raises(ValueError):
            worker_env(*bad)
    assert 0 < free_port() < 65536
    assert (
        "jax"
        not in subprocess.run(
            [sys.executable, "-c", "import sys, respawn_trainer.slice_env; print(sorted(sys.modules))"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def test_jax_takes_its_cpu_collectives_from_the_environment_a_launcher_sets() -> None:
    """A loopback slice's gloo comes from JAX_CPU_COLLECTIVES_IMPLEMENTATION (slice_env), not from the library:
    JAX reads it (mpi here, since gloo is also JAX's default)."""
    read = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.config.jax_cpu_collectives_implementation)"],
        env={**os.environ, "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi", "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.split() == ["mpi"]


@pytest.mark.parametrize(
    ("argv", "env", "field"),
    [
        (["--bogus=1"], {}, "flag"),
        (["--steps=5", "--steps=6"], {}, "--steps"),
        (["--steps"], {}, "--steps"),
        (["--steps=ten"], {}, "--steps"),
        (["--steps=0"], {}, "--steps"),
        (["--model=huge"], {}, "--model"),
        (["train"], {}, "argument"),
        (["--checkpoint-every=0"], {}, "--checkpoint-every"),
        (["--checkpoint-every=sometimes"], {}, "--checkpoint-every"),
        (["--learning-rate=0"], {}, "--learning-rate"),
        (["--learning-rate=nan"], {}, "--learning-rate"),
        (["--keep=0"], {}, "--keep"),
        (["--data=gs://"], {}, "--data"),
        (["--data=gs:///shards"], {}, "--data"),
        (["--data="], {}, "--data"),
        (["--data=gs://b/corpus", "--model=none"], {}, "--data"),
        ([], {"RESPAWN_JOB_ID": "Bad_Id"}, "RESPAWN_JOB_ID"),
        ([], {"RESPAWN_ATTEMPT": "x"}, "RESPAWN_ATTEMPT"),
        ([], {"RESPAWN_CHECKPOINT_URI": "s3://bucket/x"}, "RESPAWN_CHECKPOINT_URI"),
        ([], {"RESPAWN_CHECKPOINT_URI": "gs://"}, "RESPAWN_CHECKPOINT_URI"),
        ([], {"RESPAWN_LOG_SINK": " "}, "RESPAWN_LOG_SINK"),
        ([], {"RESPAWN_GRACE_S": "0"}, "RESPAWN_GRACE_S"),
        ([], {"RESPAWN_METADATA_URL": "ftp://x"}, "RESPAWN_METADATA_URL"),
        ([], {"RESPAWN_MTBI_S": "-1"}, "RESPAWN_MTBI_S"),
        ([], {"RESPAWN_HEARTBEAT_TIMEOUT_S": "1"}, "RESPAWN_HEARTBEAT_TIMEOUT_S"),
        ([], {"RESPAWN_HEARTBEAT_TIMEOUT_S": "2.5"}, "RESPAWN_HEARTBEAT_TIMEOUT_S"),
        ([], {"RESPAWN_PROGRESS_S": "0.5"}, "RESPAWN_PROGRESS_S"),
        ([], {"RESPAWN_PROGRESS_S": "soon"}, "RESPAWN_PROGRESS_S"),
        ([], {"TPU_WORKER_ID": "-1"}, "TPU_WORKER_ID"),
        ([], {"TPU_WORKER_ID": "4", "TPU_WORKER_HOSTNAMES": "a,b,c,d"}, "TPU_WORKER_ID"),
        ([], {"TPU_WORKER_HOSTNAMES": "a,,c"}, "TPU_WORKER_HOSTNAMES"),
        ([], {"JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, "JAX_COORDINATOR_ADDRESS"),
        ([], {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:99999"}, "JAX_COORDINATOR_ADDRESS"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(argv: list[str], env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(argv)
        load_env(env)
    message = str(raised.value)
    assert raised.value.field == field and field in message
    assert "\n" not in message and "allowed:" in message


def test_unknown_flag_exits_2_with_one_line_and_a_failed_entry(tmp_path: Path) -> None:
    sink = tmp_path / "entries.jsonl"
    env = trainer_env(str(tmp_path / "ckpt"), sink, tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--step=5"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--step is unknown" in lines[0] and "--steps" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (entry,) = [json.loads(line) for line in sink.read_text().splitlines()]
    assert entry["event"] == "failed" and entry["job_id"] == "job-test" and "--step" in entry["error"]
    # the same flags on every machine: permanent, the cause and the fix first (respawn_trainer.failures)
    said = "the trainer rejected its flags (fix: the job's args)"
    assert entry["permanent"] is True and entry["error"].startswith(said)


def test_bad_environment_exits_2_with_one_line(tmp_path: Path) -> None:
    env = trainer_env("s3://nope/x", tmp_path / "entries.jsonl", tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "RESPAWN_CHECKPOINT_URI" in proc.stderr


def test_help_lists_flags_and_environment() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "--checkpoint-every" in proc.stdout and "RESPAWN_CHECKPOINT_URI" in proc.stdout
