"""--data: ArrayRecord shards on fake-gcs-server, read through the Grain pipeline, resumed exactly.

The shards hold the generated corpus (nothing can be downloaded), written by `python -m trainer.prepare`. Each
attempt's final entry says which positions of the shuffled stream it trained (`examples`: from, to); across the
attempts of a preempted run they must tile [0, steps x batch) with no gap and no overlap, and the final hash must
be the uninterrupted run's. The stream is the same on any process count, so a checkpoint of 2 processes resumes on 1;
each process copies only the shards it reads. The same on a 4-host slice, each process reading its part of every
global batch, runs end to end through the control plane in tests/integration/test_local_dataset_run.py, and a job
whose fallback tier has another host count in tests/integration/test_local_tiers.py.
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
    start_slice,
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
    assert "invalid --seq-len: 32 needs records of 33 tokens" in last(sink, "failed")["error"]


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


def test_the_stream_is_the_same_on_any_process_count_and_each_process_reads_its_shards_only(tmp_path: Path) -> None:
    """8 shards: 1, 2 and 4 processes read the same global batches (the stream does not depend on the process count),
    each process opening only its shards (an eighth, a quarter, a half); 3 processes (no common factor with 8) read
    every shard. A stream restored from a position goes on from there on any process count."""
    from trainer import dataset

    assert prepare(data.corpus()[:40_000].tobytes(), str(tmp_path / "s"), "--seq-len=32", "--shards=8").returncode == 0
    for n, each in ((1, 8), (2, 4), (4, 2), (8, 1), (3, 8)):
        read = [dataset.shards_read(8, 3, p, n) for p in range(n)]
        assert {len(r) for r in read} == {each} and sorted({s for r in read for s in r}) == list(range(8)), (n, read)
        if each * n == 8:  # a partition
            assert sorted(s for r in read for s in r) == list(range(8))

    def streams(n: int, start: int = 0) -> list[dataset.Stream]:
        found = []
        for p in range(n):
            paths = dataset.shard_paths(str(tmp_path / "s"), "", seed=3, process_index=p, process_count=n)
            assert sum(path is not None for path in paths) == len(dataset.shards_read(8, 3, p, n))
            it = dataset.iterator(paths, seed=3, global_batch=8, seq_len=32, process_index=p, process_count=n)
            it.set_state({"position": start})
            found.append(it)
        return found

    def global_batches(parts: list[dataset.Stream], count: int) -> list[dict[int, bytes]]:
        out = []
        for _ in range(count):
            local = [next(it) for it in parts]
            out.append({int(p): t.tobytes() for b in local for p, t in zip(b.positions, b.tokens, strict=True)})
        return out

    one = global_batches(streams(1), 6)
    assert [sorted(b) for b in one] == [list(range(8 * k, 8 * k + 8)) for k in range(6)]
    assert len({t for b in one for t in b.values()}) == 48  # 48 different sequences
    assert global_batches(streams(2), 6) == one == global_batches(streams(4), 6)
    restored = streams(4, start=24)  # a checkpoint of step 3 of 1 process, restored on 4
    assert global_batches(restored, 3) == one[3:]
    assert restored[0].get_state() == {"position": 48}


@pytest.mark.emulator
def test_each_process_copies_only_the_shards_it_reads(fake_gcs: FakeGcs, shards: str, tmp_path: Path) -> None:
    """3 shards on gs://: a process of a 3-host slice copies one (a third of the bytes), and a later attempt on the
    same machine (the same cache) copies nothing."""
    from trainer import dataset

    def cached() -> int:
        return sum(p.stat().st_size for p in (tmp_path / "cache").rglob(f"*{dataset.SUFFIX}"))

    everything = dataset.shard_paths(shards, str(tmp_path / "all"))
    total = sum(Path(p).stat().st_size for p in everything if p)
    for p in range(3):
        paths = dataset.shard_paths(shards, str(tmp_path / "cache"), seed=7, process_index=p, process_count=3)
        assert [i for i, path in enumerate(paths) if path] == dataset.shards_read(3, 7, p, 3) and len(paths) == 3
    assert cached() == total and len(list((tmp_path / "cache").rglob(f"*{dataset.SUFFIX}"))) == 3  # one each
    mine = dataset.shard_paths(shards, str(tmp_path / "one"), seed=7, process_index=1, process_count=3)
    held = sum(Path(p).stat().st_size for p in mine if p)
    assert held < total / 2, (held, total)
    again = tmp_path / "one"
    before = {p: p.stat().st_mtime_ns for p in again.rglob("*")}
    dataset.shard_paths(shards, str(again), seed=7, process_index=1, process_count=3)  # the next attempt
    assert {p: p.stat().st_mtime_ns for p in again.rglob("*")} == before


@pytest.mark.slow
def test_a_checkpoint_of_2_processes_resumes_on_1_each_example_once(tmp_path: Path, compile_cache: Path) -> None:
    """A fallback tier of another host count: 2 processes (a 2-host slice) stop on the notice; 1 process restores
    their checkpoint, data position included, and trains on from the next example: every example once."""
    done = prepare(data.corpus()[:60_000].tobytes(), str(tmp_path / "s"), f"--seq-len={SEQ_LEN}", "--shards=4")
    assert done.returncode == 0, done.stderr
    args = [*ARGS, f"--data={tmp_path / 's'}"]
    sink = tmp_path / "entries.jsonl"
    env = trainer_env(str(tmp_path / "ckpt"), sink, compile_cache)
    two = start_slice(env, 2, 1, args)
    assert two.wait_step(15) >= 15, two.tail()
    two.signal(signal.SIGTERM)
    assert two.finish() == [0, 0], two.tail()
    stopped = last(sink, "stopped")["step"]
    saved = sorted(p.name for p in (tmp_path / "ckpt" / str(stopped) / "data").iterdir())
    assert [n for n in saved if n.endswith(".json")] == ["global.json"], saved  # one state, not one per process

    code, run = run_to_end(env, args)
    assert code == 0, run.tail()
    assert last(sink, "started")["restored_step"] == stopped
    assert last(sink, "completed")["step"] == STEPS
    assert_each_example_once(sink, STEPS)


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
    assert f"runs/{tmp_path.name}/{stopped}/data/global.json" in names  # in the step, beside the state

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
