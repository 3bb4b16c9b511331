"""The Logging query evaluator, and the sink filter it evaluates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import respawn_ops
from respawn_ops.logfilter import FilterSyntaxError, LogFilter, load_sink_filter, sink_filter

SYSTEM_EVENT_LOG = "projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event"
ACTIVITY_LOG = "projects/p/logs/cloudaudit.googleapis.com%2Factivity"
TRAINER_LOG = "projects/p/logs/respawn-trainer"


def system_event(instance: str, method: str = "compute.instances.preempted", **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "logName": SYSTEM_EVENT_LOG,
        "resource": {"type": "gce_instance", "labels": {"zone": "us-central1-a", "project_id": "p"}},
        "protoPayload": {
            "methodName": method,
            "resourceName": f"projects/p/zones/us-central1-a/instances/{instance}",
        },
    }
    entry.update(overrides)
    return {k: v for k, v in entry.items() if v is not None}


def node_terminated(node: str, log: str = SYSTEM_EVENT_LOG) -> dict[str, Any]:
    return {
        "logName": log,
        "resource": {"type": "audited_resource", "labels": {"service": "tpu.googleapis.com", "project_id": "p"}},
        "protoPayload": {
            "serviceName": "tpu.googleapis.com",
            "methodName": "tpu.nodes.terminate",
            "resourceName": f"projects/p/locations/us-central2-b/nodes/{node}",
            "metadata": {"terminateReason": "PREEMPTED"},
        },
    }


def trainer(event: str, log: str = TRAINER_LOG) -> dict[str, Any]:
    return {"logName": log, "jsonPayload": {"event": event, "job_id": "llm", "attempt": 1, "step": 0}}


# --- the sink filter -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        system_event("llm-small-001-a1"),
        system_event("llm-small-001-a12", "compute.instances.hostError"),
        system_event("x-a3", "compute.instances.terminateOnHostMaintenance"),
        system_event("t1v-n-0a1b2c3d-w-0"),
        system_event("t1v-n-0a1b2c3d-w-15", "compute.instances.hostError"),
        system_event("t1v-n-0a1b2c3d-w-0", resource=None),  # a TPU worker's entry may have no resource block
        system_event("llm-a1", resource={"type": "tpu_worker"}),
        node_terminated("llm-small-001-a4"),
        node_terminated("llm-small-001-a4", ACTIVITY_LOG),
        trainer("started"),
        trainer("checkpoint"),
        trainer("progress"),
        trainer("completed"),
        trainer("failed"),
        trainer("stopped"),
    ],
)
def test_sink_filter_routes_respawn_events(entry: dict[str, Any]) -> None:
    assert sink_filter().matches(entry)


@pytest.mark.parametrize(
    "entry",
    [
        system_event("web-server-1"),  # not a respawn machine name
        system_event("llm-a0"),  # attempts start at 1
        system_event("llm-a1-backup"),
        system_event("t1v-n-0a1b2c3d-w-x"),
        system_event("llm-a1", "compute.instances.insert"),
        system_event("llm-a1", logName=ACTIVITY_LOG),
        system_event(
            "llm-a1",
            protoPayload={
                "methodName": "compute.instances.preempted",
                "resourceName": "projects/p/zones/us-central1-a/disks/llm-a1",
            },
        ),
        system_event(
            "llm-a1",
            protoPayload={
                "methodName": "compute.instances.preempted",
                "resourceName": "projects/p/global/instances/llm-a1",
            },
        ),
        node_terminated("my-notebook"),
        node_terminated("llm-a1", "projects/p/logs/cloudaudit.googleapis.com%2Fdata_access"),
        trainer("heartbeat"),
        trainer("started", log="projects/p/logs/other-app"),
        {"logName": TRAINER_LOG, "textPayload": "started"},
        {},
    ],
)
def test_sink_filter_drops_everything_else(entry: dict[str, Any]) -> None:
    assert not sink_filter().matches(entry)


def test_the_sink_filter_is_the_respawn_ops_package_file() -> None:
    path = Path(str(respawn_ops.__file__)).with_name("sink_filter.txt")
    assert load_sink_filter() == path.read_text(encoding="utf-8")
    assert "--" not in load_sink_filter()


# --- operators -------------------------------------------------------------------------------------------------------

ENTRY: dict[str, Any] = {
    "severity": "ERROR",
    "logName": "projects/p/logs/Respawn-Trainer",
    "jsonPayload": {"event": "Started", "step": 42, "ok": True, "tags": ["a", "B"], "nested": {"deep": "Needle"}},
    "entries": [{"name": "first"}, {"name": "second"}],
}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('jsonPayload.event="started"', True),  # = is case-insensitive
        ('jsonPayload.event="start"', False),  # ... and whole-value
        ("severity=ERROR", True),  # bare values
        ("jsonPayload.step=42", True),  # numbers compare as text
        ("jsonPayload.ok=true", True),
        ('jsonPayload.event!="stopped"', True),
        ('jsonPayload.missing!="x"', True),  # != is the negation of =
        ('jsonPayload.missing="x"', False),
        ('logName:"respawn-trainer"', True),  # : is a case-insensitive substring test
        ('jsonPayload:"needle"', True),  # ... on anything nested
        ('jsonPayload.missing:"x"', False),
        ('jsonPayload.event=~"^Sta"', True),  # =~ searches, case-sensitive
        ('jsonPayload.event=~"^sta"', False),
        ('jsonPayload.event=~"(?i)^sta"', True),
        ('jsonPayload.event!~"^sta"', True),
        ('jsonPayload.tags="b"', True),  # repeated fields: any element
        ('entries.name="second"', True),
        ('jsonPayload.event=("x" OR "started")', True),  # value lists
        ('jsonPayload.event=("x" OR "y")', False),
        ('jsonPayload.event="say \\"hi\\""', False),  # escapes
        ("jsonPayload.nested=Needle", False),  # = never matches an object
    ],
)
def test_operators(query: str, expected: bool) -> None:
    assert LogFilter.parse(query).matches(ENTRY) is expected


def test_escaped_quotes_and_backslashes() -> None:
    entry = {"a": 'say "hi"', "b": "C:\\dir"}
    assert LogFilter.parse('a="say \\"hi\\""').matches(entry)
    assert LogFilter.parse('b="C:\\\\dir"').matches(entry)


# --- boolean structure: precedence as in Cloud Logging (NOT, then OR, then AND) ---


def truth(**values: bool) -> dict[str, str]:
    return {name: "1" if value else "0" for name, value in values.items()}


@pytest.mark.parametrize(
    ("query", "entry", "expected"),
    [
        ("a=1 OR b=1 AND c=1", truth(a=True, b=False, c=False), False),  # (a OR b) AND c
        ("a=1 OR b=1 AND c=1", truth(a=False, b=True, c=True), True),
        ("a=1 AND b=1 OR c=1", truth(a=True, b=False, c=True), True),  # a AND (b OR c)
        ("a=1 AND b=1 OR c=1", truth(a=False, b=True, c=True), False),
        ("NOT a=1 OR b=1", truth(a=True, b=True), True),  # (NOT a) OR b
        ("NOT a=1 OR b=1", truth(a=True, b=False), False),
        ("NOT (a=1 OR b=1)", truth(a=False, b=True), False),
        ("a=1 b=1", truth(a=True, b=False), False),  # juxtaposition is AND
        ("a=1\n  b=1", truth(a=True, b=True), True),
        ("(a=1 OR b=1) (c=1)", truth(a=False, b=True, c=True), True),
        ("NOT NOT a=1", truth(a=True), True),
        ("a=-1", {"a": "-1"}, True),
    ],
)
def test_boolean_structure(query: str, entry: dict[str, str], expected: bool) -> None:
    assert LogFilter.parse(query).matches(entry) is expected


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "fragment", "column"),
    [
        ("", "the filter is empty", 1),
        ("a=1 -- note", "comments ('--') are not supported", 5),
        ("-a=1", "'-' negation shorthand is not supported; use NOT", 1),
        ("a>1", "operator '>' is not supported; supported: = != : =~ !~", 2),
        ("a<=1", "operator '<=' is not supported", 2),
        ('"cat"', "global restrictions", 1),
        ('log_id("x")', "functions such as log_id() are not supported", 1),
        ('a=("x" AND "y")', "only OR is supported inside a value list", 8),
        ('a=~"("', "invalid regular expression", 4),
        ("(a=1", "this '(' is never closed", 1),
        ("a=(1 OR 2", "this value list is never closed", 3),
        ("a=1 and b=2", "in capitals", 5),
        ('a="x', "unterminated quoted string", 3),
        ("a..b=1", "empty segment", 1),
        ("a=1 AND", "expected a comparison FIELD OP VALUE, found the end of the filter", 8),
        ("a=1)", "unexpected ')'", 4),
        ("a b=1", "expected an operator after 'a'", 3),
        ("a=", "expected a value, found the end of the filter", 3),
        ("a!1", "unexpected character '!'", 2),
    ],
)
def test_unsupported_or_malformed_syntax_is_one_clear_error(query: str, fragment: str, column: int) -> None:
    with pytest.raises(FilterSyntaxError) as raised:
        LogFilter.parse(query)
    assert fragment in str(raised.value)
    assert str(raised.value).startswith(f"log filter, line 1 column {column}: ")


def test_errors_name_the_line() -> None:
    with pytest.raises(FilterSyntaxError, match=r"line 3 column 2: operator '>='"):
        LogFilter.parse("a=1\nAND b=2\nc>=3")
