"""The environment of one worker of a multi-host slice run on loopback: what a local launcher adds.

A real TPU VM worker has TPU_WORKER_ID and TPU_WORKER_HOSTNAMES; locally every "host" is a process on
127.0.0.1 with its own CPU devices, process 0 serves JAX's coordinator on JAX_COORDINATOR_ADDRESS, and the
processes' collectives go over gloo.
Pure and import-light (no JAX): the local cloud imports it to start the N processes of a slice.
"""

from __future__ import annotations

import random
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


def free_port(tries: int = 50) -> int:
    """A TCP port free on 127.0.0.1 right now, for a server that listens on it soon after.

    Drawn below the kernel's ephemeral range (ip_local_port_range), where the OS never hands a port to an outgoing
    connection: between this check and the server's bind only another such draw could take it, not one of the many
    connections a slice's collectives open meanwhile (a coordinator that found its port taken could not start).
    Where that range leaves too little room below it, the OS picks, as bind(0) does."""
    low = _ephemeral_low()
    if low - EPHEMERAL_MARGIN > FIRST_PORT:
        for _ in range(tries):
            port = random.randrange(low - EPHEMERAL_MARGIN, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((LOOPBACK, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


FIRST_PORT = 1024  # the first port a user may bind
EPHEMERAL_MARGIN = 10_000  # how many ports below the ephemeral range free_port draws from


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768; 0 where it cannot be read)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
