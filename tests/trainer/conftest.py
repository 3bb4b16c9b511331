"""Trainer fixtures: one compilation cache and one uninterrupted reference run per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_harness import Reference, last, run_to_end, trainer_env


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jax-cache")


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Reference:
    """Hash H of an uninterrupted run of the shared configuration."""
    root = tmp_path_factory.mktemp("reference")
    sink = root / "entries.jsonl"
    code, run = run_to_end(trainer_env(str(root / "ckpt"), sink, compile_cache))
    assert code == 0, run.tail()
    completed = last(sink, "completed")
    return Reference(completed["params_sha256"], completed["final_loss"], root / "ckpt")
