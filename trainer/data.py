"""The corpus and the batches: a batch is a pure function of (seed, step), so a restart loses no iterator state.

The corpus is generated (a fixed seed, a small grammar of sentences and sums) so the image needs no
data download and the loss has structure to learn. Byte-level tokens (vocabulary 256).
Batch offsets come from splitmix64, which is the same on every numpy version and platform.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import numpy.typing as npt

VOCAB = 256
CORPUS_SEED = 20240917
CORPUS_BYTES = 1 << 20

_SUBJECTS = ["the cat", "a dog", "the old sailor", "my sister", "the robot", "a small bird", "the teacher", "our team"]
_VERBS = ["sees", "likes", "builds", "finds", "paints", "follows", "reads", "carries"]
_OBJECTS = ["a red ball", "the river", "an old map", "the green door", "a long letter", "the tall tower", "a song"]
_PLACES = ["at dawn", "in the park", "near the sea", "after lunch", "on monday", "under the bridge", "in winter"]


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.3:
        a, b = rng.randrange(100), rng.randrange(100)
        return f"{a} plus {b} is {a + b}."
    parts = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.5:
        parts.append(rng.choice(_PLACES))
    return " ".join(parts) + "."


@functools.cache
def corpus() -> npt.NDArray[np.uint8]:
    """CORPUS_BYTES bytes of text (uint8), identical on every run."""
    rng = random.Random(CORPUS_SEED)
    chunks: list[str] = []
    size = 0
    while size < CORPUS_BYTES:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(3, 8))) + "\n"
        chunks.append(line)
        size += len(line)
    return np.frombuffer("".join(chunks).encode()[:CORPUS_BYTES], dtype=np.uint8)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def batch(seed: int, step: int, batch_size: int, seq_len: int) -> npt.NDArray[np.int32]:
    """Tokens [batch_size, seq_len + 1] (int32) for `step`: inputs are [:, :-1], targets [:, 1:]."""
    text = corpus()
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.array([seed], dtype=np.uint64)) ^ np.uint64(step))
        mixed = _splitmix64(np.arange(batch_size, dtype=np.uint64) + key)
    starts = (mixed % np.uint64(len(text) - seq_len - 1)).astype(np.int64)
    tokens: npt.NDArray[np.int32] = text[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)
    return tokens
