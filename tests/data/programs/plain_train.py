"""A user's training program that knows nothing of respawn (no RESPAWN_* variable read, no lifecycle entry sent).

It fits y = 3x + 1 by gradient descent for `--steps` steps, printing `step N loss X` to stdout, and exits 0.
On SIGTERM it stops at the next step boundary and exits 0, as many programs do, after `--save-time` seconds of a
final save (none by default). Its stdout also carries lines a
log reader could trip on: a JSON object that names a lifecycle event but no job, JSON nested too deep to parse,
bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import signal
import sys
import time


def main(argv: list[str]) -> int:
    steps, step_time, save_time = 10, 0.02, 0.0
    for arg in argv:
        name, _, value = arg.partition("=")
        if name == "--steps":
            steps = int(value)
        elif name == "--step-time":
            step_time = float(value)
        elif name == "--save-time":
            save_time = float(value)
        else:
            print(f"unknown flag {arg}", file=sys.stderr)
            return 2
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    print("plain training: y = 3x + 1", flush=True)
    print(json.dumps({"event": "completed", "note": "the program's own log line"}), flush=True)
    print('{"deep": ' + "[" * 100_000 + "]" * 100_000 + "}", flush=True)
    sys.stdout.buffer.write(b'{"event": "\xff\xfe"}\n')
    sys.stdout.flush()
    xs = [i / 8 for i in range(8)]
    w = b = 0.0
    for step in range(1, steps + 1):
        if stop:
            print(f"SIGTERM after step {step - 1}: saving for {save_time:g}s", flush=True)
            time.sleep(save_time)
            print(f"final save done after {save_time:g}s: exiting 0", flush=True)
            return 0
        errors = [w * x + b - (3 * x + 1) for x in xs]
        w -= 0.5 * sum(2 * e * x for e, x in zip(errors, xs, strict=True)) / len(xs)
        b -= 0.5 * sum(2 * e for e in errors) / len(xs)
        loss = sum(e * e for e in errors) / len(xs)
        print(f"step {step} loss {loss:.4f}", flush=True)
        time.sleep(step_time)
    print(f"done: w={w:.3f} b={b:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
