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

A program that never sends `params_sha256` (one that does not use the
respawn_trainer library) completes by its exit code alone: its reference has no
hash, and `exact` is unknown rather than false.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localcloud.machines.slices import SINGLE_HOST, LocalSlice
from localcloud.machines.vms import TRAINER, lifecycle_entry
from localcloud.services.emulators import stop_group
from respawn.machine import exit_code_entry

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
) -> str:
    """The name of a cached reference: what the run computes from (args, env, slice shape, program)."""
    key: dict[str, Any] = {"args": list(args), "env": dict(sorted(env.items())), "trainer": trainer_digest()}
    key.update(machine_slice.cache_key())
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
) -> dict[str, Any]:
    """{"params_sha256", "final_step", "final_loss", "wall_s", "cached"} of the uninterrupted run, on the processes
    of `machine_slice`, of `python -m trainer`, or of `entrypoint`, with `args`. params_sha256 is None when the
    program completed without sending it. Raises ReferenceFailed when it did not complete. `base_env` is what every
    local trainer starts from (slices.local_trainer_env), the job's `env` over it."""
    path = cache_dir / f"{reference_key(args, env, machine_slice, entrypoint)}.json"
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
        # process 0 writes the lifecycle entries; what the others print goes to the log as it comes
        procs = machine_slice.start(argv, run_env, lambda worker: (subprocess.PIPE if worker == 0 else log, log))
        proc = procs[0]
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            for other in procs[1:]:  # they finish with process 0 (or are stopped below when it failed)
                if proc.returncode == 0:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        other.wait(timeout=60)
        finally:
            for p in procs:
                stop_group(p, grace=2)
        wall = time.monotonic() - t
        completed = None
        for line in out.splitlines(keepends=True):
            entry = lifecycle_entry(line, JOB_ID, 1)
            if entry is None:
                log.write(line)  # what the program printed
            elif entry["event"] == "completed":
                completed = entry
    by_exit_code = exit_code_entry(proc.returncode, worker=0, noticed=False)  # what the startup script would say
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
    }
    # several runs (the test session's workers) may share the cache and compute one key at once: each replaces the
    # file whole, so a reader sees one complete result or none
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(partial, path)
    return {**result, "cached": False}
