"""Write a text corpus as ArrayRecord shards of tokenized sequences, the dataset `python -m trainer --data=...` reads.

    python -m trainer.prepare corpus.txt gs://BUCKET/datasets/corpus --seq-len=64 --shards=4

Byte-level tokens (the demo model's vocabulary of 256): the text's bytes cut into consecutive sequences of
seq_len + 1 tokens (the model's inputs and its next-token targets), the tail shorter than that dropped. Each record
is one sequence's bytes; the sequences are dealt to the shards in contiguous runs, `shard-00000-of-00004.array_record`
and so on, written with group_size 1 so that any record is read alone (Grain's global shuffle reads at random).
OUT is a local directory or a gs:// prefix (written locally, then uploaded). Prints one JSON line: what it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainer.dataset import SUFFIX


def write_shards(text: bytes, out_dir: Path, seq_len: int, shards: int) -> dict[str, int]:
    from array_record.python.array_record_module import ArrayRecordWriter

    length = seq_len + 1
    count = len(text) // length
    if count < shards:
        raise ValueError(f"{len(text)} bytes make {count} sequences of {length}, fewer than --shards={shards}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        first, end = shard * count // shards, (shard + 1) * count // shards
        writer = ArrayRecordWriter(str(out_dir / f"shard-{shard:05d}-of-{shards:05d}{SUFFIX}"), "group_size:1")
        for i in range(first, end):
            writer.write(text[i * length : (i + 1) * length])
        writer.close()
    return {"records": count, "shards": shards, "seq_len": seq_len, "bytes_used": count * length}


def prepare(text: bytes, out: str, seq_len: int, shards: int) -> dict[str, int | str]:
    if not out.startswith("gs://"):
        return {"out": out, **write_shards(text, Path(out), seq_len, shards)}
    import fsspec

    with tempfile.TemporaryDirectory(prefix="respawn-prepare-") as tmp:
        summary = write_shards(text, Path(tmp), seq_len, shards)
        fs, root = fsspec.core.url_to_fs(out)
        for path in sorted(Path(tmp).iterdir()):
            fs.put_file(str(path), f"{root.rstrip('/')}/{path.name}")
    return {"out": out, **summary}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("text", help="the corpus: a text file (any bytes), or - for stdin")
    parser.add_argument("out", help="a local directory or gs://BUCKET/PREFIX for the shards")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence less one (default 64, tiny's)")
    parser.add_argument("--shards", type=int, default=4, help="number of shards (default 4)")
    opts = parser.parse_args(argv)
    if not 2 <= opts.seq_len <= 8192:
        parser.error(f"--seq-len {opts.seq_len}: allowed 2..8192, as the trainer's")
    if opts.shards < 1:
        parser.error(f"--shards {opts.shards}: allowed an integer >= 1")
    text = sys.stdin.buffer.read() if opts.text == "-" else Path(opts.text).read_bytes()
    try:
        summary = prepare(text, opts.out, opts.seq_len, opts.shards)
    except ValueError as e:
        parser.error(str(e))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
