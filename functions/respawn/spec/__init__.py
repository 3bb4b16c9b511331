"""The job message (SPEC 3.1): strict validation into a JobSpec or a CancelRequest, and back.

Every error is a SpecError whose str() is one line naming the field, what was wrong and what is allowed. Values are
quoted JSON-style (so a hostile value can never break the line) and cut short; env values are never echoed.

  values.py    one field's value: limits, patterns, SpecError, a parser per kind of value
  fields.py    the table of fields: Field, Shape, reading an object and rendering it back
  rules.py     the job's rules: the message's objects and what holds across fields; parse_job_message
  decoding.py  bytes into a JSON object (size, UTF-8, duplicates)

Each module imports only the ones above it in this list (decoding only values), and of the rest of respawn only
`model` and `topology`.
"""

from respawn.spec.rules import (
    CANCEL,
    GPU_MACHINE,
    MOVE_ON,
    SUBMIT,
    TIER,
    TPU_MACHINE,
    CancelRequest,
    default_api,
    parse_job_message,
    spec_to_message,
)
from respawn.spec.values import JOB_ID_RE, MAX_MESSAGE_BYTES, ZONE_RE, SpecError, format_ttl, one_line, parse_ttl, show

__all__ = [
    "CANCEL",
    "GPU_MACHINE",
    "JOB_ID_RE",
    "MAX_MESSAGE_BYTES",
    "MOVE_ON",
    "SUBMIT",
    "TIER",
    "TPU_MACHINE",
    "ZONE_RE",
    "CancelRequest",
    "SpecError",
    "default_api",
    "format_ttl",
    "one_line",
    "parse_job_message",
    "parse_ttl",
    "show",
    "spec_to_message",
]
