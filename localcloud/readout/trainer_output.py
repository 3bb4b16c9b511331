"""`respawn logs JOB` on the local cloud: a job's trainer output from the run directory that ran it.

A run (`respawn local run`, or any LocalCloud) keeps its files in WORKDIR/runs/DATE-TIME-PID/: `timeline.jsonl`
names the jobs it submitted, and `machines/` holds each trainer process's output, `JOB-aN.log` (one host) or
`JOB-aN-w-I.log` (worker I of a slice): its progress lines and its lifecycle entries, one JSON object per line
(the `failed` entry the startup script writes for a trainer that died without a word included). The newest run
of the job is read, attempt by attempt (worker by worker). Following reads the files as they grow, and ends when
the run is over: its report is written, or the process that ran it is gone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from respawn.jobs import parse_machine_name
from respawn_ops.joblogs import LogLine, lifecycle_payload

_LOG_FILE = re.compile(r"(?P<machine>.+?)(?:-w-(?P<worker>\d+))?\.log")
POLL_S = 0.25


@dataclass(frozen=True)
class MachineLog:
    attempt: int
    worker: int | None  # None: a one-host machine
    path: Path


def submitted_jobs(run: Path) -> set[str]:
    """The job ids a run submitted (its timeline's `submitted` lines)."""
    try:
        with (run / "timeline.jsonl").open(encoding="utf-8") as f:
            lines = [line for line in f if '"submitted"' in line]
    except OSError:
        return set()
    jobs = set()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("kind") == "submitted":
            jobs.add(str(event.get("job_id")))
    return jobs


def find_run(workdir: Path, job_id: str) -> Path | None:
    """The newest run under `workdir` that submitted `job_id` (run directories are named by their start time)."""
    runs = workdir / "runs"
    candidates = sorted((p for p in runs.iterdir() if p.is_dir()), reverse=True) if runs.is_dir() else []
    return next((run for run in candidates if job_id in submitted_jobs(run)), None)


def machine_logs(run: Path, job_id: str) -> list[MachineLog]:
    """The job's trainer output files in the run, by attempt, then worker."""
    found = []
    folder = run / "machines"
    for path in folder.iterdir() if folder.is_dir() else ():
        m = _LOG_FILE.fullmatch(path.name)
        parsed = parse_machine_name(m["machine"]) if m else None
        if m and parsed and parsed[0] == job_id:
            found.append(MachineLog(parsed[1], None if m["worker"] is None else int(m["worker"]), path))
    return sorted(found, key=lambda f: (f.attempt, -1 if f.worker is None else f.worker))


def attempts(run: Path, job_id: str) -> list[int]:
    """The attempts the run made for the job: every create call the cloud API received, and every output file."""
    numbers = {f.attempt for f in machine_logs(run, job_id)}
    try:
        with (run / "timeline.jsonl").open(encoding="utf-8") as f:
            for line in f:
                if '"create_call"' in line and job_id in line:
                    parsed = parse_machine_name(str(json.loads(line).get("machine", "")))
                    if parsed and parsed[0] == job_id:
                        numbers.add(parsed[1])
    except (OSError, ValueError):
        pass
    return sorted(numbers)


def run_over(run: Path) -> bool:
    """The run wrote its report, or the process that ran it (the PID its directory is named after) is gone."""
    if (run / "report.json").exists():
        return True
    pid = run.name.rpartition("-")[2]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _line(log: MachineLog, raw: bytes) -> LogLine:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    entry = lifecycle_payload(text)
    return LogLine(log.attempt, log.worker, text="" if entry else text, entry=entry)


def read(
    run: Path,
    job_id: str,
    out: Callable[[LogLine], None],
    *,
    attempt: int | None = None,
    follow: bool = False,
    sleep: Callable[[float], None],
    over: Callable[[Path], bool] = run_over,
    poll_s: float = POLL_S,
) -> int:
    """Hand every line of the job's output files to `out`, attempt by attempt; returns how many. With `follow`,
    keep reading the files (and new attempts' files) as they grow until the run is over."""
    offsets: dict[Path, int] = {}
    count = 0
    while True:
        last = not follow or over(run)  # decided before reading: the last pass sees everything written
        for log in machine_logs(run, job_id):
            if attempt is not None and log.attempt != attempt:
                continue
            with log.path.open("rb") as f:
                f.seek(offsets.get(log.path, 0))
                data = f.read()
            whole = data if last else data[: data.rfind(b"\n") + 1]  # a line still being written waits
            offsets[log.path] = offsets.get(log.path, 0) + len(whole)
            for raw in whole.splitlines():
                out(_line(log, raw))
                count += 1
        if last:
            return count
        sleep(poll_s)
