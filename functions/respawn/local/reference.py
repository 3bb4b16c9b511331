"""The uninterrupted reference run a local run is compared with (`exact` in the report).

The same trainer (or the same `--entrypoint` command) with the same args and
env, run once to completion without the control plane, checkpointing to a
temporary local directory. For a multi-host
TPU slice it is as many processes as the slice has hosts, each with the worker
environment the local cloud gives a slice's workers (nodes.py), so the shape of
the computation (processes x devices) is the job's. Its final `params_sha256` is
cached under `.respawn/reference/<key>.json`, keyed by the args, the env, the
slice shape and the trainer's source (with an entrypoint: the command and the
files it names), so it is computed once per change.

A program that never sends `params_sha256` (one that does not use the
respawn_trainer library) completes by its exit code alone: its reference has no
hash, and `exact` is unknown rather than false.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from respawn.local.emulators import free_port, start_group, stop_group
from respawn.local.nodes import TRAINER, lifecycle_entry, slice_worker_env

JOB_ID = "reference"


def trainer_digest() -> str:
    import trainer

    root = Path(next(iter(trainer.__path__)))  # also when imported as a namespace package (editable installs)
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
    hosts: int = 1,
    chips_per_host: int = 1,
    entrypoint: Sequence[str] | None = None,
) -> str:
    key: dict[str, Any] = {"args": list(args), "env": dict(sorted(env.items())), "trainer": trainer_digest()}
    if hosts > 1:  # a one-host run keeps the key it always had
        key.update(hosts=hosts, chips_per_host=chips_per_host)
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
    hosts: int = 1,
    chips_per_host: int = 1,
    entrypoint: Sequence[str] | None = None,
) -> dict[str, Any]:
    """{"params_sha256", "final_step", "final_loss", "wall_s", "cached"} of the uninterrupted run
    (`hosts` processes with `chips_per_host` devices each for a multi-host slice) of `python -m trainer`, or of
    `entrypoint`, with `args`. params_sha256 is None when the program completed without sending it. Raises
    ReferenceFailed when it did not complete."""
    path = cache_dir / f"{reference_key(args, env, hosts, chips_per_host, entrypoint)}.json"
    if path.exists():
        return {**json.loads(path.read_text()), "cached": True}
    cache_dir.mkdir(parents=True, exist_ok=True)
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
        if hosts == 1:
            procs = [start_group(argv, env=run_env, stdout=subprocess.PIPE, stderr=log)]
        else:
            port = free_port()
            procs = [
                start_group(
                    argv,
                    env=slice_worker_env(run_env, i, hosts, port, chips_per_host),
                    stdout=subprocess.PIPE if i == 0 else log,  # process 0 writes the lifecycle entries
                    stderr=log,
                )
                for i in range(hosts)
            ]
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
    if completed is None and proc.returncode == 0:  # completed by its exit code (the startup script's `completed`)
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
        "hosts": hosts,
        "chips_per_host": chips_per_host,
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    return {**result, "cached": False}
