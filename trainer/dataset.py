"""A user's dataset: ArrayRecord shards of tokenized sequences (`--data`), read through a Grain pipeline.

Each record is one sequence of byte-level tokens (uint8, at least seq_len + 1 of them; `python -m trainer.prepare`
writes them). The pipeline: every shard's records as one random-access source, a global shuffle by --seed
(reshuffled each epoch), repeated without end, each element tagged with its position in that stream, every
process taking its own slice (positions p, p + n, p + 2n, ... of n processes), batched per process, read ahead
by Grain's threads. Its iterator's state is a position, saved and restored with the train state (Run.restore's
`data=`), so a resumed run reads on from the example after the last one trained.

Shards on gs:// are copied to a local directory first (read in place when the path is local, a Cloud Storage FUSE
mount included): trainer/README.md, "Real data", says why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
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


@dataclass(frozen=True)
class Batch:
    positions: npt.NDArray[np.int64]  # [b]: each example's position in the shuffled stream (its identity)
    tokens: npt.NDArray[np.int32]  # [b, seq_len + 1]


def shard_paths(uri: str, cache: str) -> list[str]:
    """The shards' local paths, sorted by name: copied from gs:// into `cache` (a copy of the same size is kept,
    shards being immutable), or found in place under a local directory."""
    if not uri.startswith("gs://"):
        found = sorted(str(p) for p in Path(uri).glob(f"*{SUFFIX}"))
        if not found:
            raise ConfigError("--data", f"no *{SUFFIX} files in {uri}", SHARDS_ALLOWED)
        return found
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    remote = sorted(p for p in fs.find(root, detail=True).items() if p[0].endswith(SUFFIX))
    if not remote:
        raise ConfigError("--data", f"no *{SUFFIX} objects under {uri}", SHARDS_ALLOWED)
    local = Path(os.path.expanduser(cache)) / hashlib.sha256(uri.encode()).hexdigest()[:16]
    local.mkdir(parents=True, exist_ok=True)
    began, copied = time.monotonic(), 0
    paths = []
    for name, info in remote:
        path = local / name.rsplit("/", 1)[-1]
        if not path.exists() or path.stat().st_size != int(info["size"]):
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            fs.get_file(name, str(tmp))
            tmp.replace(path)  # atomic: every process of a slice on one machine may be copying the same shard
            copied += int(info["size"])
        paths.append(str(path))
    log.info(
        "data: %d shards of %s in %s (%.1f MB copied in %.2fs)",
        len(paths),
        uri,
        local,
        copied / 1e6,
        time.monotonic() - began,
    )
    return paths


def iterator(
    paths: list[str], *, seed: int, global_batch: int, seq_len: int, process_index: int = 0, process_count: int = 1
) -> Any:
    """A Grain DatasetIterator of this process's `Batch`es (global_batch / process_count examples each), fresh."""
    import grain

    source = grain.sources.ArrayRecordDataSource(paths)
    if len(source) < global_batch:
        raise ConfigError("--data", f"{len(source)} records, fewer than one batch ({global_batch})", "more records")
    first = np.frombuffer(source[0], np.uint8)
    if first.size < seq_len + 1:
        raise ConfigError(
            "--seq-len",
            f"{seq_len} needs records of {seq_len + 1} tokens; they hold {first.size}",
            f"at most {first.size - 1} for this dataset",
        )
    per_process = global_batch // process_count

    def decode(position: int, record: bytes) -> tuple[int, npt.NDArray[np.int32]]:
        return position, np.frombuffer(record, np.uint8)[: seq_len + 1].astype(np.int32)

    stream = grain.MapDataset.source(source).shuffle(seed=seed).repeat().map_with_index(decode)
    mine = stream[process_index::process_count].batch(per_process, batch_fn=_batch)
    options = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=PREFETCH_BATCHES)
    return iter(mine.to_iter_dataset(options))


def _batch(examples: list[tuple[int, npt.NDArray[np.int32]]]) -> Batch:
    return Batch(np.array([p for p, _ in examples], np.int64), np.stack([t for _, t in examples]))


def global_span(batch: Batch, process_index: int, process_count: int) -> tuple[int, int]:
    """The stream positions [first, end) the global batch holding this process's `batch` covers: batch k of every
    process together is positions k*B .. (k+1)*B - 1 (B the global batch)."""
    size = batch.positions.size * process_count
    first = int(batch.positions[0]) - process_index
    return first, first + size
