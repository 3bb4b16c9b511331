"""The uninterrupted reference run a local run is compared with (`exact` in the report).

The same trainer with the same args and env, run once to completion without the
control plane, checkpointing to a temporary local directory. Its final
`params_sha256` is cached under `.respawn/reference/<key>.json`, keyed by the
args, the env and the trainer's source, so it is computed once per change.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from respawn.local.emulators import start_group, stop_group


def trainer_digest() -> str:
    import trainer

    root = Path(next(iter(trainer.__path__)))  # also when imported as a namespace package (editable installs)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def reference_key(args: Sequence[str], env: Mapping[str, str]) -> str:
    blob = json.dumps({"args": list(args), "env": dict(sorted(env.items())), "trainer": trainer_digest()})
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def reference_run(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    cache_dir: Path,
    base_env: Mapping[str, str],
    log_path: Path,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """{"params_sha256", "final_step", "final_loss", "wall_s", "cached"} of the uninterrupted run."""
    path = cache_dir / f"{reference_key(args, env)}.json"
    if path.exists():
        return {**json.loads(path.read_text()), "cached": True}
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="respawn-reference-") as ckpt, log_path.open("ab") as log:
        run_env = {
            **base_env,
            **env,
            "RESPAWN_JOB_ID": "reference",
            "RESPAWN_ATTEMPT": "1",
            "RESPAWN_CHECKPOINT_URI": ckpt,
            "RESPAWN_LOG_SINK": "stdout",
        }
        t = time.monotonic()
        proc = start_group([sys.executable, "-m", "trainer", *args], env=run_env, stdout=subprocess.PIPE, stderr=log)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        finally:
            stop_group(proc, grace=2)
        wall = time.monotonic() - t
    completed = None
    for line in out.decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "completed":
            completed = entry
    if completed is None:
        raise RuntimeError(f"the reference run did not complete (exit code {proc.returncode}); see {log_path}")
    result = {
        "params_sha256": completed.get("params_sha256"),
        "final_step": completed.get("step"),
        "final_loss": completed.get("final_loss"),
        "wall_s": round(wall, 2),
        "args": list(args),
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    return {**result, "cached": False}
