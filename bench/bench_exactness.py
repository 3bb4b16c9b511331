"""Exact resumption over randomized kill schedules (SPEC 7: 100% of >= 20 schedules bitwise-equal).

One uninterrupted run of the trainer gives the reference `params_sha256`. Then
each schedule (seeded) interrupts a fresh run 1-3 times at random steps, each
time with SIGTERM (the preemption notice: save, exit 0) or SIGKILL (no notice:
the newest complete checkpoint is all that survives), restarts it until it
completes, and compares its final hash with the reference. Real processes,
real signals, real Orbax checkpoints on local disk, one shared compilation cache.

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

from trainer_harness import STEPS, last, run_to_end, start, trainer_env


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="respawn-exact-") as tmp:
        base, cache = Path(tmp), Path(tmp) / "cache"
        (base / "ref").mkdir()
        code, run = run_to_end(trainer_env(str(base / "ref" / "ckpt"), base / "ref" / "e.jsonl", cache))
        if code != 0:
            print(run.tail(), file=sys.stderr)
            return 1
        reference = last(base / "ref" / "e.jsonl", "completed")["params_sha256"]
        print(f"reference {reference[:16]}", flush=True)
        exact, signals = 0, []
        for i in range(args.schedules):
            root = base / f"s{i}"
            root.mkdir()
            digest, sent = schedule(args.seed + i, root, cache)
            exact += digest == reference
            signals += sent
            print(f"schedule {i:2d}: {' '.join(sent) or 'none':<24} {'exact' if digest == reference else 'DIFFERENT'}")
    figures = {
        "schedules": args.schedules,
        "exact": exact,
        "exact_pct": round(100.0 * exact / args.schedules, 1),
        "sigterm": signals.count("SIGTERM"),
        "sigkill": signals.count("SIGKILL"),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
