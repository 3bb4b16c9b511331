"""Dataset benchmark: the trainer's steps/s reading ArrayRecord shards through its Grain pipeline (`--data`) against
the generated corpus, and the time restoring the data iterator's state adds to a checkpoint restore.

Throughput: real `python -m trainer` runs of the default model (tiny), the two inputs alternated (generated, data,
generated, data, ...) so that a busy moment of a shared machine does not land on one side only; each run's steps/s
is its steps over its training wall time (the attempt's wall less startup and restore: steps, saves and the waits
for input together), and each side's figure is the median of its runs. Target: the dataset path costs no more than
5 % of steps/s (data_steps_ratio >= 0.95). The shards are the generated corpus itself (1 MiB, 64-token sequences)
written by `python -m trainer.prepare`, local (a run on gs:// reads a local copy too: trainer/README.md).

Restore: in one process, the same state (the tiny model's parameters and optimizer moments) saved by
respawn_trainer's Checkpoints with and without a Grain iterator; each restored alternately, the median difference
is what the iterator adds (its `data/global.json` read and `set_state`).

Prints readable lines, then as its LAST line one JSON object:
{"steps_per_s_generated", "steps_per_s_data", "data_steps_ratio", "input_pct", "iterator_restore_added_s", ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def train(workdir: Path, name: str, args: list[str]) -> dict:
    """One run to the end; its `completed` entry."""
    sink = workdir / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env.update(
        RESPAWN_JOB_ID="bench-data",
        RESPAWN_CHECKPOINT_URI=str(workdir / name),
        RESPAWN_LOG_SINK=str(sink),
        RESPAWN_COMPILE_CACHE=str(workdir / "jax-cache"),
        JAX_PLATFORMS="cpu",
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-2000:]}")
    entries = [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]
    return next(e for e in reversed(entries) if e["event"] == "completed")


def steps_per_s(completed: dict) -> float:
    g = completed["goodput"]
    return float(completed["step"]) / (g["total_s"] - g["startup_s"] - g["restore_s"])


def restore_overhead(workdir: Path, shards: Path, repeats: int) -> tuple[float, float, float]:
    """(median restore s without the iterator, with it, the median of the paired differences)."""
    import jax
    import numpy as np

    from respawn_trainer.checkpoint import Checkpoints, abstract
    from trainer import dataset

    rng = np.random.default_rng(0)
    state = {f"w{i}": jax.numpy.asarray(rng.normal(size=(128, 512)).astype(np.float32)) for i in range(12)}
    paths = dataset.shard_paths(str(shards), str(workdir / "cache"))
    fresh = lambda: dataset.iterator(paths, seed=0, global_batch=16, seq_len=64)  # noqa: E731
    plain, with_data = Checkpoints(str(workdir / "plain"), 3), Checkpoints(str(workdir / "data"), 3)
    with_data.follow(it := fresh())
    for _ in range(7):
        next(it)
    for ckpt in (plain, with_data):
        ckpt.save(7, state)
        ckpt.wait()
    template = abstract(state)
    times: dict[str, list[float]] = {"plain": [], "data": []}
    for _ in range(repeats):
        for name, ckpt in (("plain", plain), ("data", with_data)):
            if name == "data":
                ckpt.follow(fresh())
            began = time.perf_counter()
            restored = ckpt.restore_newest(template)
            times[name].append(time.perf_counter() - began)
            assert restored is not None and restored[1] == 7
    assert with_data.data.get_state() == it.get_state()  # the restored iterator is where the saved one was
    added = statistics.median(d - p for d, p in zip(times["data"], times["plain"], strict=True))
    return statistics.median(times["plain"]), statistics.median(times["data"]), added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps of each throughput run (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each input, alternated (default 3)")
    parser.add_argument("--restores", type=int, default=15, help="restores of each kind (default 15)")
    opts = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="respawn-bench-data-") as tmp:
        workdir = Path(tmp)
        from trainer import data
        from trainer.prepare import prepare

        shards = workdir / "shards"
        summary = prepare(data.corpus().tobytes(), str(shards), seq_len=64, shards=8)
        print(f"shards: {summary['records']} records of 65 tokens in {summary['shards']} shards")

        base = [f"--steps={opts.steps}", "--log-every=100", "--checkpoint-every=auto"]
        runs: dict[str, list[float]] = {"generated": [], "data": []}
        input_pct: list[float] = []
        for r in range(opts.rounds):
            for name in ("generated", "data"):
                extra = [f"--data={shards}", f"--data-cache={workdir / 'cache'}"] if name == "data" else []
                completed = train(workdir, f"{name}-{r}", [*base, *extra])
                runs[name].append(steps_per_s(completed))
                g = completed["goodput"]
                if name == "data":
                    input_pct.append(100 * g["input_s"] / (g["total_s"] - g["startup_s"] - g["restore_s"]))
                print(f"round {r + 1} {name:9}: {runs[name][-1]:.2f} steps/s")
        generated, on_data = statistics.median(runs["generated"]), statistics.median(runs["data"])
        ratio = on_data / generated
        print(
            f"steps/s (median of {opts.rounds}): generated {generated:.2f}, dataset {on_data:.2f}: ratio {ratio:.3f}; "
            f"input wait {statistics.median(input_pct):.2f}% of the dataset runs' training time"
        )
        plain, with_data, added = restore_overhead(workdir, shards, opts.restores)
        print(
            f"restore (median of {opts.restores}): {plain * 1e3:.1f} ms without the iterator, {with_data * 1e3:.1f} ms "
            f"with it: +{added * 1e3:.1f} ms"
        )
    load = (round(load_before, 2), round(os.getloadavg()[0], 2))
    print(f"load average (1 min) before and after: {load[0]} {load[1]} on {os.cpu_count()} cores")
    print(
        json.dumps(
            {
                "steps_per_s_generated": round(generated, 2),
                "steps_per_s_data": round(on_data, 2),
                "data_steps_ratio": round(ratio, 3),
                "input_pct": round(statistics.median(input_pct), 3),
                "restore_s": round(plain, 4),
                "restore_with_iterator_s": round(with_data, 4),
                "iterator_restore_added_s": round(added, 4),
                "model": "tiny",
                "steps": opts.steps,
                "rounds": opts.rounds,
                "load_avg_1m": load,
            }
        )
    )


if __name__ == "__main__":
    main()
