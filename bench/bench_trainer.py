"""Trainer benchmark: throughput, checkpoint stall at the default (auto) interval, start-to-first-step
with a fresh and with a warm compilation cache (restarts that restore the previous stop's checkpoint), and
where a restart's time goes (import / setup / compile / restore, from the `started` entries).
Real `python -m trainer` processes, default model size, with the bytecode the trainer image's build compiles and
the image's environment (trainer/Dockerfile). Target: start_to_first_step_cached_s < 1.0 s on a quiet machine:
each warm start is launched once the cores are idle (at most 15 s of waiting), so another process's burst is not
counted as the start.

Prints readable lines, then as its LAST line one JSON object:
{"steps_per_s", "stall_pct", "start_to_first_step_s", "start_to_first_step_cached_s", "start_split_s", ...,
"load_avg_1m": [before, after]}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localcloud.machines.slices import IMAGE_ENV, compile_bytecode

REPO = Path(__file__).resolve().parents[1]
FIRST_STEP = re.compile(r" step \d+/\d+ loss ")  # the first step line (--log-every=1): the first new step
SPLIT = ("import_s", "setup_s", "compile_s", "restore_s")  # of the `started` entry: where a start goes
INTERVAL = re.compile(r"auto -> every (\d+) steps")


def launch(workdir: Path, name: str, cache: Path, args: list[str]) -> tuple[subprocess.Popen[str], Path, float]:
    sink = workdir / f"{name}.jsonl"
    env = {**IMAGE_ENV, **{k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}}  # as the image has it
    env.update(
        RESPAWN_JOB_ID=f"bench-{name}",
        RESPAWN_CHECKPOINT_URI=str(workdir / name),
        RESPAWN_LOG_SINK=str(sink),
        RESPAWN_COMPILE_CACHE=str(cache),
    )
    launched = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "--log-every=1", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, sink, launched


def first_step(proc: subprocess.Popen[str], launched: float, log: list[str]) -> float:
    """Seconds from launch until the trainer reports step 1 (the rest of stderr goes on into `log`)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        log.append(line)
        if FIRST_STEP.search(line):
            return time.monotonic() - launched
    raise RuntimeError("the trainer exited before its first step:\n" + "".join(log[-20:]))


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of every core since boot, from /proc/stat; (0, 0) where there is none."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return fields[3] + fields[4], sum(fields)  # idle + iowait


def wait_quiet(idle: float = 0.9, window_s: float = 0.25, limit_s: float = 15.0) -> float:
    """Wait until the machine's cores were at least `idle` idle over one `window_s` (a start measured on a busy
    machine measures the machine), at most `limit_s`; returns the seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        idle0, total0 = cpu_times()
        time.sleep(window_s)
        idle1, total1 = cpu_times()
        if total1 == total0 or (idle1 - idle0) / (total1 - total0) >= idle:
            break
    return time.monotonic() - began


def entries(sink: Path) -> list[dict]:
    return [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps of the throughput/stall run (default 600)")
    parser.add_argument("--cached-runs", type=int, default=5, help="warm-cache starts to take the median of")
    opts = parser.parse_args()
    compile_bytecode()  # as the image has it (its build runs compileall), not compiled again by every start
    load_before = os.getloadavg()[0]  # the machine may be shared: its load is part of the result

    with tempfile.TemporaryDirectory(prefix="respawn-bench-") as tmp:
        workdir, cache = Path(tmp), Path(tmp) / "jax-cache"

        proc, sink, launched = launch(workdir, "full", cache, [f"--steps={opts.steps}"])
        log: list[str] = []
        fresh = first_step(proc, launched, log)
        assert proc.stderr is not None
        log += proc.stderr.readlines()
        if proc.wait() != 0:
            raise RuntimeError("the benchmark run failed:\n" + "".join(log[-20:]))
        completed = [e for e in entries(sink) if e["event"] == "completed"][-1]
        saves = [e for e in entries(sink) if e["event"] == "checkpoint"]
        goodput = completed["goodput"]
        training_wall = goodput["total_s"] - goodput["startup_s"] - goodput["restore_s"]
        steps_per_s = opts.steps / goodput["productive_s"]
        stall_pct = 100.0 * goodput["checkpoint_s"] / training_wall
        intervals = [int(m.group(1)) for line in log if (m := INTERVAL.search(line))]
        interval = intervals[-1] if intervals else None
        print(f"fresh cache: first step {fresh:.2f}s after launch")
        print(
            f"{opts.steps} steps: {steps_per_s:.1f} steps/s, {len(saves)} saves "
            f"(auto interval {interval} steps), blocking {goodput['checkpoint_s']:.3f}s of {training_wall:.1f}s "
            f"= {stall_pct:.2f}% stall"
        )

        # Restarts as after a preemption: the same checkpoint directory (each one restores the previous stop)
        # and the warm compilation cache.
        cached: list[float] = []
        waited = 0.0
        for _ in range(opts.cached_runs + 1):
            waited += wait_quiet()
            proc, warm_sink, launched = launch(workdir, "warm", cache, [f"--steps={opts.steps}"])
            cached.append(first_step(proc, launched, []))
            proc.send_signal(signal.SIGTERM)
            if proc.wait(timeout=60) != 0:
                raise RuntimeError("a warm-cache run did not stop cleanly")
        restarts = [e for e in entries(warm_sink) if e["event"] == "started"][1:]
        cached = cached[1:]  # the first one starts from scratch
        warm = statistics.median(cached)
        split = {k: round(statistics.median(e[k] for e in restarts), 3) for k in SPLIT}
        print(
            f"warm cache: first step {warm:.2f}s after launch (median of {[round(c, 2) for c in cached]}; each "
            f"launched once the cores were 90% idle, {waited:.1f}s waited in all)"
        )
        print("  split (median): " + ", ".join(f"{k} {v:.2f}s" for k, v in split.items()))
    load = (round(load_before, 2), round(os.getloadavg()[0], 2))
    print(f"load average (1 min) before and after: {load[0]} {load[1]} on {os.cpu_count()} cores")

    print(
        json.dumps(
            {
                "steps_per_s": round(steps_per_s, 2),
                "stall_pct": round(stall_pct, 3),
                "start_to_first_step_s": round(fresh, 2),
                "start_to_first_step_cached_s": round(warm, 2),
                "start_split_s": split,
                "model": "tiny",
                "steps": opts.steps,
                "auto_interval_steps": interval,
                "saves": len(saves),
                "load_avg_1m": load,
            }
        )
    )


if __name__ == "__main__":
    main()
