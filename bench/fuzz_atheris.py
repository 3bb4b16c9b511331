"""Coverage-guided fuzzing of the two parsers with atheris (libFuzzer): a command, not part of the test suite.

    .venv/bin/python bench/fuzz_atheris.py job -runs=200000          # parse_job_message on raw bytes
    .venv/bin/python bench/fuzz_atheris.py log -max_total_time=300   # LogEntries / events-topic messages

`job`: the bytes go to parse_job_message; it must return a JobSpec or a CancelRequest or raise a SpecError
whose text is one printable ASCII line; anything else is a crash. `log`: the bytes go through events_event (the
events topic's parser, which reads them as JSON) and, when they hold a JSON object, through log_entry_event;
both must return an event and never raise. The corpus lives in .respawn/fuzz/TARGET (seeded from the captured
messages and LogEntries in tests/data, grown by every run); further arguments are libFuzzer's (-runs,
-max_total_time, -max_len, another corpus directory, ...). A crash stops the run with the input saved as
crash-* in the current directory and a non-zero exit.
Needs `atheris` (Linux x86-64 wheels: `.venv/bin/pip install atheris==3.0.0`).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from respawn.events import Event, Ignored
    from respawn.jobs import JobSpec
    from respawn.parsing import PubSubMessage, event_to_json, events_event, log_entry_event
    from respawn.spec import CancelRequest, SpecError, parse_job_message

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
EVENT_TYPES = tuple(t for t in Event.__args__)  # type: ignore[attr-defined]


def fuzz_job(data: bytes) -> None:
    try:
        parsed = parse_job_message(data)
    except SpecError as e:
        text = str(e)
        if not (text.isascii() and text.isprintable()):
            raise AssertionError(f"SpecError is not one printable line: {text!r}") from e
        return
    if not isinstance(parsed, (JobSpec, CancelRequest)):
        raise AssertionError(f"parse_job_message returned {parsed!r}")


def fuzz_log(data: bytes) -> None:
    events = [events_event(PubSubMessage(data))]
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        events.append(log_entry_event(obj))
    for event in events:
        if not isinstance(event, EVENT_TYPES):
            raise AssertionError(f"not an event: {event!r}")
        if isinstance(event, Ignored) and not event.reason.isprintable():
            raise AssertionError(f"reason is not one line: {event.reason!r}")
        json.dumps(event_to_json(event), default=str)


def corpus(target: str) -> Path:
    """The target's corpus directory, with the seed inputs from tests/data."""
    out = ROOT / ".respawn" / "fuzz" / target
    out.mkdir(parents=True, exist_ok=True)
    if target == "job":
        push = json.loads((DATA / "pubsub_push_job.json").read_text())
        texts = [base64.b64decode(push["message"]["data"]), (DATA / "job_gpu.json").read_bytes()]
        texts.append(b'{"action": "cancel", "job_id": "llm-small-001"}')
    else:
        texts = [p.read_bytes() for p in sorted(DATA.glob("logentry_*.json"))]
        texts.append(b'{"kind": "sweep_tick"}')
    for i, text in enumerate(texts):
        (out / f"seed-{i}").write_bytes(text)
    return out


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("job", "log"):
        sys.exit(__doc__)
    target, options = sys.argv[1], sys.argv[2:]
    if not any(not o.startswith("-") for o in options):
        options.append(str(corpus(target)))
    atheris.Setup([sys.argv[0], *options], fuzz_job if target == "job" else fuzz_log)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
