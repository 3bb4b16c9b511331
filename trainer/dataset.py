"""A user's dataset: ArrayRecord shards of tokenized sequences (`--data`), read through a Grain pipeline.

Each record is one sequence of byte-level tokens (uint8, at least seq_len + 1 of them; `python -m trainer.prepare`
writes them). The stream: positions 0, 1, 2, ... without end; position i reads shard `order[i % S]` (S shards, their
order shuffled once by --seed), the (i // S)-th record of that shard's own shuffle by --seed (reshuffled each time
the shard has been read through). So every run of S positions takes one record of each shard, and the stream depends
on the seed and the shards only, never on how many processes read it. Each process takes its own slice of it
(positions p, p + n, p + 2n, ... of n processes), batched per process and read ahead by Grain's threads: process p
reads only the shards at `order[r]` with r = p modulo gcd(n, S), one shard in n when S is a multiple of n.

Its state is one number, the position of the next global batch, the same on every process: saved with the train
state (Run.restore's `data=`) and restored on any process count, so a resumed run reads on from the example after
the last one trained, on another slice too.

Shards on gs:// are copied to a local directory first, only those this process reads (read in place when the path is
local, a Cloud Storage FUSE mount included): trainer/README.md, "Real data", says why.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer.config import ConfigError

log = logging.getLogger("trainer")
SUFFIX = ".array_record"
SHARDS_ALLOWED = "a directory or gs:// prefix holding *.array_record shards (python -m trainer.prepare writes them)"
# Batches Grain reads ahead of the step, on READ_THREADS threads: a few steps' worth, so a slow read (a page cache
# miss, a busy core) is absorbed instead of stalling the step. The step's own wait is measured (goodput input_s).
PREFETCH_BATCHES = 16
READ_THREADS = 1
# The stream has no end: its positions are those of a Grain range this long
ENDLESS = sys.maxsize


@dataclass(frozen=True)
class Batch:
    positions: npt.NDArray[np.int64]  # [b]: each example's position in the stream (its identity)
    tokens: npt.NDArray[np.int32]  # [b, seq_len + 1]


def shard_order(count: int, seed: int) -> list[int]:
    """The shards in the order the stream takes them: position i reads shard `shard_order(...)[i % count]`."""
    import grain

    return [int(s) for s in grain.MapDataset.range(count).shuffle(seed=seed)]


def shards_read(count: int, seed: int, process_index: int = 0, process_count: int = 1) -> list[int]:
    """The shards (indices in name order) that process `process_index` of `process_count` ever reads: its positions
    p + k*n meet the stream's shard slots r = p modulo gcd(n, count) only."""
    step = math.gcd(process_count, count)
    order = shard_order(count, seed)
    return sorted(order[r] for r in range(count) if r % step == process_index % step)


def shard_paths(
    uri: str, cache: str, *, seed: int = 0, process_index: int = 0, process_count: int = 1
) -> list[str | None]:
    """Each shard's local path, in name order, where this process reads it (`shards_read`); None where it never does.

    Found in place under a local directory; copied from gs:// into `cache` otherwise, only the shards this process
    reads (a copy of the same size is kept, shards being immutable: a machine's later attempts find them there)."""
    if not uri.startswith("gs://"):
        found = sorted(str(p) for p in Path(uri).glob(f"*{SUFFIX}"))
        if not found:
            raise ConfigError("--data", f"no *{SUFFIX} files in {uri}", SHARDS_ALLOWED)
        mine = set(shards_read(len(found), seed, process_index, process_count))
        return [path if i in mine else None for i, path in enumerate(found)]
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    remote = sorted(p for p in fs.find(root, detail=True).items() if p[0].endswith(SUFFIX))
    if not remote:
        raise ConfigError("--data", f"no *{SUFFIX} objects under {uri}", SHARDS_ALLOWED)
    mine = set(shards_read(len(remote), seed, process_index, process_count))
    local = Path(os.path.expanduser(cache)) / hashlib.sha256(uri.encode()).hexdigest()[:16]
    local.mkdir(parents=True, exist_ok=True)
    began, copied, held = time.monotonic(), 0, 0
    paths: list[str | None] = []
    for i, (name, info) in enumerate(remote):
        if i not in mine:
            paths.append(None)
            continue
        path = local / name.rsplit("/", 1)[-1]
        size = int(info["size"])
        if not path.exists() or path.stat().st_size != size:
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            fs.get_file(name, str(tmp))
            tmp.replace(path)  # atomic: every process of a slice on one machine may be copying the same shard
            copied += size
        held += size
        paths.append(str(path))
    log.info(
        "data: %d of %d shards of %s in %s (%.1f MB read by this process, %.1f MB copied in %.2fs)",
        len(mine),
        len(remote),
        uri,
        local,
        held / 1e6,
        copied / 1e6,
        time.monotonic() - began,
    )
    return paths


class Stream(Iterator[Batch]):
    """This process's batches of the stream (global_batch / process_count examples each), from `position` on.

    Its state is {"position": the stream position of the next global batch}, the same on every process: respawn_trainer
    saves it once per checkpoint and restores it on any process count (`state_is_global`)."""

    state_is_global = True

    def __init__(self, examples: Any, *, global_batch: int, process_index: int, process_count: int) -> None:
        self.examples = examples  # a Grain MapDataset: stream position -> (position, tokens)
        self.global_batch, self.process_index, self.process_count = global_batch, process_index, process_count
        self.position = 0
        self._batches: Iterator[Batch] | None = None

    def __next__(self) -> Batch:
        if self._batches is None:  # made at the first batch, after any set_state: its read threads start then
            import grain

            mine = self.examples[self.position + self.process_index :: self.process_count]
            batched = mine.batch(self.global_batch // self.process_count, batch_fn=_batch)
            options = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=PREFETCH_BATCHES)
            self._batches = iter(batched.to_iter_dataset(options))
        batch = next(self._batches)
        self.position += self.global_batch
        return batch

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def set_state(self, state: dict[str, Any]) -> None:
        position = state.get("position") if isinstance(state, dict) else None
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"data state {state!r}: not a stream position")
        self.position, self._batches = position, None


def iterator(
    paths: Sequence[str | None],
    *,
    seed: int,
    global_batch: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Stream:
    """A fresh `Stream` of this process's batches over the shards `paths` (shard_paths': None where this process reads
    none of a shard)."""
    import grain

    if global_batch % process_count:
        raise ConfigError("--batch-size", f"{global_batch} does not split over {process_count} processes", "a multiple")
    mine = shards_read(len(paths), seed, process_index, process_count)
    sources: dict[int, Any] = {}
    orders: dict[int, Any] = {}
    for shard in mine:
        path = paths[shard]
        if path is None:
            raise ValueError(f"shard {shard} is read by process {process_index} of {process_count} but has no path")
        source = grain.sources.ArrayRecordDataSource([path])
        if len(source) == 0:
            raise ConfigError("--data", f"{Path(path).name} holds no records", "shards of at least one record each")
        sources[shard] = source
        orders[shard] = grain.MapDataset.range(len(source)).shuffle(seed=_shard_seed(seed, shard)).repeat()
    first = np.frombuffer(sources[mine[0]][0], np.uint8)
    if first.size < seq_len + 1:
        raise ConfigError(
            "--seq-len",
            f"{seq_len} needs records of {seq_len + 1} tokens; they hold {first.size}",
            f"at most {first.size - 1} for this dataset",
        )
    order, count = shard_order(len(paths), seed), len(paths)

    def read(position: int) -> tuple[int, npt.NDArray[np.int32]]:
        shard = order[position % count]
        record = sources[shard][orders[shard][position // count]]
        return position, np.frombuffer(record, np.uint8)[: seq_len + 1].astype(np.int32)

    examples = grain.MapDataset.range(ENDLESS).map(read)
    return Stream(examples, global_batch=global_batch, process_index=process_index, process_count=process_count)


def _shard_seed(seed: int, shard: int) -> int:
    """The seed of one shard's own shuffle: from the run's seed and the shard's place, 31 bits."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{shard}".encode()).digest()[:4], "big") >> 1


def _batch(examples: list[tuple[int, npt.NDArray[np.int32]]]) -> Batch:
    return Batch(np.array([p for p, _ in examples], np.int64), np.stack([t for _, t in examples]))


def global_span(batch: Batch, process_index: int, process_count: int) -> tuple[int, int]:
    """The stream positions [first, end) the global batch holding this process's `batch` covers: batch k of every
    process together is positions k*B .. (k+1)*B - 1 past the position it started from (B the global batch)."""
    size = batch.positions.size * process_count
    first = int(batch.positions[0]) - process_index
    return first, first + size
