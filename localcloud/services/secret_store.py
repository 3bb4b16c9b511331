"""The local cloud's Secret Manager: the values of a job's secret references, given on this machine.

`respawn local run` takes them from `--secret NAME=VALUE`, `--secret NAME` (the
value of NAME in this shell's environment, kept off the command line) or a
`--secrets-file` of `NAME=VALUE` lines, NAME being the job's variable. They are
held in memory, keyed by the reference, and reach a trainer's environment only
through the startup script's own reads (gcloud secrets versions access) from the
local Secret Manager (machine_host.py), as on a machine. `leaks` searches files
for them: the run proves no record, log or timeline holds one.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from localcloud.timeline import Timeline

MIN_SEARCHED_BYTES = 8  # shorter values would be found by chance in binary files


class SecretError(ValueError):
    """A secret option or file that cannot be used (the message never holds a value)."""


def add_flags(run: argparse.ArgumentParser) -> None:
    """The values of a job's secrets on `respawn local run`'s command line (read by `secret_values`)."""
    run.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="the value of the job's secret NAME; without =VALUE, from this environment's NAME; repeatable",
    )
    run.add_argument("--secrets-file", metavar="FILE", help="values of the job's secrets as NAME=VALUE lines")


def secret_values(
    job_secrets: Mapping[str, str],
    options: Iterable[str],
    file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """{reference: value} for every secret of the job ({variable: reference}), from the options and the file."""
    environ = os.environ if environ is None else environ
    by_name: dict[str, str] = {}
    if file is not None:
        by_name.update((k, v) for k, v in _file_values(file).items() if k in job_secrets)  # a file may serve many jobs
    for option in options:
        name, eq, value = option.partition("=")
        if name not in job_secrets:
            known = ", ".join(sorted(job_secrets)) or "none"
            raise SecretError(f"--secret {name}: the job has no secret {name}; its secrets: {known}")
        if not eq:
            if name not in environ:
                raise SecretError(f"--secret {name}: {name} is not set in this environment (or give NAME=VALUE)")
            value = environ[name]
        by_name[name] = value
    for name, value in by_name.items():
        if "\x00" in value:
            raise SecretError(f"secret {name}: the value contains a NUL character, which no environment can hold")
    missing = sorted(set(job_secrets) - set(by_name))
    if missing:
        name = missing[0]
        raise SecretError(
            f"the job's secret {name} ({job_secrets[name]}) has no local value: give --secret {name}=VALUE, "
            f"--secret {name} (its value from this environment) or a --secrets-file line {name}=VALUE"
        )
    return {job_secrets[name]: value for name, value in by_name.items()}


def _file_values(path: str) -> dict[str, str]:
    """NAME=VALUE lines; blank lines and lines starting with # are skipped; the value is everything after `=`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SecretError(f"--secrets-file: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    values = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, value = line.partition("=")
        if not eq or not name.strip():
            raise SecretError(f"--secrets-file {path}: line {number} is not NAME=VALUE")
        values[name.strip()] = value
    return values


def delivered(environ: Mapping[str, str], expected: Mapping[str, str | None]) -> bool:
    """The process environment holds every expected variable with its value (None: the variable is absent)."""
    return all(environ.get(name) == value for name, value in expected.items())


def leaks(values: Iterable[str], roots: Iterable[Path]) -> list[str]:
    """The files under `roots` that hold any of `values` (as written, or JSON-escaped), or a short one unsearched."""
    needles = set()
    for value in values:
        if len(value.encode()) >= MIN_SEARCHED_BYTES:
            needles |= {value.encode(), json.dumps(value)[1:-1].encode()}
    found = []
    for root in roots:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            try:
                data = path.read_bytes()
            except OSError:
                continue  # gone meanwhile
            if any(needle in data for needle in needles):
                found.append(str(path))
    return found


ENVIRON_TRIES = 10


def check_trainers(
    timeline: Timeline, machine: str, refs_json: str, pids: Callable[[], list[int]], secrets: Mapping[str, str]
) -> None:
    """Each trainer process (`pids()`) of a READY machine holds every secret of its metadata (`respawn-secrets`:
    `refs_json`), as the OS shows its environment (names and a yes or no in the timeline, never a value)."""
    refs: dict[str, str] = json.loads(refs_json or "{}")
    if not refs:
        return
    import psutil

    expected = {name: secrets.get(ref) for name, ref in refs.items()}
    for pid in pids():
        try:
            # read again a few times: a container's process may be between its execs (setpriv, then the trainer),
            # when the OS shows an environment that is not yet the new program's
            for _ in range(ENVIRON_TRIES):
                ok = delivered(psutil.Process(pid).environ(), expected)
                if ok:
                    break
                time.sleep(0.1)
        except psutil.Error:
            continue  # exited already
        timeline.add("secrets", machine=machine, pid=pid, names=sorted(refs), delivered=ok)


def secrets_report(timeline: Timeline, secrets: Mapping[str, str], roots: Iterable[Path]) -> dict[str, Any]:
    """Secrets: trainer processes that held them all (the timeline's checks), and the files under `roots` holding a
    value."""
    checks = timeline.events("secrets")
    return {
        "trainers": len(checks),
        "delivered": sum(bool(c["delivered"]) for c in checks),
        "leaks": leaks(secrets.values(), roots),
    }
