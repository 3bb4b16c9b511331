"""The environment of one worker of a multi-host slice run on loopback: what a local launcher adds.

A real TPU VM worker has TPU_WORKER_ID and TPU_WORKER_HOSTNAMES; locally every "host" is a process on
127.0.0.1 with its own CPU devices, process 0 serves JAX's coordinator on JAX_COORDINATOR_ADDRESS, and the
processes' collectives go over gloo.
Pure and import-light (no JAX): the local cloud imports it to start the N processes of a slice.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def worker_env(worker: int, hosts: int, coordinator_port: int, devices_per_host: int) -> dict[str, str]:
    """The variables to add to the environment of worker `worker` (0..hosts-1) of a `hosts`-host loopback slice:
    where it is in the slice (what a TPU VM's metadata says) and what its host gives it (`host_env`)."""
    if hosts < 1 or not 0 <= worker < hosts:
        raise ValueError(f"worker {worker} is not in 0..{hosts - 1}")
    place = {"TPU_WORKER_ID": str(worker), "TPU_WORKER_HOSTNAMES": ",".join([LOOPBACK] * hosts)}
    return {**place, **host_env(coordinator_port, devices_per_host)}


def host_env(coordinator_port: int, devices_per_host: int) -> dict[str, str]:
    """What every host of a loopback slice gives its trainer: the coordinator's address, its CPU devices, gloo."""
    if devices_per_host < 1:
        raise ValueError(f"devices_per_host {devices_per_host} is not >= 1")
    if not 0 < coordinator_port < 65536:
        raise ValueError(f"coordinator_port {coordinator_port} is not a TCP port")
    return {
        "JAX_COORDINATOR_ADDRESS": f"{LOOPBACK}:{coordinator_port}",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_host}",
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    }


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; another process could take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])
