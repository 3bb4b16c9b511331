"""Adapters: the real implementations of the ports (GCS, Cloud TPU, Compute Engine)."""
