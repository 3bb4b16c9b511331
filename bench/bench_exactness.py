"""Exact resumption over randomized kill schedules (SPEC 7: 100% of >= 20 schedules bitwise-equal).

One uninterrupted run of the trainer gives the reference `params_sha256`. Then
each schedule (seeded) interrupts a fresh run 1-3 times at random steps, each
time with SIGTERM (the preemption notice: save, exit 0) or SIGKILL (no notice:
the newest complete checkpoint is all that survives), restarts it until it
completes, and compares its final hash with the reference. Real processes,
real signals, real Orbax checkpoints on local disk, one shared compilation cache.

With --hosts N every run is a loopback slice of N trainer processes (respawn_trainer.slice_env,
--devices-per-host CPU devices each, jax.distributed over gloo, 40 steps): SIGTERM goes to
every worker or to one (the notice is agreed), SIGKILL to one worker and then, as a launcher
does, to the rest; the reference is an uninterrupted run of the same slice shape.

Last line: {"schedules", "exact", "exact_pct", "sigterm", "sigkill", "seconds"}.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer"))

from trainer_harness import STEPS, last, run_slice_to_end, run_to_end, start, start_slice, trainer_env

SLICE_STEPS = 40
SLICE_ARGS = ["--model=nano", f"--steps={SLICE_STEPS}", "--seed=7", "--checkpoint-every=10", "--log-every=1"]


def schedule(seed: int, root: Path, cache: Path) -> tuple[str, list[str]]:
    """Run one kill schedule to completion; (final hash, the signals sent)."""
    rng = random.Random(seed)
    sink, ckpt = root / "entries.jsonl", root / "ckpt"
    env = trainer_env(str(ckpt), sink, cache)
    sent: list[str] = []
    for target in sorted(rng.sample(range(3, STEPS - 5), rng.randint(1, 3))):
        run = start(env)
        if run.wait_step(target) < target:  # it got there before us: the schedule has fewer interruptions
            run.finish()
            break
        sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
        run.signal(sig)
        run.finish()
        sent.append(sig.name)
    code, run = run_to_end(env)
    if code != 0:
        raise RuntimeError(f"schedule {seed}: exit {code}\n{run.tail()}")
    return last(sink, "completed")["params_sha256"], sent


def slice_schedule(seed: int, root: Path, cache: Path, hosts: int, devices: int) -> tuple[str, list[str]]:
    """One kill schedule of a `hosts`-host slice; (final hash, the signals sent)."""
    rng = random.Random(seed)
    sink, ckpt = root / "entries.jsonl", root / "ckpt"
    env = trainer_env(str(ckpt), sink, cache)
    sent: list[str] = []
    for target in sorted(rng.sample(range(3, SLICE_STEPS - 3), rng.randint(1, 3))):
        run = start_slice(env, hosts, devices, SLICE_ARGS)
        if run.wait_step(target) < target:
            run.finish()
            break
        sig, one = rng.choice([signal.SIGTERM, signal.SIGKILL]), rng.randrange(hosts)
        if sig == signal.SIGTERM and rng.random() < 0.5:
            run.signal(sig)
            sent.append("SIGTERM-all")
        else:
            run.signal(sig, [one])
            sent.append(f"{sig.name}-w{one}")
        if sig == signal.SIGKILL:
            run.kill_all()
        elif any(code != 0 for code in run.finish()):
            raise RuntimeError(f"schedule {seed}: a worker failed after SIGTERM\n{run.tail()}")
    codes, run = run_slice_to_end(env, hosts, devices, SLICE_ARGS)
    hashes = set(run.hashes())
    if codes != [0] * hosts or len(hashes) != 1:
        raise RuntimeError(f"schedule {seed}: exit {codes}, hashes {hashes}\n{run.tail()}")
    return last(sink, "completed")["params_sha256"], sent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--hosts", type=int, default=1, help="processes of a loopback slice (1: a single process)")
    ap.add_argument("--devices-per-host", type=int, default=2, help="CPU devices of each process with --hosts > 1")
    args = ap.parse_args()
    hosts, devices = args.hosts, args.devices_per_host
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="respawn-exact-") as tmp:
        base, cache = Path(tmp), Path(tmp) / "cache"
        (base / "ref").mkdir()
        ref_env = trainer_env(str(base / "ref" / "ckpt"), base / "ref" / "e.jsonl", cache)
        if hosts > 1:
            codes, ref = run_slice_to_end(ref_env, hosts, devices, SLICE_ARGS)
            code, run = max(codes, key=abs), ref.lead
        else:
            code, run = run_to_end(ref_env)
        if code != 0:
            print(run.tail(), file=sys.stderr)
            return 1
        reference = last(base / "ref" / "e.jsonl", "completed")["params_sha256"]
        print(f"reference {reference[:16]}", flush=True)
        exact, signals = 0, []
        for i in range(args.schedules):
            root = base / f"s{i}"
            root.mkdir()
            if hosts > 1:
                digest, sent = slice_schedule(args.seed + i, root, cache, hosts, devices)
            else:
                digest, sent = schedule(args.seed + i, root, cache)
            exact += digest == reference
            signals += sent
            print(f"schedule {i:2d}: {' '.join(sent) or 'none':<24} {'exact' if digest == reference else 'DIFFERENT'}")
    figures = {
        "hosts": hosts,
        "schedules": args.schedules,
        "exact": exact,
        "exact_pct": round(100.0 * exact / args.schedules, 1),
        "sigterm": sum(s.startswith("SIGTERM") for s in signals),
        "sigkill": sum(s.startswith("SIGKILL") for s in signals),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
