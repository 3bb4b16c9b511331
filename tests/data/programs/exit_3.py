"""A user's program that fails the same way on every machine: it says why on stderr and exits 3."""

import sys

print("starting", flush=True)
print("no training data at /data/train.bin", file=sys.stderr)
sys.exit(3)
