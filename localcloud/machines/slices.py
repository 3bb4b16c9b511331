"""A machine of the local cloud as the trainer processes it runs: a slice of hosts, a single host a slice of one.

A TPU node whose accelerator type has several hosts (v5litepod-16: 4 hosts x 4 chips), or a GPU machine of several
VMs (machine.vms: 2 x a3-highgpu-8g is 2 hosts x 8 GPUs, each GPU a CPU device), runs as that many processes on
loopback, each with the environment a slice's worker has, as JAX's multi-controller runtime expects; a single GPU VM
or a one-host TPU is one process with the trainer's environment alone. Every place that starts, names, tags or describes
a machine's processes asks this value, so the difference between one host and many is decided here only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcloud.services.emulators import start_group
from respawn_trainer.slice_env import free_port

# JAX's heartbeat timeout for local slices: longer than any hang_timeout a local job has (the default is 30 m),
# so that a stopped worker looks hung (alive, no progress) and only respawn's hang detection finds it.
HEARTBEAT_TIMEOUT_S = 3600
# ... so a world stuck in a collective with a killed worker (alive peers wait for it until the heartbeat) is left this
# long after a newer world comes (respawn_trainer.world: RESPAWN_WORLD_LEAVE_S), as the startup script then restarts it
LEAVE_S = 20
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\S*")

# What every local trainer gets, beside what a machine's startup script sets. fsspec gives gcsfs the default `token`
# anon, so it reads fake-gcs-server without looking for credentials (and warning at every use that it has none).
# gcsfs's experimental zonal/HNS support asks the Storage Control gRPC API for each bucket's type, which the
# emulator does not serve: without credentials the call fails at once, with anon it retries without end.
LOCAL_TRAINER_ENV = {"FSSPEC_GCS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
# trainer/Dockerfile's ENV, which a trainer's own environment may override: glibc backs its large allocations with
# transparent huge pages. XLA's CPU runtime maps a program's temporaries afresh at every run (51 MiB a step for the
# tiny model), and faulting them in 4 KiB pages took a quarter of a CPU trainer's time.
IMAGE_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}

# A worker's (stdout, stderr): subprocess.PIPE, a file, or None to inherit.
Output = tuple[Any, Any]


def local_trainer_env(
    workdir: Path, environ: Mapping[str, str] = os.environ, compile_cache: Path | None = None
) -> dict[str, str]:
    """The environment every local trainer process starts from: this one without the control plane's settings,
    the compile cache (`compile_cache`, else under the workdir: shared by the runs and their reference) and
    LOCAL_TRAINER_ENV; the image's IMAGE_ENV where this one does not say."""
    env = {k: v for k, v in environ.items() if not k.startswith(("RESPAWN_", "PUBSUB_"))}
    cache = (compile_cache or workdir / "compile-cache").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o777)  # it stands for the gs:// cache that every machine's trainer writes, whatever its user
    env["RESPAWN_COMPILE_CACHE"] = str(cache)
    return {**IMAGE_ENV, **env, **LOCAL_TRAINER_ENV}


def add_flags(run: argparse.ArgumentParser) -> None:
    """What the machines' trainer processes start with: their compilation cache and the stand-in for their devices
    (read by `read_flags`)."""
    run.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=os.environ.get("RESPAWN_LOCAL_COMPILE_CACHE"),
        help="the machines' compilation cache, which several workdirs may share, as a job's machines share its gs:// "
        "cache (default $RESPAWN_LOCAL_COMPILE_CACHE, else WORKDIR/compile-cache)",
    )
    run.add_argument(
        "--no-stand-in",
        action="store_true",
        help="the machines' CPU processes do not stand in for the job's TPU or GPU: respawn's trainer fails at once, "
        "as on a machine whose image cannot see its accelerator",
    )


def read_flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The local cloud's options (cloud.Options fields) the machines' flags set."""
    return {"compile_cache": Path(ns.compile_cache) if ns.compile_cache else None, "stand_in": not ns.no_stand_in}


def compile_bytecode(packages: tuple[str, ...] = ("trainer", "respawn")) -> None:
    """Bytecode for what a local machine runs (the trainer, respawn_trainer inside it, and respawn's shims), written
    once as the trainer image's build writes it (trainer/Dockerfile: compileall): where PYTHONDONTWRITEBYTECODE is
    set, every trainer process would otherwise compile its sources anew. Only stale files are compiled again."""
    import compileall
    import importlib.util

    for package in packages:
        spec = importlib.util.find_spec(package)
        for where in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(where, quiet=1)


@dataclass(frozen=True)
class LocalSlice:
    """`hosts` trainer processes with `chips_per_host` CPU devices each; LocalSlice() is a single host."""

    hosts: int = 1
    chips_per_host: int = 1

    @classmethod
    def of(cls, kind: str, accelerator_type: object, vms: object = 1, gpus: object = 1) -> LocalSlice:
        """The slice a machine of `kind` ("tpu" or "gpu") runs as: a TPU node's shape from its accelerator type
        (respawn.topology); a GPU machine of several `vms`, that many hosts of its `gpus` each; a single GPU VM, or a
        TPU type the table does not know, is a single host."""
        from respawn.topology import UnknownTpuType, tpu_topology

        if kind != "tpu":
            hosts = vms if isinstance(vms, int) and vms > 1 else 1
            return cls(hosts, gpus if hosts > 1 and isinstance(gpus, int) and gpus > 0 else 1)
        try:
            topology = tpu_topology(str(accelerator_type or ""))
        except UnknownTpuType:
            return cls()
        return cls(topology.hosts, topology.chips_per_host)

    @property
    def workers(self) -> range:
        return range(self.hosts)

    def has_worker(self, worker: int) -> bool:
        return 0 <= worker < self.hosts

    def log_name(self, machine: str, worker: int) -> str:
        """The worker's log file: `NAME.log` for a single host, `NAME-w-I.log` for each worker of a slice."""
        return f"{machine}.log" if self.hosts == 1 else f"{machine}-w-{worker}.log"

    def tag(self, worker: int) -> dict[str, int]:
        """The `worker` field of per-worker timeline lines and exit-code entries; none for a single host."""
        return {} if self.hosts == 1 else {"worker": worker}

    def worker_env(self, env: Mapping[str, str], worker: int, coordinator_port: int) -> dict[str, str]:
        """`env` plus what worker `worker` of a loopback slice has (respawn_trainer/slice_env.py), its XLA flags kept
        (the device count replaced); a single host runs with `env` as it is, the way a one-host TPU VM does."""
        if self.hosts == 1:
            return dict(env)
        from respawn_trainer.slice_env import worker_env

        return self._with(env, worker_env(worker, self.hosts, coordinator_port, self.chips_per_host))

    def host_env(self, env: Mapping[str, str], worker: int, coordinator_port: int) -> dict[str, str]:
        """`worker_env` without the worker's place in the slice, which a machine's startup script reads from the
        metadata server (`endpoints`): what the host of a loopback slice gives the trainer's image."""
        if self.hosts == 1:
            return dict(env)
        from respawn_trainer.slice_env import host_env

        return self._with(env, host_env(coordinator_port, self.chips_per_host))

    def endpoints(self) -> str:
        """The slice's `worker-network-endpoints` metadata: every host's address (loopback), in worker order."""
        from respawn_trainer.slice_env import LOOPBACK

        return ",".join([LOOPBACK] * self.hosts)

    @staticmethod
    def _with(env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
        flags = _DEVICE_COUNT.sub("", env.get("XLA_FLAGS", "")).split()
        joined = " ".join([*flags, *extra.get("XLA_FLAGS", "").split()])
        timeouts = {
            "RESPAWN_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "RESPAWN_WORLD_LEAVE_S": str(LEAVE_S),
        }
        return {**env, **extra, "XLA_FLAGS": joined, **timeouts}

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        output: Callable[[int], Output],
        stdin: Any = None,
    ) -> list[subprocess.Popen[bytes]]:
        """Start every worker, worker 0 first, each in its own process group with its worker environment and the
        (stdout, stderr) `output(worker)` gives. A slice gets a fresh coordinator port each time it starts, so a
        slice being torn down and its replacement never share one. Run with umask 0: what they write into the
        shared compile cache (a directory standing for the gs:// cache that every machine's account writes) stays
        writable to the machines' trainers, whatever their uid."""
        port = free_port() if self.hosts > 1 else 0
        processes = []
        for worker in self.workers:
            stdout, stderr = output(worker)
            processes.append(
                start_group(
                    list(argv),
                    env=self.worker_env(env, worker, port),
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    umask=0,
                )
            )
        return processes

    def cache_key(self) -> dict[str, int]:
        """What the slice adds to the key of a cached reference run: nothing for a single host, so a one-host run
        keeps the key it always had."""
        return {} if self.hosts == 1 else {"hosts": self.hosts, "chips_per_host": self.chips_per_host}

    def processes_phrase(self) -> str:
        """` on 4 processes (4 hosts x 4 devices)` for a slice; empty for a single host, which needs no word."""
        if self.hosts == 1:
            return ""
        return f" on {self.hosts} processes ({self.hosts} hosts x {self.chips_per_host} devices)"

    def workers_allowed(self) -> str:
        """The workers a chaos option may name, as its error message says it: `worker 0 only` or `workers 0..3`."""
        return "worker 0 only" if self.hosts == 1 else f"workers 0..{self.hosts - 1}"

    def hosts_phrase(self) -> str:
        return "1 host" if self.hosts == 1 else f"{self.hosts} hosts"


SINGLE_HOST = LocalSlice()  # a GPU VM, a one-host TPU: one trainer process


def report_line(hosts: int) -> str | None:
    """The report's line about a slice's processes (the report keeps only its host count); None for a single host."""
    if hosts == 1:
        return None
    return f"  slice    {hosts} hosts: {hosts} trainer processes per attempt"
