"""The uninterrupted reference run a local run is compared with (`exact` in the report).

The same trainer (or the same `--entrypoint` command) with the same args and
env, run once to completion without the control plane, checkpointing to a
temporary local directory. It starts as the job's machine does (slices.py): for a
multi-host TPU slice as many processes as the slice has hosts, each with the worker
environment the local cloud gives a slice's workers, so the shape of the
computation (processes x devices) is the job's. Its final `params_sha256` is
cached under `.respawn/reference/<key>.json` (or `--reference-cache DIR`, which
several workdirs may share), keyed by the args, the env, the slice shape and the
trainer's source (with an entrypoint: the command and the files it names), so it
is computed once per change.

A job of several slices (machine.slices K > 1) trains as a world (trainer/README.md, Worlds of several slices), whose
mesh has a `slice` axis: its reference is the uninterrupted world of all K slices, K x hosts processes, each with
RESPAWN_WORLD_VERSION=1 and its RESPAWN_SLICE, reading the `respawn-world` key from a metadata server of its own
(world 1, every slice a member, a coordinator named in the key: no rendezvous object). A job's world whose
membership never fell below K trains the same arithmetic, so its parameters are bitwise the reference's; the slice
count is part of the cache key.

A program that never sends `params_sha256` (one that does not use the
respawn_trainer library) completes by its exit code alone: its reference has no
hash, and `exact` is unknown rather than false.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from localcloud.machines.machine_host import MetadataServer
from localcloud.machines.slices import SINGLE_HOST, LocalSlice
from localcloud.machines.vms import TRAINER, lifecycle_entry
from localcloud.services.emulators import stop_group
from respawn.adapters.startup import SLICE_ENV, WORLD_ENV, WORLD_METADATA
from respawn.machine import exit_code_entry
from respawn_trainer.slice_env import LOOPBACK, free_port

JOB_ID = "reference"


def trainer_digest() -> str:
    """The trainer's source, so that a change to it computes the reference afresh."""
    import importlib.util

    spec = importlib.util.find_spec("trainer")  # the package `python -m trainer` runs, found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ReferenceFailed("the trainer package (python -m trainer) is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))  # also a namespace package (editable installs)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class ReferenceFailed(RuntimeError):
    """The uninterrupted run did not complete: there is nothing to compare with."""


def named_files(entrypoint: Sequence[str]) -> dict[str, str]:
    """word -> sha256 of the file, for every word of the command that names a file (the script it runs)."""
    found = {}
    for word in entrypoint:
        path = Path(word)
        with contextlib.suppress(OSError):
            if path.is_file():
                found[word] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def reference_key(
    args: Sequence[str],
    env: Mapping[str, str],
    machine_slice: LocalSlice = SINGLE_HOST,
    entrypoint: Sequence[str] | None = None,
    slices: int = 1,
) -> str:
    """The name of a cached reference: what the run computes from (args, env, slice shape, slice count, program).
    One slice adds nothing, so a job of one slice keeps the key it always had."""
    key: dict[str, Any] = {"args": list(args), "env": dict(sorted(env.items())), "trainer": trainer_digest()}
    key.update(machine_slice.cache_key())
    if slices > 1:
        key["slices"] = slices
    if entrypoint:
        key.update(entrypoint=list(entrypoint), files=named_files(entrypoint))
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


def reference_run(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    cache_dir: Path,
    base_env: Mapping[str, str],
    log_path: Path,
    timeout_s: float = 1800,
    machine_slice: LocalSlice = SINGLE_HOST,
    entrypoint: Sequence[str] | None = None,
    slices: int = 1,
) -> dict[str, Any]:
    """{"params_sha256", "final_step", "final_loss", "wall_s", "cached"} of the uninterrupted run, on the processes
    of `machine_slice` (of `slices` of them, a world, when several), of `python -m trainer`, or of `entrypoint`,
    with `args`. params_sha256 is None when the program completed without sending it. Raises ReferenceFailed when
    it did not complete. `base_env` is what every local trainer starts from (slices.local_trainer_env), the job's
    `env` over it."""
    path = cache_dir / f"{reference_key(args, env, machine_slice, entrypoint, slices)}.json"
    if path.exists():
        return {**json.loads(path.read_text()), "cached": True}
    cache_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)  # a new workdir, whose reference cache may lie elsewhere
    with tempfile.TemporaryDirectory(prefix="respawn-reference-") as ckpt, log_path.open("ab") as log:
        run_env = {
            **base_env,
            **env,
            "RESPAWN_JOB_ID": JOB_ID,
            "RESPAWN_ATTEMPT": "1",
            "RESPAWN_CHECKPOINT_URI": ckpt,
            "RESPAWN_LOG_SINK": "stdout",
        }
        argv = [*(entrypoint or TRAINER), *args]
        t = time.monotonic()
        with world_metadata(slices) as world_env:
            procs = start_world(machine_slice, slices, argv, {**run_env, **world_env}, log)
            out = wait_for(procs, timeout_s)
        wall = time.monotonic() - t
        completed = completed_entry(out, log)
    by_exit_code = exit_code_entry(procs[0].returncode, worker=0, noticed=False)  # what the startup script would say
    if completed is None and by_exit_code is not None and by_exit_code[0] == "completed":
        completed = {}
    if completed is None:
        codes = ", ".join(str(p.returncode) for p in procs)
        raise ReferenceFailed(f"the reference run did not complete (exit code {codes}); see {log_path}")
    result = {
        "params_sha256": completed.get("params_sha256"),
        "final_step": completed.get("step"),
        "final_loss": completed.get("final_loss"),
        "wall_s": round(wall, 2),
        "args": list(args),
        "hosts": machine_slice.hosts,
        "chips_per_host": machine_slice.chips_per_host,
        **({"slices": slices} if slices > 1 else {}),
    }
    # several runs (the test session's workers) may share the cache and compute one key at once: each replaces the
    # file whole, so a reader sees one complete result or none
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(partial, path)
    return {**result, "cached": False}


@contextlib.contextmanager
def world_metadata(slices: int) -> Iterator[dict[str, str]]:
    """What a world's processes need beyond a slice's: the `respawn-world` key of world 1 with every slice a member,
    served by a metadata server as a local machine's VMs have theirs (vms.py), and the version they are started for.
    The key names the coordinator (process 0, slice 0's worker 0, serves it on a free loopback port), so no
    rendezvous object is needed. One slice is no world: nothing is added and no server runs."""
    if slices <= 1:
        yield {}
        return
    key = {
        "version": 1,
        "members": list(range(slices)),
        "step": None,
        "coordinator": f"{LOOPBACK}:{free_port()}",
    }
    server = MetadataServer("respawn-local", {WORLD_METADATA: json.dumps(key)}, "reference")
    try:
        yield {WORLD_ENV: "1", "RESPAWN_METADATA_URL": f"http://{server.host}/computeMetadata/v1"}
    finally:
        server.close()


def start_world(
    machine_slice: LocalSlice, slices: int, argv: Sequence[str], env: Mapping[str, str], log: IO[bytes]
) -> list[subprocess.Popen[bytes]]:
    """Every process: each slice's workers in worker order, slice by slice (the key's members order, so process ids
    follow the list: respawn_trainer/world.py), each slice with its RESPAWN_SLICE when there are several. Process 0
    writes the lifecycle entries read here; what every other process prints goes to the log as it comes."""
    procs: list[subprocess.Popen[bytes]] = []
    for index in range(slices):
        slice_env = {**env, SLICE_ENV: str(index)} if slices > 1 else env
        procs += machine_slice.start(argv, slice_env, functools.partial(_output, log, first=not procs))
    return procs


def _output(log: IO[bytes], worker: int, *, first: bool) -> tuple[Any, Any]:
    """A process's (stdout, stderr): the first slice's worker 0 is read through a pipe, the others write the log."""
    return (subprocess.PIPE if first and worker == 0 else log, log)


def wait_for(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> bytes:
    """Process 0's stdout once it exits; the others finish with it (or are stopped when it failed)."""
    proc = procs[0]
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        for other in procs[1:]:
            if proc.returncode == 0:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    other.wait(timeout=60)
    finally:
        for p in procs:
            stop_group(p, grace=2)
    return bytes(out)


def completed_entry(out: bytes, log: IO[bytes]) -> dict[str, Any] | None:
    """Process 0's `completed` entry, if it sent one; every line that is no lifecycle entry goes to the log."""
    completed = None
    for line in out.splitlines(keepends=True):
        entry = lifecycle_entry(line, JOB_ID, 1)
        if entry is None:
            log.write(line)  # what the program printed
        elif entry["event"] == "completed":
            completed = entry
    return completed
