"""--data: ArrayRecord shards on fake-gcs-server, read through the Grain pipeline, resumed exactly.

The shards hold the generated corpus (nothing can be downloaded), written by `python -m trainer.prepare`. Each
attempt's final entry says which positions of the shuffled stream it trained (`examples`: from, to); across the
attempts of a preempted run they must tile [0, steps x batch) with no gap and no overlap, and the final hash must
be the uninterrupted run's. The same on a 4-host slice, each process reading its part of every global batch, runs
end to end through the control plane in tests/integration/test_local_dataset_run.py.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from trainer_harness import (
    REPO,
    assert_no_step_redone_after_stops,
    entries,
    last,
    run_to_end,
    start,
    trainer_env,
)

from localcloud.services.emulators import FakeGcs
from trainer import data

STEPS, BATCH, SEQ_LEN = 60, 8, 32
ARGS = ["--model=nano", f"--steps={STEPS}", "--seed=7", "--checkpoint-every=10", "--log-every=1"]


def prepare(text: bytes, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.prepare", "-", out, *extra],
        cwd=REPO,
        input=text.decode("latin-1"),
        encoding="latin-1",
        capture_output=True,
        check=False,
    )


@pytest.fixture(scope="module")
def shards(fake_gcs: FakeGcs) -> str:
    """gs://…/corpus: 200 kB of the generated corpus as 3 shards of 33-token sequences (6060 records)."""
    fake_gcs.create_bucket("data-test")
    done = prepare(data.corpus()[:200_000].tobytes(), "gs://data-test/corpus", f"--seq-len={SEQ_LEN}", "--shards=3")
    assert done.returncode == 0, done.stderr
    return "gs://data-test/corpus"


def spans(sink: Path) -> list[tuple[int, int]]:
    """The stream positions each attempt trained, from its `stopped` or `completed` entry."""
    found = [e["examples"] for e in entries(sink) if e["event"] in ("stopped", "completed") and e.get("examples")]
    return [(s["from"], s["to"]) for s in found]


def assert_each_example_once(sink: Path, steps: int) -> None:
    """The attempts' spans, in order, tile [0, steps x BATCH): every example trained once, none skipped."""
    got = spans(sink)
    assert len(got) >= 2, got
    assert got[0][0] == 0 and got[-1][1] == steps * BATCH, got
    assert all(a[1] == b[0] for a, b in itertools.pairwise(got)), f"a gap or an overlap: {got}"


def test_prepare_writes_the_text_as_sequences_in_order(tmp_path: Path) -> None:
    import grain

    text = data.corpus()[:10_000].tobytes()
    done = prepare(text, str(tmp_path / "shards"), "--seq-len=15", "--shards=4")
    assert done.returncode == 0, done.stderr
    paths = sorted(str(p) for p in (tmp_path / "shards").iterdir())
    assert next(Path(p).name for p in paths) == "shard-00000-of-00004.array_record" and len(paths) == 4
    records = list(grain.sources.ArrayRecordDataSource(paths))
    assert len(records) == 10_000 // 16 and all(len(r) == 16 for r in records)
    assert b"".join(records) == text[: len(records) * 16]

    short = prepare(b"x" * 40, str(tmp_path / "short"), "--seq-len=15", "--shards=4")
    assert short.returncode == 2 and "fewer than --shards=4" in short.stderr


def test_a_dataset_that_does_not_fit_is_a_config_error(tmp_path: Path, compile_cache: Path) -> None:
    """Exit 2 and one line naming the flag: no shards there; records shorter than --seq-len needs."""
    sink = tmp_path / "entries.jsonl"
    env = trainer_env(str(tmp_path / "ckpt"), sink, compile_cache)
    code, run = run_to_end(env, [*ARGS, f"--data={tmp_path / 'nothing'}"])
    assert code == 2 and "--data: no *.array_record files in" in run.tail(), run.tail()
    assert prepare(data.corpus()[:5000].tobytes(), str(tmp_path / "s"), "--seq-len=8").returncode == 0
    code, run = run_to_end(env, [*ARGS, f"--data={tmp_path / 's'}"])
    assert code == 2 and "--seq-len: 32 needs records of 33 tokens; they hold 9" in run.tail(), run.tail()
    assert last(sink, "failed")["error"].startswith("ConfigError: invalid --seq-len")


def test_the_pipeline_resumes_from_its_state_and_shards_the_stream_over_processes(tmp_path: Path) -> None:
    """One process's stream from a restored state goes on where the saved one stopped; 4 processes' batches
    together are the single process's global batches, each example in exactly one of them."""
    from trainer import dataset

    assert prepare(data.corpus()[:20_000].tobytes(), str(tmp_path / "s"), "--seq-len=32").returncode == 0
    paths = dataset.shard_paths(str(tmp_path / "s"), str(tmp_path / "cache"))
    one = dataset.iterator(paths, seed=3, global_batch=8, seq_len=32)
    whole = [next(one) for _ in range(5)]
    state = one.get_state()
    after = next(one)
    resumed = dataset.iterator(paths, seed=3, global_batch=8, seq_len=32)
    resumed.set_state(state)
    again = next(resumed)
    assert (again.positions == after.positions).all() and (again.tokens == after.tokens).all()

    parts = [
        dataset.iterator(paths, seed=3, global_batch=8, seq_len=32, process_index=p, process_count=4) for p in range(4)
    ]
    for k, batch in enumerate(whole):
        local = [next(it) for it in parts]
        assert {dataset.global_span(b, p, 4) for p, b in enumerate(local)} == {(8 * k, 8 * k + 8)}
        assert sorted(np.concatenate([b.positions for b in local])) == sorted(batch.positions)
    assert len({tuple(t) for b in whole for t in b.tokens}) == 40  # shuffled: 40 different sequences


@pytest.mark.emulator
@pytest.mark.slow
def test_preempted_twice_on_gcs_shards_ends_exact_and_trains_each_example_once(
    fake_gcs: FakeGcs, shards: str, tmp_path: Path, compile_cache: Path
) -> None:
    args = [*ARGS, f"--data={shards}", f"--data-cache={tmp_path / 'data'}"]
    ref_sink = tmp_path / "reference.jsonl"
    code, run = run_to_end(trainer_env(str(tmp_path / "ref"), ref_sink, compile_cache), args)
    assert code == 0, run.tail()
    reference = last(ref_sink, "completed")
    assert reference["examples"] == {"from": 0, "to": STEPS * BATCH}
    assert reference["goodput"]["input_s"] < reference["goodput"]["productive_s"]

    sink = tmp_path / "entries.jsonl"
    env = trainer_env(f"gs://data-test/runs/{tmp_path.name}", sink, compile_cache)
    for target in (17, 41):
        run = start(env, args)
        run.wait_step(target)
        run.signal(signal.SIGTERM)
        assert run.finish() == 0, run.tail()
    stopped = last(sink, "stopped")["step"]
    client = storage.Client(project="local", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    names = {b.name for b in client.list_blobs("data-test", prefix=f"runs/{tmp_path.name}/{stopped}/")}
    assert f"runs/{tmp_path.name}/{stopped}/data/process_0-of-1.json" in names  # in the step, beside the state

    code, run = run_to_end(env, args)
    assert code == 0, run.tail()
    assert last(sink, "completed")["params_sha256"] == reference["params_sha256"]
    assert_no_step_redone_after_stops(sink)
    assert_each_example_once(sink, STEPS)


def test_a_users_grain_loop_resumes_exactly_through_a_preemption(tmp_path: Path, compile_cache: Path) -> None:
    """examples/byo/train_grain.py: SIGTERM after step 100; the restart restores the iterator with the state and
    ends with the uninterrupted run's hash (the iterator restarted from its first batch would not)."""
    script = [sys.executable, "examples/byo/train_grain.py", "--steps", "300"]

    def launch(name: str) -> subprocess.Popen[str]:
        env = trainer_env(str(tmp_path / name), tmp_path / f"{name}.jsonl", compile_cache)
        return subprocess.Popen(script, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    reference = launch("reference")
    assert reference.wait(timeout=300) == 0, reference.stderr.read() if reference.stderr else ""
    expected = last(tmp_path / "reference.jsonl", "completed")["params_sha256"]

    first = launch("run")
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("step 100 "):
            first.send_signal(signal.SIGTERM)
            break
    assert first.wait(timeout=60) == 0
    sink = tmp_path / "run.jsonl"
    stopped = last(sink, "stopped")
    assert 100 <= stopped["step"] < 300 and (tmp_path / "run" / str(stopped["step"]) / "data").is_dir()
    again = launch("run")
    assert again.wait(timeout=300) == 0, again.stderr.read() if again.stderr else ""
    assert last(sink, "started")["restored_step"] == stopped["step"]
    assert last(sink, "completed")["params_sha256"] == expected
