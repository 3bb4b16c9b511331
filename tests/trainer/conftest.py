"""Trainer fixtures: one compilation cache and one uninterrupted reference run per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from trainer_harness import Reference, last, run_to_end, trainer_env


@pytest.fixture(scope="session")
def compile_cache(shared_reference_cache: Path) -> Path:
    """The session's compilation cache, which all xdist workers share with the local runs (tests/conftest.py): a
    program is compiled once, by whichever worker runs first a test that needs it."""
    return Path(os.environ["RESPAWN_LOCAL_COMPILE_CACHE"])


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Reference:
    """Hash H of an uninterrupted run of the shared configuration."""
    root = tmp_path_factory.mktemp("reference")
    sink = root / "entries.jsonl"
    code, run = run_to_end(trainer_env(str(root / "ckpt"), sink, compile_cache))
    assert code == 0, run.tail()
    completed = last(sink, "completed")
    return Reference(completed["params_sha256"], completed["final_loss"], root / "ckpt")
